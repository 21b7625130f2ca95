"""The dashboard's pictures: DAG layers, context-tree layout, charts, and escaping in SVG."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from parrot.platform.serve.ops.observe import (
    ContextNode,
    ContextTreeView,
    DagCall,
    DagEdge,
    DagVar,
    SessionDag,
)
from parrot.web.svg import charts, dag, tree
from parrot.wire.formats import OutputFormat


def call(call_id: str, seq: int, inputs: list[str], outputs: list[str], state: str = "done", **kw) -> DagCall:
    return DagCall(
        call_id=call_id,
        seq=seq,
        kind="llm",
        state=state,
        engine=kw.get("engine", "engine-1"),
        inputs=inputs,
        outputs=outputs,
        latency_critical=kw.get("latency", False),
        group=kw.get("group"),
        timings=kw.get("timings", {}),
        error=None,
        template=[],
    )


def var(var_id: str, name: str | None = None, producer: str | None = None) -> DagVar:
    return DagVar(var_id, name or var_id, "ready", "v", None, producer, [])


def map_reduce(maps: int = 3) -> SessionDag:
    """doc -> map_i -> s_i -> reduce -> total."""
    calls = [call(f"m{i}", i + 1, ["doc"], [f"s{i}"], group="group-9") for i in range(maps)]
    calls.append(call("reduce", maps + 1, [f"s{i}" for i in range(maps)], ["total"], latency=True))
    variables = [var("doc")] + [var(f"s{i}", producer=f"m{i}") for i in range(maps)]
    variables.append(var("total", producer="reduce"))
    edges = [DagEdge("doc", f"m{i}") for i in range(maps)]
    edges += [DagEdge(f"m{i}", f"s{i}") for i in range(maps)]
    edges += [DagEdge(f"s{i}", "reduce") for i in range(maps)]
    edges.append(DagEdge("reduce", "total"))
    return SessionDag("sess", True, calls, variables, edges)


def test_dag_layers_follow_dependencies():
    layers = dag.layers(map_reduce())
    assert layers["doc"] == 0
    assert {layers[f"m{i}"] for i in range(3)} == {1}
    assert {layers[f"s{i}"] for i in range(3)} == {2}
    assert layers["reduce"] == 3 and layers["total"] == 4


def test_a_call_sits_right_of_its_furthest_input():
    # chain a -> x -> b -> y; c reads doc and y: it must be right of y, not next to doc.
    graph = SessionDag(
        "s",
        True,
        [call("a", 1, ["doc"], ["x"]), call("b", 2, ["x"], ["y"]), call("c", 3, ["doc", "y"], ["z"])],
        [var("doc"), var("x", producer="a"), var("y", producer="b"), var("z", producer="c")],
        [
            DagEdge("doc", "a"),
            DagEdge("a", "x"),
            DagEdge("x", "b"),
            DagEdge("b", "y"),
            DagEdge("doc", "c"),
            DagEdge("y", "c"),
            DagEdge("c", "z"),
        ],
    )
    layers = dag.layers(graph)
    assert layers["c"] == layers["y"] + 1 == 5
    shape = dag.layout(graph)
    assert shape.nodes["c"].x > shape.nodes["y"].x > shape.nodes["b"].x


def test_dag_layout_stacks_a_layer_and_centres_smaller_ones():
    shape = dag.layout(map_reduce(4))
    maps = sorted(shape.nodes[f"m{i}"].y for i in range(4))
    assert len(set(maps)) == 4  # one row each
    assert shape.nodes["reduce"].y == sum(maps) / 4  # centred on what feeds it
    assert shape.height >= 4 * dag.ROW


def test_dag_svg_is_well_formed_with_marks_states_and_links():
    svg = str(dag.render(map_reduce(), lambda node: f"/sessions/sess?node={node}", selected="m1"))
    root = ET.fromstring(svg)  # well-formed XML
    ns = {"s": "http://www.w3.org/2000/svg"}
    nodes = root.findall(".//s:g[@data-node]", ns)
    assert len(nodes) == 4 + 5
    assert svg.count('class="mark-latency"') == 1  # the reduce
    assert svg.count('class="mark-group"') == 3  # the maps
    assert "selected" in root.find(".//s:g[@data-node='m1']", ns).get("class")
    links = [a.get("href") for a in root.findall(".//s:a", ns)]
    assert "/sessions/sess?node=reduce" in links


def test_svg_text_is_escaped():
    evil = '<script>alert("x")</script>'
    graph = SessionDag("s<", True, [call("c", 1, ["v"], ["o"])], [var("v", evil), var("o", producer="c")], [])
    svg = str(dag.render(graph, lambda node: f"/x?node={node}&a=<b>"))
    assert "<script>" not in svg and "&lt;script&gt;" in svg
    ET.fromstring(svg)
    assert "&lt;b&gt;" in svg and "&amp;a=" in svg


def test_a_typed_variable_is_marked_with_its_format_kind():
    typed = DagVar(
        "t", "plan", "ready", "{}", None, None, [], format=OutputFormat(json_schema={"type": "object"})
    )
    graph = SessionDag("s", True, [call("c", 1, ["t"], ["o"])], [typed, var("o", producer="c")], [])
    root = ET.fromstring(str(dag.render(graph, lambda node: f"/x?node={node}")))
    nodes = {g.get("data-node"): g for g in root.iter("{http://www.w3.org/2000/svg}g") if g.get("data-node")}
    assert "typed" in nodes["t"].get("class").split() and nodes["t"].get("data-format") == "json_schema"
    assert "typed" not in nodes["o"].get("class").split() and nodes["o"].get("data-format") is None
    assert (
        nodes["t"].find("{http://www.w3.org/2000/svg}title").text
        == "variable plan (ready), typed: json_schema"
    )


def ctx(
    node_id: int, parent: int | None, tokens: int, sessions: list[str], shared: bool = False
) -> ContextNode:
    return ContextNode(node_id, parent, 0, tokens, len(sessions) or 1, 0, sessions, shared, tokens, 1)


def test_tree_layout_puts_leaves_on_rows_and_parents_between_children():
    view = ContextTreeView(
        "engine-1",
        "m",
        False,
        3,
        100,
        16,
        7,
        100,
        [
            ctx(0, None, 40, ["a", "b"], shared=True),
            ctx(1, 0, 10, ["a"]),
            ctx(2, 0, 12, ["b"]),
            ctx(3, 2, 3, ["b"]),
            ctx(4, None, 5, ["c"]),
        ],
    )
    spots = tree.layout(view)
    assert [spots[i].level for i in range(5)] == [0, 1, 1, 2, 0]
    assert spots[1].row == 0 and spots[3].row == 1 and spots[4].row == 2
    assert spots[2].row == 1  # its only child's row
    assert spots[0].row == 0.5  # between its children
    svg = str(tree.render(view))
    ET.fromstring(svg)
    assert svg.count('class="ctx-node shared"') == 1
    assert 'data-sessions="a b"' in svg


def test_load_bar_and_sparkline():
    half = str(charts.load_bar(5, 10, width=100))
    assert 'width="50"' in half and "low" in half
    assert "high" in str(charts.load_bar(95, 100))
    assert "unknown" in str(charts.load_bar(None, None))
    line = str(charts.sparkline([0, 1, 2, 4], "tps", width=90, height=40))
    ET.fromstring(line)
    points = line.split('<polyline points="')[1].split('"')[0].split()
    assert len(points) == 4 and points[0].startswith("0,") and points[-1].startswith("90,")
    assert float(points[-1].split(",")[1]) < float(points[0].split(",")[1])  # the largest is highest


def test_gantt_has_a_lane_per_engine():
    calls = [
        call(
            "a",
            1,
            [],
            ["x"],
            engine="engine-1",
            timings={"submitted_at": 0, "started_at": 1, "finished_at": 3},
        ),
        call(
            "b",
            2,
            [],
            ["y"],
            engine="engine-2",
            timings={"submitted_at": 0, "started_at": 2, "finished_at": 4},
        ),
    ]
    svg = str(charts.gantt(calls))
    ET.fromstring(svg)
    assert svg.count('class="lane"') == 2 and svg.count('class="run state-done"') == 2


def test_gantt_puts_calls_that_ran_at_once_on_separate_rows():
    at = {"submitted_at": 0, "started_at": 1, "finished_at": 3}
    later = {"submitted_at": 4, "started_at": 4, "finished_at": 5}
    svg = str(
        charts.gantt(
            [
                call("a", 1, [], ["x"], timings=at),
                call("b", 2, [], ["y"], timings=at),
                call("c", 3, [], ["z"], timings=later),
            ]
        )
    )
    rows = [float(p.split('y="')[1].split('"')[0]) for p in svg.split('class="run state-done"')[1:]]
    assert len(rows) == 3 and rows[0] != rows[1] and rows[2] == rows[0]  # c reuses a's row


def test_the_sparklines_max_is_written_above_its_line():
    """Issue 24: the "max" label overlapped the line's highest points."""
    line = str(charts.sparkline([0, 3, 1, 3], "tps", width=120, height=50))
    ET.fromstring(line)
    ys = [float(p.split(",")[1]) for p in line.split('<polyline points="')[1].split('"')[0].split()]
    label_baseline = float(line.split('<text x="118" y="')[1].split('"')[0])
    assert min(ys) >= charts.LABEL_BAND > label_baseline  # 10 px text sits on its baseline, above


def test_a_context_tree_says_what_its_numbers_are():
    """Issue 24: "sub 354 · 23 blk" said nothing to a reader; the tree also fits its box."""
    node = ContextNode(0, None, 31, 1, 2, 1, ["s1"], False, 354, 23)
    view = ContextTreeView("engine-1", "m", False, 2, 354, 16, 23, 100, [node])
    svg = str(tree.render(view))
    ET.fromstring(svg)
    assert "1 token from 31" in svg and "2 contexts · 1 task" in svg and "total 354 tokens · 23 blocks" in svg
    assert "blk" not in svg and "sub " not in svg
    assert 'style="min-width: ' in svg  # scaled down to fit, to a readable least
