"""Tables (markdown, printed and written into ``docs/benchmarks.md`` between markers of
each workload's own) and PNG plots (``docs/img/``) of a workload's results: medians over
the runs, speed-ups of Parrot over the baseline, engine token counters per side."""

from __future__ import annotations

import importlib.util
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import astuple
from pathlib import Path

from benchmarks._report import DOC, machine, write_section
from benchmarks.apps.runner import Sample, Work
from benchmarks.apps.suite import Options, Results
from benchmarks.apps.workload import Metric
from benchmarks.spread import Spread

IMAGES = DOC.parent / "img"
SIDE_NAMES = {"baseline": "baseline", "least-busy": "least-busy", "parrot": "Parrot", "front": "OpenAI front"}


def spread_of(samples: Sequence[Sample], key: str) -> Spread:
    return Spread(s.metrics[key] for s in samples if key in s.metrics)


def median_of(samples: Sequence[Sample], key: str) -> float:
    return spread_of(samples, key).median


def compared(metric: Metric, base: Spread, ours: Spread) -> str:
    """Parrot's speed-up over the baseline (medians), and a mark where the two sides'
    ranges overlap over several runs: there the ratio is within the noise."""
    ratio = f"{metric.speedup(base.median, ours.median):.2f}x"
    if len(base.values) > 1 and len(ours.values) > 1 and base.overlaps(ours):
        return ratio + " (overlap)"
    return ratio


def median_work(samples: Sequence[Sample]) -> Work:
    """Each counter's median over the runs (counts rounded)."""
    columns = list(zip(*(astuple(s.work) for s in samples), strict=True))
    medians = [statistics.median(values) for values in columns]
    return Work(*(round(m) if isinstance(c[0], int) else m for m, c in zip(medians, columns, strict=True)))


def steps_of(work: Work) -> str:
    """Its steps, ``fill`` of them prompts only and ``graph`` replayed as CUDA graphs (the
    rest eager), and the wall ms a step took on average."""
    return f"{work.steps} ({work.fill_steps} fill, {work.graph_steps} graph; {work.ms_per_step:.1f} ms)"


CPU_ORDER = ("engine", "ServeCore", "client")


def median_cpu(samples: Sequence[Sample]) -> str:
    """Median CPU seconds of a side's runs, ``engine+ServeCore+client``."""
    keys = [k for k in CPU_ORDER if all(k in s.cpu for s in samples)]
    return "+".join(f"{statistics.median(s.cpu[k] for s in samples):.1f}" for k in keys)


def group(samples: Sequence[Sample]) -> dict[tuple[str, int], dict[str, list[Sample]]]:
    """Samples by (configuration, round trip), then by side, in the order measured."""
    found: dict[tuple[str, int], dict[str, list[Sample]]] = {}
    for s in samples:
        found.setdefault((s.config, s.rtt_ms), {}).setdefault(s.side, []).append(s)
    return found


def _value(metric: Metric, value: Spread) -> str:
    """``median (min-max)`` over the runs, scaled as the metric says."""
    return value.show(".2f" if value.median * metric.scale < 100 else ".0f", metric.scale)


def _settings(results: Results, samples: Sequence[Sample]) -> str:
    o = results.options
    engines = "; ".join(f"{n} engine(s): {what}" for n, what in sorted(results.setups.items()))
    loads = [s.load for s in samples] or [float("nan")]
    return (
        f"Machine: {machine()}; load average (1 min) after the runs {min(loads):.1f} to "
        f"{max(loads):.1f}. {engines}; ServeCore `parrot serve` with its defaults. Greedy, "
        f"`ignore_eos`, fixed output lengths; simulated round trip before every request on both "
        f"sides; median of {o.runs} run(s), sides interleaved; fresh text every run. Size: {o.size}."
    )


