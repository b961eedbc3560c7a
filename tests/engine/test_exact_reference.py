"""bf16 decoding is exact against target-only run at the verification's width (demo.engine
target_only_width): a row is computed the same whatever its index and the other rows, not whatever
the row count, so a 1-row target-only step and a (k+1)-row verification round differently and flip
greedy near-ties. At the same width every token of a chain is computed as target-only computes it.
On this CPU, tiny random targets in bf16 (many near-ties) gave the 1-row reference's tokens on 9 of
12 prompts and the padded reference's on 12 of 12."""

import pytest
import torch

from demo.config import DraftShape, GenerationConfig, TreeShape
from demo.engine import Engine, target_only_width
from demo.target import Target
from tests.tiny import hf_greedy, tiny_drafter, tiny_hf

PROMPTS = [torch.randint(3, 200, (9,), generator=torch.Generator().manual_seed(seed)).tolist() for seed in range(12)]


def _run(engine, prompt, k, width=1, max_new_tokens=64):
    gen = GenerationConfig(max_new_tokens=max_new_tokens, num_spec_tokens=k, stop_token_ids=(),
                           target_only_width=width)
    return list(engine.generate(prompt, gen))


def _tokens(events):
    return [t for e in events for t in e.token_ids]


@pytest.mark.parametrize("k", [3, 5])
def test_in_bf16_a_chain_gives_the_tokens_of_target_only_run_at_its_width(k):
    target = Target(tiny_hf("llama").to(torch.bfloat16))
    engine = Engine(target, tiny_drafter("eagle3", target), max_context=256)
    width = target_only_width(GenerationConfig(num_spec_tokens=k).draft_shape(k), target.dtype)
    assert width == k + 1
    for prompt in PROMPTS:
        assert _tokens(_run(engine, prompt, k)) == _tokens(_run(engine, prompt, 0, width)), prompt


def test_a_padded_target_only_step_emits_one_token_from_its_first_row_and_stays_lossless():
    hf = tiny_hf("llama")
    target = Target(hf)
    prompt = PROMPTS[0]
    ref = hf_greedy(hf, prompt, 40)
    engine = Engine(target, None, max_context=256)  # the padding rows are never read as drafts
    events = _run(engine, prompt, 0, width=8, max_new_tokens=40)
    assert _tokens(events) == ref
    assert all(len(e.token_ids) == 1 and e.num_accepted == 0 and e.draft_ids == [] for e in events)
    padded = GenerationConfig(num_spec_tokens=0, target_only_width=8).draft_shape(0)
    assert engine.prepare(padded).verify_tokens.shape == (1, 8)


def test_fp32_needs_no_padding_and_only_target_only_is_padded():
    assert target_only_width(DraftShape.of(7, None), torch.float32) == 1
    assert target_only_width(DraftShape.of(7, None), torch.bfloat16) == 8
    assert target_only_width(DraftShape.of(4, TreeShape(4, 20)), torch.float16) == 20
    # a target that computes every row alike at any width (the fused kernels on a GPU) needs none
    assert target_only_width(DraftShape.of(4, TreeShape(4, 20)), torch.bfloat16, rows_alike=True) == 1
    assert DraftShape.of(0, None, width=8).width == 8
    with pytest.raises(ValueError, match="only target-only steps are padded"):
        DraftShape(3, 1, 3, pad=2).check()
    with pytest.raises(ValueError, match="at least 1 row wide"):
        GenerationConfig(num_spec_tokens=0, target_only_width=0).draft_shape(0).check()
