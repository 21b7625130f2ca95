"""The small steps' packed products: torch's int4/int8 kernels against the C++ extension's
int8-activation products (``engines/builtin/csrc/int_dot.h``), on the bundled model's shapes.

    python benchmarks/int_dot_products.py [--rows 1 4 8 16] [--threads 1 2] [--before COMMIT] [--cpu avx2]

Each product is timed best-of-N, the sides called in turn within a round, ``--rounds`` times;
the table gives the median (min-max) over the rounds of each side's ms and the speed-ups of
the medians. ``--before COMMIT`` adds the extension's headers at that commit (``git show``),
built as an extension of its own with the same flags, so a change of the kernels is measured
against what it replaced in the same process. ``--cpu avx2`` runs the script again as
``benchmarks/cpu_peer.py --cpu avx2`` does (torch's kernels lowered to AVX2, the extension
compiled for Haswell), to see what an AVX2-only CPU runs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from benchmarks._report import machine, write_section  # noqa: E402
from benchmarks.cpu_peer import CPU_TARGETS  # noqa: E402
from parrot.engines.builtin.model import int_dot  # noqa: E402
from parrot.engines.builtin.model.quant import Int4Linear, Int8Linear, quantize_int4  # noqa: E402
from parrot.engines.builtin.native import CFLAGS, load_extension  # noqa: E402

# The bundled model (SmolLM2-135M): (name, in, out) of its packed products
SHAPES = (
    ("qkv", 576, 960),
    ("o", 576, 576),
    ("gate+up", 576, 3072),
    ("down", 1536, 576),
    ("head", 576, 49152),
)
BINDINGS = """#include "int_dot.h"
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("int4_rows", &intdot::int4_rows, py::call_guard<py::gil_scoped_release>());
  m.def("int8_rows", &intdot::int8_rows, py::call_guard<py::gil_scoped_release>());
}
"""


def build_before(commit: str, folder: Path):
    """The extension's products as they were at ``commit``, built beside this one."""
    listed = ["git", "ls-tree", "--name-only", commit, "engines/builtin/csrc/"]
    paths = subprocess.run(listed, cwd=ROOT, check=True, capture_output=True, text=True).stdout.split()
    for path in (p for p in paths if p.endswith(".h")):  # int_dot.h and what it includes
        show = ["git", "show", f"{commit}:{path}"]
        text = subprocess.run(show, cwd=ROOT, check=True, capture_output=True, text=True).stdout
        (folder / Path(path).name).write_text(text)
    (folder / "before.cpp").write_text(BINDINGS)
    from torch.utils.cpp_extension import load

    name = f"parrot_int_dot_before_{commit[:12]}"
    return load(name, [str(folder / "before.cpp")], extra_cflags=CFLAGS, extra_ldflags=["-fopenmp"])


def old_int4_layout(codes) -> tuple:
    """The int4 layout of the extension before groups (a block's 16 bytes: codes j | j + 16 << 4)."""
    n, k = codes.codes.shape
    blocks = codes.codes.view(n, k // 32, 32)
    packed = (blocks[..., :16] | (blocks[..., 16:] << 4)).to(torch.uint8).reshape(n, k // 2)
    d = codes.scale.float().contiguous()
    return packed.contiguous(), d, (codes.zero.float() - 8 * d).contiguous()


def sides_of(name: str, k: int, n: int, extension, before) -> dict:
    """The ways to multiply [rows, k] by this layer's weights: side name -> fn(x)."""
    weight = torch.randn(n, k, generator=torch.Generator().manual_seed(n + k)) * 0.05
    if name == "head":  # the LM head is int8, one scale a row
        layer = Int8Linear.from_float(weight, None)
        tensors = int_dot.int_weights(layer, None)
        sides = {"torch": layer.packed_mm, "ours": lambda x: extension.int8_rows(x, *tensors)}
        if before is not None:
            sides["before"] = lambda x: before.int8_rows(x, *tensors)
        return sides
    codes = quantize_int4(weight, int_dot.BLOCK)
    layer, tensors = Int4Linear(codes, None), int_dot.int4_layout(codes)
    sides = {"torch": layer.packed_mm, "ours": lambda x: extension.int4_rows(x, *tensors)}
    if before is not None:
        old = old_int4_layout(codes)
        sides["before"] = lambda x: before.int4_rows(x, *old)
    return sides


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"


def measure(args, extension, before) -> list[str]:
    rows_out = []
    for threads in args.threads:
        torch.set_num_threads(threads)
        for name, k, n in SHAPES:
            sides = sides_of(name, k, n, extension, before)
            for rows in args.rows:
                x = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows)).to(torch.bfloat16)
                times: dict[str, list[float]] = {side: [] for side in sides}
                repeats = 5 if name == "head" else 30
                with torch.inference_mode():
                    for r in range(args.rounds):
                        order = list(sides) if r % 2 == 0 else list(reversed(sides))
                        for side in order:
                            times[side].append(int_dot.best_ms(lambda fn=sides[side], x=x: fn(x), repeats))
                med = {side: statistics.median(v) for side, v in times.items()}
                cells = [spread(times[side]) for side in ("torch", "before", "ours") if side in times]
                ratios = [f"{med['torch'] / med['ours']:.2f}x"]
                if "before" in med:
                    ratios.append(f"{med['before'] / med['ours']:.2f}x")
                line = f"| {threads} | {name} {k} x {n} | {rows} | " + " | ".join(cells + ratios) + " |"
                print(line, flush=True)
                rows_out.append(line)
    return rows_out


def lowered(target) -> str:
    return " ".join(f"{key}={value}" for key, value in target.env.items())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4, 8, 16])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--before", help="a commit whose int_dot.h joins as 'before'")
    parser.add_argument("--cpu", choices=sorted(CPU_TARGETS), default="native", help="the CPU to run as")
    parser.add_argument("--no-docs", action="store_true", help="print the table only")
    args = parser.parse_args()
    target = CPU_TARGETS[args.cpu]
    if any(os.environ.get(key) != value for key, value in target.env.items()):
        # torch reads them as it loads: run again with them
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **target.env})
    extension = load_extension()
    if extension is None:
        raise SystemExit("the C++ extension cannot be built here")
    with tempfile.TemporaryDirectory(prefix="parrot-before-") as tmp:
        before = build_before(args.before, Path(tmp)) if args.before else None
        head = ["threads", "product (in x out)", "rows", "torch ms"]
        head += [f"before ({args.before}) ms"] if before else []
        head += ["ours ms", "ours / torch"] + (["ours / before"] if before else [])
        align = ["---"] * 2 + ["---:"] * (len(head) - 2)
        table = [f"| {' | '.join(head)} |", f"| {' | '.join(align)} |"]
        table += measure(args, extension, before)
    if args.no_docs:
        return
    cpu = ""
    if args.cpu != "native":
        cpu = f" Run as an {target.name}-only CPU (`--cpu {args.cpu}`: {lowered(target)})."
    write_section(
        f"int-dot-products{'' if args.cpu == 'native' else '-' + args.cpu}",
        "### Small steps' packed products (`benchmarks/int_dot_products.py`)\n\n"
        f"{machine()}.{cpu} torch's int4/int8 kernels (`torch`) against the C++ extension's "
        "int8-activation products (`ours`), on the bundled model's shapes; ms of one product, best of "
        f"30 calls (the LM head: 5), median (min-max) of {args.rounds} rounds, the sides in turn; speed-ups "
        "of the medians.\n\n" + "\n".join(table),
    )


if __name__ == "__main__":
    main()
