"""demo.topk: torch.topk's answer in fewer launches (exact, whatever the row width). A GPU takes the
slices; the test runs them on the CPU."""

import pytest
import torch

from demo.topk import CHUNK, chunked_topk, row_topk


@pytest.mark.parametrize("width", [7, 2 * CHUNK, 2 * CHUNK + 1, 48 * CHUNK, 49152 + 77])
@pytest.mark.parametrize("k", [1, 8, 20])
@pytest.mark.parametrize("topk", [row_topk, chunked_topk])
def test_row_topk_gives_each_rows_k_largest_entries_largest_first(topk, width, k):
    if k > width or (topk is chunked_topk and width <= 2 * CHUNK):
        pytest.skip("fewer entries than k, or a row too narrow to slice")
    g = torch.Generator().manual_seed(width * 31 + k)
    x = torch.randn(5, width, generator=g)
    x[1, -3:] = 50.0 + torch.arange(3.0)  # the row's largest sit in its last, padded slice
    x[2, :] = float("-inf")
    x[2, 100 % width] = 0.0  # one finite entry: the rest are -inf, as padding is
    values, indices = topk(x, k)
    expected = x.topk(k, dim=-1)
    assert values.shape == indices.shape == (5, k)
    assert torch.equal(values, expected.values)
    assert torch.equal(x.gather(1, indices), values)  # indices point at their values
    assert bool((indices < width).all())
    distinct = [0, 1, 3, 4]  # random rows: no ties, so the indices are torch.topk's too
    assert torch.equal(indices[distinct], expected.indices[distinct])
    assert len(set(indices[0].tolist())) == k