def main_table(results: Results) -> str:
    """Baseline, Parrot (and front) for every metric, with speed-ups; token counters."""
    w = results.workload
    sides = [s for s in SIDE_NAMES if any(x.side == s for x in results.main)]
    others = [s for s in sides if s != "baseline"]
    head = ["configuration", "RTT ms"]
    for m in w.metrics:
        head += [f"baseline {m.label}"]
        for side in others:
            head += [f"{SIDE_NAMES[side]} {m.label}", f"{SIDE_NAMES[side]} speed-up"]
        if "least-busy" in others:
            head.append("Parrot over least-busy")
    cpu = "+".join(k for k in CPU_ORDER if all(k in x.cpu for x in results.main))
    head += ["tokens generated", "tokens computed", "engine steps (fill, graph; ms a step)", f"CPU s {cpu}"]
    rows = []
    for (config, rtt), by_side in group(results.main).items():
        row = [config, str(rtt)]
        for m in w.metrics:
            base = spread_of(by_side.get("baseline", []), m.key)
            row.append(_value(m, base))
            for side in others:
                value = spread_of(by_side.get(side, []), m.key)
                row += [_value(m, value), compared(m, base, value)]
            if "least-busy" in others:  # Parrot against the better balancer too
                busy, ours = (spread_of(by_side.get(s, []), m.key) for s in ("least-busy", "parrot"))
                row.append(compared(m, busy, ours))
        works = [median_work(by_side[s]) for s in sides if s in by_side]
        same = len({x.generated for x in works}) == 1
        row.append(" / ".join(str(x.generated) for x in works) + ("" if same else " (differ!)"))
        row.append(" / ".join(str(x.computed) for x in works))
        row.append(" / ".join(steps_of(x) for x in works))
        row.append(" / ".join(median_cpu(by_side[s]) for s in sides if s in by_side))
        rows.append(row)
    legend = (
        f"Sides: {', '.join(SIDE_NAMES[s] for s in sides)} (token counters, engine steps and CPU "
        "seconds of the run in that order). Times and rates: median (min-max) over the runs. Speed-up: "
        "baseline time / Parrot time (or Parrot rate / baseline rate), of the medians: above 1, Parrot "
        "is faster; (overlap): the two sides' ranges overlap, so the speed-up is within the noise of "
        "this machine and says nothing either way."
    )
    return "\n".join([_settings(results, results.main), "", legend, "", *_markdown(head, rows)])


def ablation_table(results: Results) -> str:
    """Parrot with all policies on against each one off: what each policy buys."""
    w = results.workload
    head = ["configuration", "ServeCore"]
    for m in w.metrics:
        head += [m.label, f"policy buys ({m.label})"]
    rows = []
    for (config, _rtt), by_side in group(results.ablations).items():
        on = by_side.get("parrot", [])
        for side, samples in by_side.items():
            row = [config, "all policies on" if side == "parrot" else f"`--{side.replace(' ', '-')}`"]
            for m in w.metrics:
                value = spread_of(samples, m.key)
                buys = "" if side == "parrot" else compared(m, value, spread_of(on, m.key))
                row += [_value(m, value), buys]
            rows.append(row)
    legend = (
        f"Round trip {results.ablation_rtt_ms} ms. Policy buys: the time with the policy off / with "
        "all on (rates the other way round): above 1, the policy helps."
    )
    return "\n".join([_settings(results, results.ablations), "", legend, "", *_markdown(head, rows)])


def _markdown(head: list[str], rows: list[list[str]]) -> list[str]:
    lines = [
        "| " + " | ".join(head) + " |",
        "| " + " | ".join(["---"] * 2 + ["---:"] * (len(head) - 2)) + " |",
    ]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def _bar_panels(
    title: str,
    metrics: Sequence[Metric],
    configs: Sequence[str],
    categories: Sequence[str],
    value: Callable[[str, str, Metric], float],
    axis: tuple[str, str],
    path: Path,
) -> None:
    """A panel per metric: a bar per category and configuration, a line at 1."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(metrics), figsize=(4.5 * len(metrics), 3.2), squeeze=False)
    width = 0.8 / max(1, len(configs))
    ticks = [i + width * (len(configs) - 1) / 2 for i in range(len(categories))]
    for ax, m in zip(axes[0], metrics, strict=True):
        for n, config in enumerate(configs):
            bars = [value(config, category, m) for category in categories]
            ax.bar([i + n * width for i in range(len(categories))], bars, width, label=config)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks(ticks, categories, fontsize=8, rotation=15)
        ax.set_xlabel(axis[0])
        ax.set_ylabel(f"{axis[1]} ({m.label})")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.0), fontsize=8, frameon=False)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)


def plot_main(results: Results, path: Path) -> None:
    """Parrot's speed-up over the baseline against the round trip, a panel per metric."""
    grouped = group(results.main)

    def speedup(config: str, rtt: str, m: Metric) -> float:
        by_side = grouped.get((config, int(rtt.split()[0])), {})
        return m.speedup(
            median_of(by_side.get("baseline", []), m.key), median_of(by_side.get("parrot", []), m.key)
        )

    w = results.workload
    configs = list(dict.fromkeys(c for c, _ in grouped))
    rtts = [f"{r} ms" for r in dict.fromkeys(r for _, r in grouped)]
    axis = ("simulated round trip per request", "Parrot speed-up")
    _bar_panels(f"{w.title}: Parrot vs request-level baseline", w.metrics, configs, rtts, speedup, axis, path)


