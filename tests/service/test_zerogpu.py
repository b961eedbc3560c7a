"""ZeroGPU (demo/service/zerogpu.py), with a fake `spaces` package in sys.modules: on ZeroGPU every handler
that runs the models goes through spaces.GPU, keeping the name the hosting limits read, and graph
mode is off with the reason on the page; off ZeroGPU, or without `spaces`, nothing changes."""

from __future__ import annotations

import inspect
import sys
import types

import pytest

from demo.service import zerogpu
from tests.tiny_chat import tiny_session


def fake_spaces(zero_gpu: bool | None) -> types.ModuleType:
    """A `spaces` package whose GPU decorator records each call (and its duration) and runs the function."""
    spaces = types.ModuleType("spaces")
    spaces.calls = []

    def GPU(duration=None):
        def decorate(fn):
            if inspect.isgeneratorfunction(fn):
                def wrapper(*args, **kwargs):
                    spaces.calls.append((fn.__name__, duration))
                    yield from fn(*args, **kwargs)
            else:
                def wrapper(*args, **kwargs):
                    spaces.calls.append((fn.__name__, duration))
                    return fn(*args, **kwargs)
            wrapper.on_gpu = True
            return wrapper
        return decorate

    spaces.GPU = GPU
    if zero_gpu is not None:
        spaces.config = types.SimpleNamespace(Config=types.SimpleNamespace(zero_gpu=zero_gpu))
    return spaces


@pytest.fixture
def zero(monkeypatch):
    spaces = fake_spaces(True)
    monkeypatch.setitem(sys.modules, "spaces", spaces)
    return spaces


def reply(prompt):
    yield f"a reply to {prompt}"


def test_without_spaces_everything_is_a_no_op(monkeypatch):
    monkeypatch.setitem(sys.modules, "spaces", None)  # import spaces raises ImportError
    assert not zerogpu.active() and zerogpu.on_gpu(reply) is reply
    assert tiny_session().cudagraph_unavailable() == "CUDA graphs need a CUDA GPU; this app runs on cpu"


def test_spaces_off_zerogpu_changes_nothing(monkeypatch):
    monkeypatch.setitem(sys.modules, "spaces", fake_spaces(False))  # e.g. a CPU or dedicated-GPU Space
    assert not zerogpu.active() and zerogpu.on_gpu(reply) is reply
    monkeypatch.setitem(sys.modules, "spaces", fake_spaces(None))  # a package with no config: SPACES_ZERO_GPU says
    monkeypatch.delenv("SPACES_ZERO_GPU", raising=False)
    assert not zerogpu.active()
    monkeypatch.setenv("SPACES_ZERO_GPU", "true")
    assert zerogpu.active()


def test_on_zerogpu_a_handler_runs_inside_spaces_gpu_and_keeps_its_name_and_kind(zero):
    wrapped = zerogpu.on_gpu(reply, duration=42)
    assert wrapped is not reply and wrapped.__name__ == "reply" and inspect.isgeneratorfunction(wrapped)
    assert inspect.signature(wrapped) == inspect.signature(reply)
    assert list(wrapped("hi")) == ["a reply to hi"] and zero.calls == [("reply", 42)]


def test_on_zerogpu_graph_mode_is_off_and_the_page_says_why(zero):
    from demo.views import build_demo

    session = tiny_session()
    assert session.cudagraph_unavailable() == zerogpu.GRAPHS_OFF
    demo = build_demo(session)
    mode = next(b for b in demo.blocks.values() if getattr(b, "elem_id", None) == "sl-mode")
    assert not mode.interactive and "attached for each call" in mode.info
    bench_modes = next(b for b in demo.blocks.values() if getattr(b, "elem_id", None) == "sl-bench-modes")
    assert [v for _, v in bench_modes.choices] == ["eager"] and "attached for each call" in bench_modes.info


def test_on_zerogpu_the_generating_handlers_go_through_spaces_gpu_under_their_own_names(zero, monkeypatch):
    from demo.views import build_demo

    demo = build_demo(tiny_session())
    fns = {fn.name: fn.fn for fn in demo.fns.values() if fn.fn is not None}
    on_gpu = {name for name, fn in fns.items() if getattr(fn, "on_gpu", False)}
    assert on_gpu == {"bot", "generate", "run_benchmark"}  # what runs the models; the hosting limits read these names
    monkeypatch.setitem(sys.modules, "spaces", None)
    plain = build_demo(tiny_session())
    assert {fn.name for fn in plain.fns.values()} == {fn.name for fn in demo.fns.values()}
