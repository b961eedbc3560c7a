"""The tree's Step box (demo/ui/inspect_panel.py): a step typed past the run's is answered in a
sentence and the box put back to a step there is. The page's listeners, found among the Blocks' events
and run as Gradio runs them (its preprocessing included), over a tiny model's run."""

import asyncio
import copy

import gradio as gr
import pytest
from gradio.state_holder import SessionState

from demo.service.chat import ChatState
from demo.service.request import Request
from demo.views import build_demo
from tests.tiny_chat import tiny_session


@pytest.fixture(scope="module")
def page():
    """The page, a chat whose latest run drafted several trees, and the tree slider's listeners."""
    session = tiny_session()
    demo = build_demo(session)
    chat = session.add_user_turn(ChatState(), Request.of("hi"))
    chat = list(session.reply(chat, Request.of("hi", max_new_tokens=12, method="eagle")))[-1].chat
    listeners = {f.name: f for f in demo.fns.values() if f.name in ("show_tree", "typed_step")}
    return demo, chat, listeners


def typed(page, name, step, monkeypatch):
    """Run listener `name` on a typed `step` as Gradio does: (the box's update, the warnings said)."""
    demo, chat, listeners = page
    said = []
    monkeypatch.setattr(gr, "Warning", lambda message, *a, **k: said.append(message))
    fn, state = listeners[name], SessionState(demo)
    state[fn.inputs[0]._id] = chat
    slider = copy.copy(next(b for b in fn.outputs if b.elem_id == "sl-tree-step"))
    slider.maximum = len(chat.trace.trees)  # as the run's streamed updates left it (tree_step_update)
    state[slider._id] = slider
    inputs = [chat, step, None] if name == "show_tree" else [chat, None]
    out = asyncio.run(demo.process_api(fn, inputs, state=state, event_data=gr.EventData(None, step)))
    box = [b.elem_id for b in fn.outputs].index("sl-tree-step")
    return out["data"][box], said


@pytest.mark.parametrize("name", ["show_tree", "typed_step"])
@pytest.mark.parametrize("step", [999, 0, -3, 2.5, 10**12])
def test_a_typed_step_outside_the_run_is_answered_in_a_sentence_and_the_box_put_back(page, name, step, monkeypatch):
    trees = len(page[1].trace.trees)
    assert trees > 2
    box, said = typed(page, name, step, monkeypatch)  # never raises (Gradio's range check answered first)
    assert 1 <= box.get("value", 0) <= trees, box
    assert len(said) == 1 and "is not a step of this run" in said[0] and f"steps 1 to {trees}" in said[0], said


def test_a_typed_step_of_the_run_is_shown_without_a_word(page, monkeypatch):
    box, said = typed(page, "show_tree", 2, monkeypatch)
    assert box == {"__type__": "update"} and said == []


def test_an_emptied_box_waits_while_typed_in_and_is_put_back_when_left(page, monkeypatch):
    assert typed(page, "show_tree", None, monkeypatch) == ({"__type__": "update"}, [])  # the next digit may come
    box, said = typed(page, "typed_step", None, monkeypatch)
    assert box.get("value") == len(page[1].trace.trees) and "An empty step" in said[0], (box, said)
