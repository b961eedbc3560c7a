"""demo.kernels.topk: each row's k largest entries in two Triton passes. The kernel runs here under
Triton's interpreter (numpy on the CPU, in a process started with TRITON_INTERPRET=1: Triton
reads it when it is imported); tests/gpu/test_topk_gpu.py runs it compiled and captured on a GPU."""


import pytest
import torch

from demo.kernels.topk import BLOCK, row_topk
from tests.interpreted import run_interpreted

pytest.importorskip("triton")
WIDTHS = (64, BLOCK, BLOCK + 1, 3 * BLOCK, 49152 + 77)


def check_two_passes(width: int, k: int) -> None:
    """The two passes give torch.topk's values, at distinct columns that hold them; equal entries
    lowest column first. Runs the kernel as `demo.kernels.topk._slice_topk` is (interpreted here)."""
    from demo.kernels import topk as topk_module

    g = torch.Generator().manual_seed(width * 31 + k)
    x = torch.randn(5, width, generator=g)
    x[1, -3:] = 50.0 + torch.arange(3.0)  # the row's largest sit in its last, partial slice
    x[2, :] = float("-inf")
    x[2, [5, width - 1]] = 0.0  # two finite entries, the rest -inf
    x[3, :] = 1.0  # all equal: the lowest columns first
    values, indices = topk_module.two_pass_topk(x, k, topk_module._slice_topk)
    expected = x.topk(k, dim=-1)
    assert values.shape == indices.shape == (5, k) and indices.dtype == torch.int64
    assert torch.equal(values, expected.values)
    assert torch.equal(x.gather(1, indices), values)  # each index points at its value
    assert all(len(set(row)) == k for row in indices.tolist())  # k distinct columns a row
    assert bool((indices < width).all())
    assert torch.equal(indices[[0, 1, 4]], expected.indices[[0, 1, 4]])  # random rows: no ties
    assert indices[3].tolist() == list(range(k))
    x[4, 7:] = float("nan")  # NaN ranks with -inf: the picks stay columns of the row
    values, indices = topk_module.two_pass_topk(x, k, topk_module._slice_topk)
    assert bool((indices[4] < width).all()) and bool((values[4, : min(k, 7)] > float("-inf")).all())


def test_two_passes_give_each_rows_k_largest_entries_largest_first():
    cases = [(w, k) for w in WIDTHS for k in (1, 8, 20)]  # 64 and BLOCK wide: one pass
    code = ("from tests.kernels.test_topk import check_two_passes\n"
            f"for w, k in {cases!r}:\n    check_two_passes(w, k)\nprint('checked', {len(cases)})")
    run_interpreted(code, expect=f"checked {len(cases)}", timeout=600)


def test_on_a_cpu_row_topk_is_torch_topk():
    x = torch.randn(3, 3 * BLOCK)
    values, indices = row_topk(x, 8)
    expected = x.topk(8, dim=-1)
    assert torch.equal(values, expected.values) and torch.equal(indices, expected.indices)


def check_log_probs(width: int, k: int) -> None:
    """log_probs: the k largest entries' log-softmax over the row (the slices' max and sum of
    exponentials weighed together in the second pass), at the columns the plain passes pick."""
    from demo.kernels import topk as topk_module

    g = torch.Generator().manual_seed(width + k)
    x = 4 * torch.randn(4, width, generator=g)
    x[1, -3:] = 60.0 + torch.arange(3.0)  # the row's mass in its last, partial slice
    x[2, :] = float("-inf")
    x[2, [5, width - 1]] = 0.0  # two finite entries: log(1/2) each
    values, indices = topk_module.two_pass_topk(x, k, topk_module._slice_topk, log_probs=True)
    plain = topk_module.two_pass_topk(x, k, topk_module._slice_topk)
    assert torch.equal(indices, plain[1])
    expected = torch.log_softmax(x, dim=-1).gather(1, indices)
    torch.testing.assert_close(values, expected, atol=1e-5, rtol=1e-5)
    assert torch.allclose(values[2, :2], torch.tensor(0.5).log().expand(2))


def test_log_probs_are_the_k_largest_entries_log_softmax_in_one_or_two_passes():
    cases = [(w, k) for w in (64, BLOCK, 3 * BLOCK + 5) for k in (1, 8)]
    code = ("from tests.kernels.test_topk import check_log_probs\n"
            f"for w, k in {cases!r}:\n    check_log_probs(w, k)\nprint('checked', {len(cases)})")
    run_interpreted(code, expect=f"checked {len(cases)}", timeout=600)


def test_on_a_cpu_log_probs_are_log_softmax_of_the_k_largest():
    x = torch.randn(3, 3 * BLOCK)
    values, indices = row_topk(x, 8, log_probs=True)
    assert torch.equal(indices, x.topk(8, dim=-1).indices)
    torch.testing.assert_close(values, torch.log_softmax(x, dim=-1).gather(1, indices))