def plot_ablations(results: Results, path: Path) -> None:
    """What each scheduling policy buys, a panel per metric."""
    grouped = group(results.ablations)

    def buys(config: str, policy: str, m: Metric) -> float:
        by_side = next(v for (c, _), v in grouped.items() if c == config)
        return m.speedup(
            median_of(by_side.get(policy, []), m.key), median_of(by_side.get("parrot", []), m.key)
        )

    w = results.workload
    configs = list(dict.fromkeys(c for c, _ in grouped))
    policies = list(dict.fromkeys(s.side for s in results.ablations if s.side != "parrot"))
    axis = ("scheduling policy off", "policy buys")
    _bar_panels(f"{w.title}: each scheduling policy off", w.metrics, configs, policies, buys, axis, path)


def can_plot() -> bool:
    """Plots need matplotlib (the ``bench`` extra): without it the tables are written alone."""
    if importlib.util.find_spec("matplotlib") is None:
        print("no matplotlib (pip install -e '.[bench]'): tables only, no plots", file=sys.stderr)
        return False
    return True


def section_name(base: str, options: Options) -> str:
    """The docs section (and plot file) of a run: each size and ``--label`` has sections of
    its own (``apps-chatbot``, ``apps-chatbot-quick``, ``apps-chatbot-quick-cuda``), so a
    ``--quick --docs`` run or one on another machine does not replace a full run's."""
    size = "" if options.size == "full" else options.size
    fleet = "fleet" if options.fleet else ""
    return "-".join(part for part in (base, size, fleet, options.label) if part)


def command_of(workload: str, options: Options) -> str:
    """The ``parrot bench`` command line that names a run's size and label."""
    size = "" if options.size == "full" else f" --{options.size}"
    label = f" --label {options.label}" if options.label else ""
    fleet = f" --fleet {','.join(map(str, options.fleet))}" if options.fleet else ""
    return f"parrot bench {workload}{size}{fleet}{label}"


def report(results: Results, write: bool) -> str:
    """The tables as markdown (returned); with ``write``, also into docs/benchmarks.md
    and the plots into docs/img/."""
    w = results.workload
    name = section_name(f"apps-{w.name}", results.options)
    title = f"{w.title} (`{command_of(w.name, results.options)}`)"
    text = f"### {title}\n\n{w.about}\n\n{main_table(results)}"
    plots = write and can_plot()
    if plots:
        plot_main(results, IMAGES / f"{name}.png")
        text += f"\n\n![{w.title}: speed-ups](img/{name}.png)"
    parts = [text]
    if results.ablations:
        ablations = f"#### {w.title}: ablations\n\n{ablation_table(results)}"
        if plots:
            plot_ablations(results, IMAGES / f"{name}-ablations.png")
            ablations += f"\n\n![{w.title}: ablations](img/{name}-ablations.png)"
        parts.append(ablations)
    if write:
        write_section(name, parts[0])
        if len(parts) > 1:
            write_section(f"{name}-ablations", parts[1])
    return "\n\n".join(parts)


def summary(everything: Sequence[Results], write: bool) -> str:
    """The headline speed-up of every workload and configuration at every round trip."""
    rtts = list(dict.fromkeys(r for res in everything for r in res.options.rtts_ms))
    head = ["workload", "configuration", "headline", *[f"{r} ms" for r in rtts]]
    rows = []
    for res in everything:
        m = res.workload.metrics[0]
        grouped = group(res.main)
        for config in dict.fromkeys(c for c, _ in grouped):
            row = [res.workload.title, config, m.label]
            for rtt in rtts:
                by_side = grouped.get((config, rtt), {})
                base, ours = (
                    spread_of(by_side.get("baseline", []), m.key),
                    spread_of(by_side.get("parrot", []), m.key),
                )
                row.append(compared(m, base, ours))
            rows.append(row)
    text = "\n".join(
        [
            "Parrot's speed-up over the request-level baseline (headline metric of each workload, "
            "median of the runs) at each simulated round trip; above 1, Parrot is faster; (overlap): "
            "the sides' ranges over the runs overlap, the speed-up is within the noise.",
            "",
            *_markdown(head, rows),
        ]
    )
    if write:
        write_section(section_name("apps-summary", everything[0].options), "### Summary\n\n" + text)
    return text
