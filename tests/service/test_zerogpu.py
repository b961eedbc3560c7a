"""ZeroGPU (demo/service/zerogpu.py), with a fake `spaces` package in sys.modules: on ZeroGPU every handler
that runs the models goes through spaces.GPU, keeping the name the hosting limits read; graph mode
is offered (eager first), each call releasing every engine's buffers and graphs as it begins and
ends, so a request captures its own; off ZeroGPU, or without `spaces`, nothing changes.
tests/gpu/test_zerogpu_gpu.py runs the lifecycle on a GPU."""

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


def test_on_zerogpu_graph_mode_is_offered_where_the_models_are_on_a_gpu_and_eager_comes_first(zero, monkeypatch):
    import torch

    from demo.service.session import Session

    session = tiny_session()
    assert "CUDA graphs need a CUDA GPU" in session.cudagraph_unavailable()  # a CPU's models: still refused
    monkeypatch.setattr(Session, "device", property(lambda self: torch.device("cuda")))
    assert session.cudagraph_unavailable() is None and session.default_mode() == "eager"
    assert "captures the CUDA graphs it needs" in zerogpu.GRAPHS_PER_CALL
    monkeypatch.setitem(sys.modules, "spaces", None)  # a dedicated GPU keeps its graphs: graph mode first
    assert session.default_mode() == "cudagraph"


class Holder:
    """Something holding one call's graphs: counts its releases."""

    def __init__(self):
        self.released = 0

    def release_graphs(self):
        self.released += 1


@pytest.mark.parametrize("kind", ["generator", "function"])
def test_each_zerogpu_call_releases_every_holders_graphs_as_it_begins_and_as_it_ends(zero, kind):
    holder = Holder()
    zerogpu.per_call(holder)
    seen = []

    def steps(n):
        seen.append(holder.released)
        yield from range(n)

    def call(n):
        seen.append(holder.released)
        return n

    wrapped = zerogpu.on_gpu(steps if kind == "generator" else call)
    if kind == "generator":
        assert list(wrapped(3)) == [0, 1, 2]
        assert seen == [1] and holder.released == 2  # before its first step, and after its last
        stopped = wrapped(5)
        next(stopped)
        stopped.close()  # a reply stopped midway (Stop, a closed tab) gives its graphs back too
        assert holder.released == 4
    else:
        assert wrapped(7) == 7 and seen == [1] and holder.released == 2


def test_on_zerogpu_every_engine_the_models_make_is_released_per_call_and_captures_anew(zero):
    from demo.service.request import Request

    session = tiny_session()
    request = Request.of("hi", method="eagle3", max_new_tokens=8)
    first = [p.token_id for p in list(session.generate(request))[-1].chat.turns[-1].pieces]
    engine = session.engine("eagle3", "eager")
    assert engine in set(zerogpu._PER_CALL) and engine._buffers  # a shape's buffers, made in the call
    zerogpu.release_graphs()
    assert not engine._buffers
    again = [p.token_id for p in list(session.generate(request))[-1].chat.turns[-1].pieces]
    assert again == first  # allocated anew, the same reply


def test_on_zerogpu_the_generating_handlers_go_through_spaces_gpu_under_their_own_names(zero, monkeypatch):
    from demo.views import build_demo

    demo = build_demo(tiny_session())
    fns = {fn.name: fn.fn for fn in demo.fns.values() if fn.fn is not None}
    on_gpu = {name for name, fn in fns.items() if getattr(fn, "on_gpu", False)}
    assert on_gpu == {"bot", "generate", "run_benchmark"}  # what runs the models; the hosting limits read these names
    monkeypatch.setitem(sys.modules, "spaces", None)
    plain = build_demo(tiny_session())
    assert {fn.name for fn in plain.fns.values()} == {fn.name for fn in demo.fns.values()}
