"""demo/layers.py StackedLinear: q/k/v and gate/up as one matmul over weights stacked in place."""

import pytest
import torch
from torch import nn

from demo.layers import StackedLinear, linear, stacked
from demo.target import Target
from tests.tiny import tiny_hf


def _linears(bias=False):
    torch.manual_seed(0)
    return nn.Linear(16, 12, bias=bias), nn.Linear(16, 4, bias=bias), nn.Linear(16, 4, bias=bias)


def test_a_stack_computes_what_its_linears_compute_and_stores_no_weight_twice():
    for bias in (False, True):
        mods = _linears(bias)
        x = torch.randn(2, 3, 16)
        want = [m(x) for m in mods]
        stack = stacked(*mods)
        for got, ref in zip(stack(x), want):
            torch.testing.assert_close(got, ref)
        for m in mods:  # each module's weight now lives inside the stack
            assert m.weight.untyped_storage().data_ptr() == stack.weight.untyped_storage().data_ptr()
        assert stacked(*mods) is stack  # made once


def test_a_module_alone_and_in_its_group_keeps_both_stacks():
    mods = _linears()
    group = stacked(*mods)
    alone = stacked(mods[0])
    assert stacked(*mods) is group and stacked(mods[0]) is alone  # neither replaced the other
    assert mods[0].weight.data_ptr() == group.weight.data_ptr()


def test_in_place_weight_updates_reach_the_stack():
    mods = _linears()
    stack = stacked(*mods)
    new = {k: torch.randn_like(v) for k, v in mods[1].state_dict().items()}
    mods[1].load_state_dict(new)
    x = torch.randn(5, 16)
    torch.testing.assert_close(stack(x)[1], x @ new["weight"].T)


def test_a_weight_replaced_after_stacking_is_never_read_stale():
    mods = _linears()
    old = stacked(*mods)
    for m in mods:
        m.to(torch.float64)  # new storage for every parameter
    assert not old.current()
    x = torch.randn(5, 16, dtype=torch.float64)
    got = stacked(*mods)(x)
    assert got[0].dtype == torch.float64
    for g, m in zip(got, mods):
        torch.testing.assert_close(g, m(x))


def test_modules_that_cannot_be_stacked_run_one_by_one():
    class Scaled(nn.Module):  # Linear-like, not an nn.Linear
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.randn(4, 16))

        def forward(self, x):
            return 2 * x @ self.weight.T

    mods = (nn.Linear(16, 4), Scaled())
    stack = StackedLinear(mods)
    x = torch.randn(3, 16)
    assert stack.weight is None and stack.current()
    for g, m in zip(stack(x), mods):
        torch.testing.assert_close(g, m(x))


def test_the_target_forward_is_unchanged_by_stacking_and_by_a_later_dtype_change():
    hf = tiny_hf("llama")
    target = Target(hf)
    tokens = torch.tensor([[1, 5, 9, 2, 7]])
    positions = torch.arange(5).view(1, -1)
    with torch.no_grad():
        ref = hf(tokens).logits
        target.setup_cache(16)
        torch.testing.assert_close(target.forward(tokens, positions).logits, ref, rtol=1e-4, atol=1e-4)
        hf.to(torch.float64)  # every weight moves to new storage after the stacks were made
        target = Target(hf)
        target.setup_cache(16)
        torch.testing.assert_close(target.forward(tokens, positions).logits, hf(tokens).logits, rtol=1e-6, atol=1e-6)


def test_a_compiled_forward_reads_the_stacks_made_before_it():
    from demo.capture import compile_step

    target = Target(tiny_hf("llama"))
    target.setup_cache(16)
    tokens, positions = torch.tensor([[1, 5, 9, 2]]), torch.arange(4).view(1, -1)
    with torch.no_grad():
        want = target.forward(tokens, positions).logits
        target.stack_weights()
        got = compile_step(lambda: target.forward(tokens, positions).logits)()
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


needs_onednn = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="no oneDNN in this torch build")


