"""The draft settings follow the temperature: across T = 0 an untouched shape becomes the device's
fastest at the new temperature (demo/ui/settings_panel.py), and a visitor's own shape stays."""

import pytest

from demo.config import TreeShape
from demo.methods import default_draft
from demo.ui.settings_panel import draft_at_temperature
from demo.views import build_demo
from tests.defaults import set_eagle_defaults
from tests.tiny_chat import tiny_session


def test_an_untouched_gpu_shape_moves_to_the_fastest_at_each_side_of_zero():
    greedy, sampled = default_draft("cuda", 0.0), default_draft("cuda", 1.0)
    page = (greedy[0], "tree", greedy[1].topk, greedy[1].size)
    moved = draft_at_temperature("cuda", 0.8, *page)
    assert moved == (sampled[0], "tree", sampled[1].topk, sampled[1].size)
    assert draft_at_temperature("cuda", 0.0, *moved) == page  # and back at T = 0
    assert draft_at_temperature("cuda", 1.2, *moved) is None  # already the sampled side's


@pytest.mark.parametrize("page", [(4, "tree", 2, 8), (7, "tree", 8, 32), (7, "chain", 8, 64), (3, "chain", 8, 64)])
def test_a_shape_the_visitor_chose_stays_when_the_temperature_changes(page):
    assert draft_at_temperature("cuda", 0.8, *page) is None


def test_an_untouched_cpu_tree_becomes_the_sampled_chain_and_comes_back():
    greedy, sampled = default_draft("cpu", 0.0), default_draft("cpu", 0.8)
    assert greedy[1] is not None and sampled[1] is None  # a CPU: a narrow tree at T = 0, a chain above
    page = (greedy[0], "tree", greedy[1].topk, greedy[1].size)
    moved = draft_at_temperature("cpu", 0.8, *page)
    assert moved == (sampled[0], "chain", *page[2:])  # the hidden tree settings are kept
    assert draft_at_temperature("cpu", 0.0, *moved) == page


def test_where_both_temperatures_share_a_shape_nothing_moves(monkeypatch):
    set_eagle_defaults(monkeypatch, "cpu", sampled="greedy")
    assert default_draft("cpu", 0.0) == default_draft("cpu", 0.7)
    assert draft_at_temperature("cpu", 0.7, 3, "chain", 2, 8) is None


@pytest.mark.parametrize("temperature", [None, "hot", float("nan"), True])
def test_a_temperature_that_is_not_a_number_counts_as_greedy(temperature):
    greedy = default_draft("cuda", 0.0)
    page = (greedy[0], "tree", greedy[1].topk, greedy[1].size)
    assert draft_at_temperature("cuda", temperature, *page) is None


def test_the_page_moves_an_untouched_default_shape_to_the_devices_sampled_default(monkeypatch):
    """The listener on the page's temperature, found among the Blocks' events and called as Gradio
    calls it (raw values), on a device whose sampled default differs from its greedy one."""
    set_eagle_defaults(monkeypatch, "cpu", sampled=(2, TreeShape(2, 4)))
    demo = build_demo(tiny_session(predictable=True))
    fns = [f for f in demo.fns.values() if getattr(f.fn, "__name__", "") == "follow_temperature"]
    assert len(fns) == 1 and [c.elem_id for c in fns[0].inputs][0] == "sl-temperature"
    assert [c.elem_id for c in fns[0].outputs] == ["sl-k", "sl-shape", "sl-tree-topk", "sl-draft-tokens"]
    k, tree = default_draft("cpu", 0.0)
    assert fns[0].fn(0.7, k, "tree", tree.topk, tree.size, "eagle3") == [2, "tree", 2, 4]
    assert fns[0].fn(0.0, 2, "tree", 2, 4, "eagle3") == [k, "tree", tree.topk, tree.size]
