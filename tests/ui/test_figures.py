"""The chart builders (demo/ui/figures.py) are pure functions of plain numbers: assert on figure data."""

import copy

import pytest

from demo.metrics import AcceptanceStats
from demo.service.chat import StepPoint
from demo.tree import DraftTree
from demo.ui.figures import (
    REJECTED_COLOR,
    acceptance_figure,
    acceptance_length_figure,
    latency_figure,
    throughput_figure,
    tree_figure,
    tree_rows,
)
from demo.ui.html.render import depth_color


def points() -> list[StepPoint]:
    # k = 3; accepted 3, 1, 0, 2 drafts; each step emits accepted + 1 tokens
    accepted = [3, 1, 0, 2]
    out, tokens, t = [], 1, 0.010  # prefill: 1 token in 10 ms
    for i, n in enumerate(accepted, 1):
        tokens += n + 1
        t += 0.004 + 0.006
        out.append(StepPoint(step=i, reach=3, num_accepted=n, num_emitted=n + 1, draft_ms=4.0, verify_ms=6.0,
                             elapsed_s=t, tokens_per_s=tokens / t))
    return out


def steps(n: int) -> list[StepPoint]:
    """n steps, each accepting 1 of 3 drafts."""
    return [StepPoint(step=i, reach=3, num_accepted=1, num_emitted=2, draft_ms=1.0, verify_ms=2.0,
                      elapsed_s=i * 0.003, tokens_per_s=600.0) for i in range(1, n + 1)]


def stats() -> AcceptanceStats:
    s = AcceptanceStats(reach=3)
    for n in (3, 1, 0, 2):
        s.observe_draft(3, n)
    return s


def test_acceptance_bars_are_the_share_of_steps_with_at_least_i_plus_1_accepted():
    fig = acceptance_figure(stats())
    (bar,) = fig.data
    assert list(bar.x) == ["draft 1", "draft 2", "draft 3"]
    assert list(bar.y) == pytest.approx([3 / 4, 2 / 4, 1 / 4])  # >=1: 3 of 4 steps, >=2: 2, >=3: 1
    assert list(bar.marker.color) == [depth_color(1), depth_color(2), depth_color(3)]  # the legend's colours
    assert tuple(fig.layout.yaxis.range) == (0, 1)


def test_acceptance_length_per_step_and_its_running_mean():
    fig = acceptance_length_figure(points())
    bars, line = fig.data
    assert list(bars.x) == [1, 2, 3, 4] and list(bars.y) == [4, 2, 1, 3]  # accepted + the target's own token
    assert list(line.y) == pytest.approx([4, 3, 7 / 3, 2.5])
    assert line.y[-1] == pytest.approx(stats().mean_acceptance_length)  # the same definition as metrics.py


def test_target_only_steps_are_not_acceptance_lengths():
    p = [StepPoint(1, 0, 0, 1, 0.0, 5.0, 0.01, 100.0)]
    fig = acceptance_length_figure(p)
    bars, line = fig.data
    assert list(bars.y) == [] and list(line.y) == []
    assert [a.text for a in fig.layout.annotations] == ["target only: no drafts"]
    assert [a.text for a in acceptance_figure(AcceptanceStats(0)).layout.annotations] == ["target only: no drafts"]


def test_latency_bars_stack_draft_and_verify_ms():
    fig = latency_figure(points())
    draft, verify = fig.data
    assert (draft.name, verify.name) == ("draft", "verify")
    assert list(draft.y) == [4.0] * 4 and list(verify.y) == [6.0] * 4
    assert fig.layout.barmode == "stack"


def test_throughput_has_running_rate_and_per_step_rate():
    p = points()
    per_step, running = throughput_figure(p).data
    assert list(running.x) == [q.elapsed_s for q in p]
    assert list(running.y) == [q.tokens_per_s for q in p]
    assert list(per_step.y) == pytest.approx([4 / 0.01, 2 / 0.01, 1 / 0.01, 3 / 0.01])


@pytest.mark.parametrize("build", [acceptance_length_figure, latency_figure, throughput_figure])
def test_empty_charts_say_so(build):
    fig = build([])
    assert [a.text for a in fig.layout.annotations] == ["no steps yet"]


@pytest.mark.parametrize("build", [acceptance_length_figure, latency_figure, throughput_figure])
def test_empty_charts_start_their_y_axis_at_zero(build):
    assert build([]).layout.yaxis.range[0] == 0
    assert acceptance_figure(AcceptanceStats(0)).layout.yaxis.range[0] == 0


@pytest.mark.parametrize("build", [acceptance_length_figure, latency_figure])
@pytest.mark.parametrize("n", [1, 2, 3, 7, 12, 40, 130, 2048])
def test_step_axes_have_whole_number_ticks(build, n):
    fig = build(steps(n))
    axis = fig.layout.xaxis
    assert axis.dtick is not None and float(axis.dtick).is_integer() and float(axis.tick0).is_integer()
    assert n / axis.dtick <= 10  # about ten ticks at most


