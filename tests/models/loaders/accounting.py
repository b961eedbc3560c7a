"""Whether a library's loaded module used every checkpoint tensor: plain torch, imported both by
the tests and by the loader scripts that run inside a library's own environment; and the scripts'
one driver (run_cases) and checkpoint reader."""

from __future__ import annotations

import json
from pathlib import Path

import torch


def poison(module: torch.nn.Module) -> None:
    """Fill every floating-point parameter with NaN before a library loads into it: whatever
    still holds NaN afterwards was neither loaded nor shared (left at its initialisation)."""
    with torch.no_grad():
        for p in module.parameters():
            if p.is_floating_point():
                p.fill_(float("nan"))


def left_at_init(module: torch.nn.Module) -> list[str]:
    """Parameters of a poisoned module that still hold NaN."""
    return sorted(n for n, p in module.named_parameters() if p.is_floating_point() and bool(p.isnan().any()))


def unfound(checkpoint: dict[str, torch.Tensor], state: dict[str, torch.Tensor]) -> list[str]:
    """Checkpoint tensors whose values appear nowhere in `state`, neither as a whole tensor nor as
    a block of rows of a fused one (q/k/v, gate/up: at most 8 such blocks): read and thrown away.
    Values are compared exactly after casting the stored tensor to the loaded one's dtype (a
    widening is exact)."""
    return sorted(name for name, t in checkpoint.items() if not any(_within(t, p) for p in state.values()))


def _within(t: torch.Tensor, p: torch.Tensor) -> bool:
    n = t.shape[0] if t.dim() else 0
    if not n or p.dim() != t.dim() or p.shape[1:] != t.shape[1:] or not n <= p.shape[0] <= 8 * n:
        return False
    p, t = p.detach().cpu(), t.to(p.dtype)
    starts = (p[: p.shape[0] - n + 1] == t[0]).reshape(p.shape[0] - n + 1, -1).all(1).nonzero()[:, 0]  # rows like t's first
    return any(torch.equal(p[o:o + n], t) for o in starts.tolist())


def checkpoint_tensors(directory) -> dict[str, torch.Tensor]:
    """Every tensor of the safetensors files in `directory` (a sharded checkpoint's shards together)."""
    from safetensors.torch import load_file

    tensors = {}
    for file in sorted(Path(directory).glob("*.safetensors")):
        tensors.update(load_file(str(file)))
    return tensors


def run_cases(run_case, cases_file: str, out_dir: str) -> None:
    """A loader script's main: run_case(case, out) for each case of the JSON list in `cases_file`,
    each report written to out_dir/<name>.json; an exception is that case's report (a library's
    refusal is a result, not a crash)."""
    out = Path(out_dir)
    for case in json.loads(Path(cases_file).read_text()):
        try:
            report = run_case(case, out)
        except Exception as e:
            report = {"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}
        (out / f"{case['name']}.json").write_text(json.dumps(report))