@needs_onednn
def test_on_a_cpu_any_rows_of_a_wide_weight_go_through_onednn_of_a_narrow_one_through_its_transpose(monkeypatch):
    from demo import layers

    monkeypatch.setattr(layers, "_LAYOUTS", {(20, 16): "transposed"})  # as timed on a CPU where it wins
    calls = []
    real = torch.ops.mkldnn._linear_pointwise
    monkeypatch.setattr(layers.torch.ops.mkldnn, "_linear_pointwise", lambda *a: calls.append(1) or real(*a),
                        raising=False)
    x = torch.randn(1, 4, 16)
    narrow = _linears(bias=True)  # 20 outputs over 16 inputs: the transposed copy
    stack = stacked(*narrow)
    for got, m in zip(stack(x), narrow):
        torch.testing.assert_close(got, m(x), rtol=1e-5, atol=1e-5)
    assert calls == [] and stack._prepacked()[0] == "transposed"
    wide = nn.Linear(16, 16 * layers.TRANSPOSED_MAX_RATIO + 1)
    torch.testing.assert_close(linear(wide, x), wide(x), rtol=1e-5, atol=1e-5)
    assert calls == [1] and stacked(wide)._prepacked()[0] == "onednn"
    one = x[:, 2:3]  # a 1-row step goes through the copies too
    for got, m in zip(stack(one), narrow):
        torch.testing.assert_close(got, m(one), rtol=1e-5, atol=1e-5)
    assert torch.equal(linear(wide, one), linear(wide, x)[:, 2:3])  # oneDNN's rows alike at 1 and 4 rows
    assert calls == [1, 1, 1]


@needs_onednn
@pytest.mark.parametrize("layout", ["transposed", "onednn"])
def test_a_weight_changed_in_place_after_prepacking_is_prepacked_again(layout, monkeypatch):
    from demo import layers

    monkeypatch.setattr(layers, "several_row_layout", lambda w: layout)
    lin = nn.Linear(16, 8)
    x = torch.randn(3, 16)
    linear(lin, x)  # prepacks
    new = {k: torch.randn_like(v) for k, v in lin.state_dict().items()}
    lin.load_state_dict(new)  # in place: the same storage, a new version
    torch.testing.assert_close(linear(lin, x), x @ new["weight"].T + new["bias"], rtol=1e-5, atol=1e-5)


@needs_onednn
@pytest.mark.parametrize("layout", ["transposed", "onednn"])
def test_weights_made_under_inference_mode_are_prepacked_too(layout, monkeypatch):
    # a model built or moved under torch.inference_mode has inference-tensor weights, which keep no
    # version counter: prepacking must not read one (it raised "Inference tensors do not track
    # version counter" on the engine's first multi-row step)
    from demo import layers

    monkeypatch.setattr(layers, "several_row_layout", lambda w: layout)
    with torch.inference_mode():
        lin = nn.Linear(16, 8)
        x = torch.randn(3, 16)
        assert lin.weight.is_inference()
        torch.testing.assert_close(linear(lin, x), x @ lin.weight.T + lin.bias, rtol=1e-5, atol=1e-5)


@needs_onednn
def test_a_narrow_weight_is_prepacked_only_where_onednn_is_timed_quicker_by_the_margin_once_a_shape(monkeypatch):
    from demo import layers

    monkeypatch.setattr(layers, "_LAYOUTS", {})
    timings = iter([0.9, 1.0, 0.5, 1.0])  # (oneDNN, transposed) for one shape, then another
    timed = []
    monkeypatch.setattr(layers, "_seconds", lambda fn: timed.append(1) or next(timings))
    assert layers.several_row_layout(torch.randn(20, 16)) == "transposed"  # 0.9 of the time: not enough
    assert layers.several_row_layout(torch.randn(20, 16)) == "transposed" and len(timed) == 2  # kept
    assert layers.several_row_layout(torch.randn(24, 16)) == "onednn" and len(timed) == 4
    wide = torch.randn(16 * layers.TRANSPOSED_MAX_RATIO + 1, 16)
    assert layers.several_row_layout(wide) == "onednn" and len(timed) == 4  # a wide output is never timed


@needs_onednn
def test_timing_a_weights_layout_leaves_the_global_random_stream_alone(monkeypatch):
    # the probe runs on a process's first forward of a shape; drawing its input from the global
    # stream made the first seeded sampling of a process differ from every later one
    from demo import layers

    monkeypatch.setattr(layers, "_LAYOUTS", {})
    w = torch.randn(20, 16)
    torch.manual_seed(11)
    expected = torch.rand(4)
    torch.manual_seed(11)
    layers.several_row_layout(w)
    assert (20, 16) in layers._LAYOUTS and torch.equal(torch.rand(4), expected)
