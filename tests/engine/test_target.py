"""The engine's own forward reproduces transformers' forward."""

import pytest
import torch

from demo.target import Target
from tests.tiny import KINDS, tiny_hf


def _rel_err(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


@pytest.mark.parametrize("kind", list(KINDS))
def test_forward_logits_match_transformers(kind):
    hf = tiny_hf(kind)
    target = Target(hf)
    target.setup_cache(128)
    ids = torch.randint(3, 256, (1, 40), generator=torch.Generator().manual_seed(0))
    pos = torch.arange(40).view(1, -1)
    with torch.no_grad():
        ours = target.forward(ids, pos, aux_layers=(2, 4, 5))
        ref = hf(ids, output_hidden_states=True)
    assert _rel_err(ours.logits, ref.logits) < 1e-5
    # aux id i is the residual stream entering layer i (transformers' hidden_states[i])
    for j, layer in enumerate((2, 4, 5)):
        assert _rel_err(ours.aux[..., j * 64:(j + 1) * 64], ref.hidden_states[layer]) < 1e-5


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
def test_cached_chunks_equal_one_full_forward(kind):
    target = Target(tiny_hf(kind))
    target.setup_cache(64)
    ids = torch.randint(3, 256, (1, 20), generator=torch.Generator().manual_seed(1))
    pos = torch.arange(20).view(1, -1)
    with torch.no_grad():
        full = target.forward(ids, pos).logits
        parts = [target.forward(ids[:, a:b], pos[:, a:b]).logits for a, b in ((0, 7), (7, 8), (8, 20))]
    assert _rel_err(torch.cat(parts, 1), full) < 1e-5


def test_stale_slots_beyond_the_position_are_invisible():
    # write garbage (a "rejected draft") at later slots, then recompute: logits must not change
    target = Target(tiny_hf("llama"))
    target.setup_cache(64)
    ids = torch.randint(3, 256, (1, 12), generator=torch.Generator().manual_seed(2))
    pos = torch.arange(12).view(1, -1)
    with torch.no_grad():
        clean = target.forward(ids, pos).logits
        target.forward(torch.full((1, 5), 7), torch.arange(12, 17).view(1, -1))
        again = target.forward(ids, pos).logits
    assert torch.equal(clean, again)


def test_batched_rows_at_their_own_positions_match_single_rows():
    target = Target(tiny_hf("llama"))
    target.setup_cache(32, batch=2)
    a = torch.randint(3, 256, (1, 9), generator=torch.Generator().manual_seed(3))
    b = torch.randint(3, 256, (1, 9), generator=torch.Generator().manual_seed(4))
    pos = torch.arange(9).view(1, -1)
    with torch.no_grad():
        both = target.forward(torch.cat((a, b)), torch.cat((pos, pos))).logits
        target.setup_cache(32, batch=1)
        single_b = target.forward(b, pos).logits
    assert _rel_err(both[1:], single_b) < 1e-5


def test_default_target_matches_transformers(default_target):
    hf, _ = default_target
    target = Target(hf)
    target.setup_cache(64)
    ids = torch.tensor([[1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308]])
    with torch.no_grad():
        ours = target.forward(ids, torch.arange(12).view(1, -1)).logits
        ref = hf(ids).logits
    assert _rel_err(ours, ref) < 1e-5


def test_compiled_step_rounds_like_eager_in_bf16():
    # the engine compiles step functions with compile_step; in bf16 a plain torch.compile keeps fp32
    # intermediates in fused norms and differs from eager (0.2 in these logits); ours must not
    from demo.capture import compile_step

    target = Target(tiny_hf("llama").to(torch.bfloat16))
    target.setup_cache(32)
    ids = torch.randint(3, 256, (1, 8), generator=torch.Generator().manual_seed(0))
    pos = torch.arange(8).view(1, -1)
    with torch.no_grad():
        eager = target.forward(ids, pos).logits
        compiled = compile_step(lambda: target.forward(ids, pos).logits)()
    assert torch.equal(compiled, eager)
