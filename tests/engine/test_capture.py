"""demo.capture.CapturedStep without a GPU: torch.cuda's stream and graph calls stood in for, so what is
checked is the order of its runs and the garbage collector's state in each."""

import contextlib
import gc

import pytest
import torch

from demo.capture import CapturedStep


@pytest.fixture
def stand_in_cuda(monkeypatch):
    """torch.cuda's streams and graphs as no-ops; yields the list of runs marked "capture" or "warm-up"."""
    phase = []

    class Stream:
        def wait_stream(self, other):
            pass

    @contextlib.contextmanager
    def graph(g, pool=None):
        phase.append("capture")
        yield
        phase.append("captured")

    monkeypatch.setattr(torch.cuda, "Stream", Stream)
    monkeypatch.setattr(torch.cuda, "current_stream", Stream)
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "CUDAGraph", lambda: object())
    monkeypatch.setattr(torch.cuda, "graph", graph)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    return phase


def test_no_garbage_is_collected_during_a_capture_and_the_collector_is_left_as_found(stand_in_cuda):
    # a collection mid-capture would free an earlier engine's graphs and pinned buffers, CUDA calls a
    # capture forbids; warm-ups may collect
    runs = []

    def step():
        runs.append((stand_in_cuda[-1] if stand_in_cuda else "warm-up", gc.isenabled()))
        return len(runs)

    assert gc.isenabled()
    captured = CapturedStep(step, pool=None)
    assert runs == [("warm-up", True), ("warm-up", True), ("capture", False)]
    assert gc.isenabled() and captured.output == 3 and stand_in_cuda == ["capture", "captured"]

    gc.disable()
    try:
        CapturedStep(step, pool=None)
        assert not gc.isenabled()  # a caller's choice kept
    finally:
        gc.enable()


def test_a_failed_capture_turns_the_collector_back_on(stand_in_cuda):
    calls = []

    def step():
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("capture failed")

    with pytest.raises(RuntimeError, match="capture failed"):
        CapturedStep(step, pool=None)
    assert gc.isenabled()
