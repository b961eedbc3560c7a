"""demo.fused: a decoder layer's projections as fused kernels, each row computed alike whatever the
width. The kernels run here under Triton's interpreter, in fp32 (numpy on the CPU, in a process
started with TRITON_INTERPRET=1); tests/test_cuda.py runs them in bf16, compiled and captured."""

import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")


def _run_interpreted(code: str) -> None:
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.getcwd())
    out = subprocess.run([sys.executable, "-c", code + "\nprint('checked')"], env=env, capture_output=True,
                         text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "checked" in out.stdout


def check_ops() -> None:
    """Each op gives the eager layer's pieces (demo.layers), and each row the same bits alone as
    beside 12 others."""
    from demo import fused
    from demo.layers import rms_norm

    g = torch.Generator().manual_seed(0)
    for R, K, N in ((3, 64, 96), (13, 100, 40), (1, 576, 200)):
        x = torch.randn(R, K, generator=g)
        norm = SimpleNamespace(weight=1 + 0.1 * torch.randn(K, generator=g), variance_epsilon=1e-5)
        w = torch.randn(N, K, generator=g) / K ** 0.5
        bias = torch.randn(N, generator=g)
        gate_up = torch.randn(2 * N, K, generator=g) / K ** 0.5
        residual = torch.randn(R, N, generator=g)
        normed = rms_norm(x, norm.weight, 1e-5)
        ops = {
            "norm_linear": (lambda x, res: fused.norm_linear(x, norm, w, bias), lambda: F.linear(normed, w, bias)),
            "norm_gated": (lambda x, res: fused.norm_gated(x, norm, gate_up),
                           lambda: F.silu(F.linear(normed, gate_up[:N])) * F.linear(normed, gate_up[N:])),
            "linear_residual": (lambda x, res: fused.linear_residual(x, w, res), lambda: residual + F.linear(x, w)),
        }
        for name, (op, reference) in ops.items():
            together = op(x, residual)
            torch.testing.assert_close(together, reference(), atol=1e-5, rtol=1e-5, msg=name)
            for row in {0, R // 2, R - 1}:
                alone = op(x[row:row + 1], residual[row:row + 1])
                assert torch.equal(alone[0], together[row]), (name, R, row)


def check_generations() -> None:
    """Whole generations through the fused layers (and the fused head) give transformers' greedy
    tokens: target-only, a chain and a tree on Llama; target-only on Qwen2 (q/k/v biases) and Qwen3
    (q/k norms)."""
    from demo import fused
    from demo.engine import Engine
    from demo.kernels import set_kernels
    from demo.target import Target
    from demo.tree import TreeShape
    from tests.tiny import hf_greedy, run, tiny_drafter, tiny_hf

    calls = []
    original = fused.norm_linear
    fused.norm_linear = lambda *a: calls.append(1) or original(*a)
    import demo.target
    demo.target.norm_linear = fused.norm_linear
    prompt = [1, 17, 99, 4, 250, 31, 8]
    set_kernels("fused")
    runs = (("none", 0, None), ("eagle", 3, None), ("eagle3", 3, TreeShape(3, 8)))
    for kind in ("llama", "qwen2", "qwen3"):  # four layers: the interpreter is slow
        hf = tiny_hf(kind, num_hidden_layers=4)
        ref = hf_greedy(hf, prompt, 12)
        target = Target(hf)
        for method, k, tree in runs if kind == "llama" else runs[:1]:
            drafter = tiny_drafter(method, target) if method != "none" else None
            engine = Engine(target, drafter, max_context=64)
            before = len(calls)
            tokens, _ = run(engine, prompt, max_new_tokens=12, num_spec_tokens=k, tree=tree, stop_token_ids=())
            assert tokens == ref, (kind, method)
            assert len(calls) > before  # the fused layers ran


def test_fused_ops_match_the_eager_layer_and_compute_each_row_alone():
    _run_interpreted("from tests.test_fused import check_ops\ncheck_ops()")


def test_generations_through_the_fused_layers_keep_target_greedy_tokens():
    _run_interpreted("from tests.test_fused import check_generations\ncheck_generations()")


def test_on_a_cpu_the_fused_layers_never_run():
    from demo.fused import fused_runs
    from demo.kernels import DEFAULT_KERNELS, set_kernels

    try:
        set_kernels("fused")
        assert not fused_runs(torch.zeros(1, 2, 64), F.silu)  # a CPU tensor, no interpreter
    finally:
        set_kernels(DEFAULT_KERNELS)