def test_figures_are_pure_functions():
    p, s = points(), stats()
    before = (copy.deepcopy(p), copy.deepcopy(s))
    for build, arg in ((acceptance_figure, s), (acceptance_length_figure, p), (latency_figure, p),
                       (throughput_figure, p)):
        assert build(arg).to_json() == build(arg).to_json()
    assert (p, s) == before  # inputs untouched


def small_tree() -> DraftTree:
    # depth 3, top-2:   root ─ 1 " the" ─ 3 " cat" ─ 5 " sat"     accepted path: 1, 3, 5
    #                       │          └─ 4 "<b>"
    #                       └─ 2 " a" ─ 6 "\n"
    return DraftTree(tokens=[11, 12, 13, 14, 15, 16], parents=[0, 0, 1, 1, 3, 2],
                     draft_probs=[0.6, 0.3, 0.5, 0.25, 0.7, 0.4], target_probs=[0.8, 0.1, 0.45, 0.3, 0.65, 0.2],
                     path=[1, 3, 5])


TEXTS = ["Hello", " the", " a", " cat", "<b>", " sat", "\n"]  # root first, then nodes 1..6


def nodes_of(fig):
    return next(t for t in fig.data if t.name == "nodes")


def edges_of(fig) -> dict[str, set]:
    """Edge trace name -> {((x0, y0), (x1, y1))}: segments separated by None."""
    out = {}
    for t in fig.data:
        if t.mode == "lines":
            xs, ys = list(t.x), list(t.y)
            out[t.name] = {((xs[i], ys[i]), (xs[i + 1], ys[i + 1])) for i in range(0, len(xs), 3)}
    return out


def test_tree_figure_draws_every_node_at_its_depth_and_row():
    fig = tree_figure(small_tree(), TEXTS, 7)
    nodes = nodes_of(fig)
    assert len(nodes.x) == 7  # the root and six drafts
    assert list(nodes.x) == [0, 1, 1, 2, 2, 3, 2]  # x: depth in the draft
    assert list(nodes.y) == tree_rows(small_tree().parents) == [0, 0, 2, 0, 1, 0, 2]  # first child shares its row
    assert fig.layout.title.text.startswith("Draft tree of step 7: 6 drafts, 3 accepted")


def test_tree_figure_has_one_edge_per_node_from_its_parent():
    fig = tree_figure(small_tree(), TEXTS, 1)
    nodes = nodes_of(fig)
    at = lambda n: (nodes.x[n], nodes.y[n])  # noqa: E731
    edges = edges_of(fig)
    assert edges["accepted path"] == {(at(0), at(1)), (at(1), at(3)), (at(3), at(5))}
    assert edges["not accepted"] == {(at(0), at(2)), (at(1), at(4)), (at(2), at(6))}


def test_the_accepted_path_takes_the_texts_depth_colours_and_the_rest_is_grey():
    colors = list(nodes_of(tree_figure(small_tree(), TEXTS, 1)).marker.color)
    assert [colors[n] for n in (1, 3, 5)] == [depth_color(1), depth_color(2), depth_color(3)]  # as in the chat text
    assert [colors[n] for n in (2, 4, 6)] == [REJECTED_COLOR] * 3


def test_tree_hover_shows_token_depth_q_and_p_with_markup_as_text():
    hover = list(nodes_of(tree_figure(small_tree(), TEXTS, 1)).hovertext)
    assert "accepted draft token 2" in hover[3] and "token:  cat" in hover[3]
    assert "depth 2" in hover[3] and "q = 0.500" in hover[3] and "p = 0.450" in hover[3]
    assert "rejected" in hover[4] and "&lt;b&gt;" in hover[4] and "<b>" not in hover[4]  # plotly reads <b> as bold
    assert "below a rejected token" in hover[6]
    assert hover[0].startswith("root") and "Hello" in hover[0]


def test_a_chain_draws_as_one_straight_path():
    chain = DraftTree(tokens=[5, 6, 7], parents=[0, 1, 2], draft_probs=None, target_probs=[0.9, 0.5, 0.1], path=[1])
    fig = tree_figure(chain, ["x", "a", "b", "c"], 3)
    nodes = nodes_of(fig)
    assert list(nodes.x) == [0, 1, 2, 3] and list(nodes.y) == [0, 0, 0, 0]  # one row
    assert sum(len(e) for e in edges_of(fig).values()) == 3
    assert "q: not recorded" in nodes.hovertext[1]  # a plain chain keeps no q


def test_a_lookup_branchs_nodes_hover_as_copies_with_no_q():
    from dataclasses import replace

    tree = replace(small_tree(), copied=2)  # nodes 5 and 6: the branch's
    hover = list(nodes_of(tree_figure(tree, TEXTS, 1)).hovertext)
    assert all("copied from the text" in h and "q: none, not drafted" in h for h in hover[5:7])
    assert not any("copied" in h for h in hover[:5]) and "q = 0.500" in hover[3]


def test_no_tree_says_why():
    fig = tree_figure(None, [], 0, "target only: no drafts")
    assert [a.text for a in fig.layout.annotations] == ["target only: no drafts"]


def test_tree_figure_is_a_pure_function():
    tree = small_tree()
    before = copy.deepcopy(tree)
    assert tree_figure(tree, TEXTS, 2).to_json() == tree_figure(tree, TEXTS, 2).to_json()
    assert tree == before
