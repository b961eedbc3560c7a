"""Graph mode changes nothing but time (CUDA only; run on a GPU machine:
``python -m pytest -q tests/test_cuda.py``)."""

import pytest
import torch

from demo.engine import Engine, GenerationConfig
from demo.target import Target
from tests.tiny import corrupted_oracle, tiny_drafter, tiny_hf

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

PROMPT = [1, 17, 99, 4, 250, 31, 8]


def _tokens(engine, prompt, **gen):
    return [t for e in engine.generate(prompt, GenerationConfig(**gen)) for t in e.token_ids]


def _drafter(method, target, table):
    if method == "oracle":
        return corrupted_oracle(table, target, every=5)
    return None if method == "none" else tiny_drafter(method, target, draft_vocab_size=128 if method == "eagle3" else 0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("method", ["none", "eagle", "eagle3", "oracle"])
@pytest.mark.parametrize("k", [1, 4])
def test_cudagraph_output_is_token_identical_to_eager(method, k, dtype):
    hf = tiny_hf("llama").to("cuda", dtype)
    target = Target(hf)
    ref = _tokens(Engine(target, None, max_context=256), PROMPT, max_new_tokens=48, stop_token_ids=())
    outs = {}
    for mode in ("eager", "cudagraph"):
        engine = Engine(target, _drafter(method, target, PROMPT + ref), mode=mode, max_context=256)
        outs[mode] = _tokens(engine, PROMPT, max_new_tokens=48, num_spec_tokens=k, stop_token_ids=())
        outs[mode + "-sampled"] = _tokens(engine, PROMPT, max_new_tokens=48, num_spec_tokens=k,
                                          temperature=0.9, top_p=0.95, seed=3, stop_token_ids=())
    assert outs["cudagraph"] == outs["eager"]
    assert outs["cudagraph-sampled"] == outs["eager-sampled"]
    if dtype == torch.float32:
        assert outs["eager"] == ref  # and both are lossless


def test_every_step_function_is_captured_before_generation():
    # vLLM #17504: an EAGLE-3 head left out of capture silently lowered acceptance
    target = Target(tiny_hf("llama").to("cuda"))
    engine = Engine(target, tiny_drafter("eagle3", target), mode="cudagraph", max_context=128)
    buffers = engine.prepare(3)
    assert set(buffers.graphs) == {"verify", "catch_up", "chain"}
    events = list(engine.generate(PROMPT, GenerationConfig(max_new_tokens=20, num_spec_tokens=3, stop_token_ids=())))
    steps = len(events) - 1
    replays = {name: step.replays for name, step in buffers.graphs.items()}
    assert replays == {"verify": steps, "chain": steps, "catch_up": steps - 1}


def test_compiled_graphs_match_eager_on_an_oracle_drafter():
    hf = tiny_hf("llama").to("cuda")
    target = Target(hf)
    ref = _tokens(Engine(target, None, max_context=128), PROMPT, max_new_tokens=32, stop_token_ids=())
    engine = Engine(target, _drafter("oracle", target, PROMPT + ref), mode="cudagraph", compile=True,
                    max_context=128)
    assert _tokens(engine, PROMPT, max_new_tokens=32, num_spec_tokens=3, stop_token_ids=()) == ref
