"""demo.kernels.topk on a GPU: row_topk is torch.topk (values, columns, ties lowest column first) and
its log-probs log_softmax's, eager, compiled and captured; and a vocabulary wider than a top-k slice
(the Triton passes) keeps graph mode and compile lossless.

CUDA only (skipped without a CUDA device); run on a GPU machine: ``python -m pytest -q tests/gpu``.
"""

import pytest
import torch

from demo.config import TreeShape
from demo.engine import Engine
from demo.target import Target
from tests.gpu.helpers import PROMPT, make_drafter, reply_tokens
from tests.tiny import tiny_hf

pytestmark = pytest.mark.cuda


def test_row_topk_is_torch_topk_and_its_log_probs_log_softmax_on_a_gpu_eager_compiled_and_captured():
    from demo.bench.tools.timing import capture_alone
    from demo.capture import compile_step
    from demo.kernels.topk import row_topk
    x = torch.randn(65, 49152 + 77, device="cuda")
    x[3] = 1.0  # all equal: the lowest columns first
    rows = [r for r in range(65) if r != 3]
    for dtype in (torch.float32, torch.bfloat16):
        for k in (1, 5, 8, 20):
            y = x.to(dtype)
            values, indices = row_topk(y, k)
            expected = y.topk(k, dim=-1)
            assert values.dtype == dtype and torch.equal(values, expected.values)
            assert torch.equal(y.gather(1, indices), values)
            assert all(len(set(row)) == k for row in indices.tolist())
            tied = values[:, 1:] == values[:, :-1]  # equal entries: lowest column first
            assert bool((indices[:, 1:] > indices[:, :-1])[tied].all())
            if dtype == torch.float32:  # no ties in a random row: torch.topk's columns too
                assert torch.equal(indices[rows], expected.indices[rows])
            assert indices[3].tolist() == list(range(k))
            logq, at = row_topk(y, k, log_probs=True)  # the log-softmax of the same picks
            assert torch.equal(at, indices) and logq.dtype == torch.float32
            torch.testing.assert_close(logq, torch.log_softmax(y.float(), dim=-1).gather(1, at), atol=1e-5, rtol=1e-5)
    out = torch.zeros(65, 8, dtype=torch.int64, device="cuda")
    logq = torch.zeros(65, 8, device="cuda")
    graph = capture_alone(compile_step(lambda: (out.copy_(row_topk(x, 8)[1]), logq.copy_(row_topk(x, 8, True)[0]))))
    x.copy_(torch.randn_like(x))
    graph.replay()
    assert torch.equal(out, x.topk(8, dim=-1).indices)
    torch.testing.assert_close(logq, torch.log_softmax(x, dim=-1).topk(8, dim=-1).values, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("tree", [None, TreeShape(3, 10)], ids=["chain", "tree"])
def test_a_vocabulary_wider_than_a_topk_slice_keeps_graph_mode_and_compile_lossless(tree):
    # 5,000 tokens: the tree's children and every step's top candidates take demo.kernels.topk's Triton passes
    hf = tiny_hf("llama", vocab_size=5000).to("cuda")
    target = Target(hf)
    ref = reply_tokens(Engine(target, None, max_context=128), PROMPT, max_new_tokens=32, stop_token_ids=())
    drafter = make_drafter("oracle", target, PROMPT + ref)
    for mode, scope in (("eager", False), ("cudagraph", False), ("cudagraph", "all")):
        engine = Engine(target, drafter, mode=mode, compile=scope, max_context=128)
        assert reply_tokens(engine, PROMPT, max_new_tokens=32, num_spec_tokens=3, tree=tree, stop_token_ids=()) == ref
