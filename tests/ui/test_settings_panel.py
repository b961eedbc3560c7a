"""The draft settings follow the temperature: across T = 0 an untouched shape becomes the device's
fastest at the new temperature (demo/ui/settings_panel.py), and a visitor's own shape stays. A value
typed out of range is answered in one sentence, with a range the model can run."""

import re

import gradio as gr
import pytest

from demo.config import TreeShape
from demo.methods import default_draft
from demo.service.request import Request, RequestError
from demo.ui.settings_panel import draft_at_temperature
from demo.views import build_demo
from tests.defaults import set_eagle_defaults
from tests.html_text import shown
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


def typed_max_new(demo, value) -> tuple[list[str], list]:
    """Type `value` into the max new tokens box as a browser does: its change (the raw value), then
    leaving the box (release, the typed value). Returns (the status lines said, the box's values set)."""
    listeners = {f.name: f for f in demo.fns.values()
                 if [demo.blocks[t[0]].elem_id for t in f.targets if t[0] in demo.blocks] == ["sl-max-new"]}
    said, boxes = [], []
    for name, call in (("setting_checked", lambda fn: fn(value)),
                       ("setting_released", lambda fn: fn(gr.EventData(None, value)))):
        fn = listeners[name]
        out = {b.elem_id: v for b, v in call(fn.fn).items()}  # a handler's {component: value}
        if isinstance(out.get("sl-status"), str):
            said.append(shown(out["sl-status"]).text)
        box = out.get("sl-max-new")
        box = box.get("value") if isinstance(box, dict) else box  # an update, or the value itself
        if isinstance(box, (int, float)):
            boxes.append(box)
    return said, boxes


@pytest.mark.parametrize("value, put", [(0, "lo"), (5000, "hi")])
def test_a_typed_max_new_tokens_out_of_range_is_answered_once_with_what_was_done_and_the_range(value, put):
    demo = build_demo(tiny_session(predictable=True))
    box = next(b for b in demo.blocks.values() if getattr(b, "elem_id", None) == "sl-max-new")
    lo, hi = box.minimum, box.maximum
    said, boxes = typed_max_new(demo, value)
    to = lo if put == "lo" else hi
    assert len(said) == 1, said  # one sentence, not one on change and another on release
    assert f"max new tokens = {value} is out of range: allowed {lo} to {hi}; set to {to}." in said[0], said
    assert boxes == [to]  # the box holds what the sentence says


def test_the_max_new_tokens_a_typed_5000_is_set_to_fits_the_models_context_with_a_short_prompt():
    # the range a typed value is refused with is one the model can run: the value it is set to does not
    # meet the context's refusal at Generate (which would contradict "allowed 1 to ...")
    session = tiny_session(predictable=True)
    said, _ = typed_max_new(build_demo(session), 5000)
    most = int(re.search(r"allowed 1 to (\d+)", said[0])[1])  # what 5000 becomes in the box
    try:
        session.check(Request.of("Say a", max_new_tokens=most))
    except RequestError as e:
        raise AssertionError(f"{said[0]!r}, then at Generate: {e}") from None


class Page:
    """The page's settings as a browser holds them, moved as a visitor moves them: a setting's input
    and change listeners run (called as Gradio calls them, each input's value read from the page), and
    each value they set fires that component's own change listeners in turn."""

    def __init__(self, demo):
        self.demo = demo
        self.values = {i: getattr(b, "value", None) for i, b in demo.blocks.items()}
        self.ids = {b.elem_id: i for i, b in demo.blocks.items() if getattr(b, "elem_id", None)}

    def __getitem__(self, elem_id: str):
        return self.values[self.ids[elem_id]]

    def move(self, elem_id: str, value) -> None:
        block = self.ids[elem_id]
        self.values[block] = value
        self._fire([(block, "input"), (block, "change")])

    def _fire(self, events: list) -> None:
        for _ in range(50):  # a settled page fires nothing more
            if not events:
                return
            target = events.pop(0)
            for f in self.demo.fns.values():
                if f.fn is None or target not in [tuple(t) for t in f.targets]:
                    continue
                result = f.fn(*[self.values.get(c._id) for c in f.inputs])
                if not isinstance(result, dict) or "__type__" in result:  # one output, or a list of them
                    result = dict(zip(f.outputs, [result] if len(f.outputs) == 1 else result))
                for component, out in result.items():
                    if isinstance(out, dict) and out.get("__type__") == "update":
                        if "value" not in out:
                            continue  # skipped, or only its range changed
                        out = out["value"]
                    if out != self.values.get(component._id):
                        self.values[component._id] = out
                        events.append((component._id, "change"))
        raise AssertionError("the settings kept moving each other")


def test_untouched_tokens_verified_come_back_to_the_default_when_k_and_top_k_do():
    page = Page(build_demo(tiny_session(predictable=True)))
    k, tree = default_draft("cpu", 0.0)  # a CPU's: depth 4, top-2, 6 tokens verified
    assert (page["sl-k"], page["sl-tree-topk"], page["sl-draft-tokens"]) == (k, tree.topk, tree.size)
    page.move("sl-k", 1)
    assert page["sl-draft-tokens"] == 1 + tree.topk  # a depth-1 tree verifies its root and top-k children
    page.move("sl-k", k)
    assert page["sl-draft-tokens"] == tree.size
    page.move("sl-tree-topk", 1)
    assert page["sl-draft-tokens"] == k + 1  # top-1: a chain of k, root included
    page.move("sl-tree-topk", tree.topk)
    assert page["sl-draft-tokens"] == tree.size


def test_tokens_verified_the_visitor_chose_stay_where_they_fit_and_come_back_where_they_fit_again():
    page = Page(build_demo(tiny_session(predictable=True)))
    k, tree = default_draft("cpu", 0.0)
    page.move("sl-draft-tokens", 10)  # 5 to 15 fit a depth-4 top-2 tree
    page.move("sl-k", 3)
    assert page["sl-draft-tokens"] == 10  # 4 to 11 at depth 3: it fits
    page.move("sl-k", 1)
    assert page["sl-draft-tokens"] == 1 + tree.topk  # the most a depth-1 tree verifies
    page.move("sl-k", k)
    assert page["sl-draft-tokens"] == 10


def test_the_default_tokens_verified_a_temperature_moves_to_stay_when_k_follows(monkeypatch):
    # the sampled default verifies 4 tokens, not the device's default tree's 6: k's change that the move
    # fires keeps them
    set_eagle_defaults(monkeypatch, "cpu", sampled=(2, TreeShape(2, 4)))
    page = Page(build_demo(tiny_session(predictable=True)))
    page.move("sl-temperature", 0.7)
    assert (page["sl-k"], page["sl-shape"], page["sl-tree-topk"], page["sl-draft-tokens"]) == (2, "tree", 2, 4)
    page.move("sl-k", 1)
    page.move("sl-k", 2)
    assert page["sl-draft-tokens"] == 4
