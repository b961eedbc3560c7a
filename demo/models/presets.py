"""Named (target, EAGLE drafter, EAGLE-3 drafter) choices offered by the app and the CLI.

A preset is only names: nothing is downloaded or read at import, and a drafter is resolved when a
preset is chosen (``Preset.drafter(method)``, then ``demo.models.checkpoints.load_drafter``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from demo.methods import DRAFT_METHODS
from demo.models.checkpoints import DrafterLoadError

REPO_ROOT = Path(__file__).resolve().parents[2]
# trained by this project for the embedded target, one per drafter method (training/recipe.sh writes them)
BUNDLED_DRAFTERS = {method: f"assets/drafters/smollm2-135m-{method}" for method in DRAFT_METHODS}


@dataclass(frozen=True)
class Preset:
    """A target and the drafters that fit it. Drafters are hub ids (owner/name) or local paths; a
    `Path` is a directory of this repository, a `str` a hub id. None: no public head of that kind."""

    name: str
    target: str  # "default" (the embedded SmolLM2), a hub id or a local directory
    eagle: str | Path | None
    eagle3: str | Path | None
    gpu_gb: float | None = None  # None: runs on a CPU; else it needs a GPU with this many GB (bf16 weights)

    def unavailable(self, device: torch.device) -> str | None:
        """Why this preset cannot run on `device` (a short reason), or None when it can."""
        if self.gpu_gb is None:
            return None
        if device.type != "cuda":
            return f"needs a GPU with {self.gpu_gb:g} GB"
        total = torch.cuda.get_device_properties(device).total_memory / 1e9
        if total < self.gpu_gb:
            return f"needs a GPU with {self.gpu_gb:g} GB; this one has {total:.0f} GB"
        return None

    @property
    def methods(self) -> tuple[str, ...]:
        """The drafting methods this preset has a drafter for."""
        return tuple(m for m in DRAFT_METHODS if getattr(self, m) is not None)

    def drafter(self, method: str) -> str:
        """The spec to hand to load_drafter; a bundled directory must exist by now."""
        if method not in DRAFT_METHODS:
            raise ValueError(f"method must be one of {DRAFT_METHODS}, not {method!r}")
        spec = getattr(self, method)
        if spec is None:
            raise DrafterLoadError(f"preset {self.name!r} has no {method} drafter (it has: {', '.join(self.methods)})")
        if isinstance(spec, Path):
            return str(_existing(spec, method))
        return spec


def bundled_drafter_dir(method: str) -> Path:
    """Where this project's drafter for the embedded target lives; raises when it was not built yet."""
    if method not in BUNDLED_DRAFTERS:
        raise ValueError(f"method must be one of {DRAFT_METHODS}, not {method!r}")
    return _existing(REPO_ROOT / BUNDLED_DRAFTERS[method], method)


def _existing(path: Path, method: str) -> Path:
    if not (path / "config.json").exists():
        raise DrafterLoadError(f"bundled {method} drafter: {path} has no config.json yet (the drafters are trained "
                               f"by this project and saved there); pass --drafter PATH or choose another preset")
    return path


PRESETS: dict[str, Preset] = {p.name: p for p in (
    Preset(
        name="SmolLM2-135M-Instruct (embedded)",
        target="default",
        **{method: REPO_ROOT / path for method, path in BUNDLED_DRAFTERS.items()},
    ),
    Preset(
        name="Llama-3.1-8B-Instruct",
        target="meta-llama/Llama-3.1-8B-Instruct",
        eagle="yuhuili/EAGLE-LLaMA3.1-Instruct-8B",
        eagle3="yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",
        gpu_gb=20,  # 16 GB of bf16 weights, two drafter heads, the KV cache and activations
    ),
    Preset(
        # The pair vLLM tests EAGLE-3 on (tests/v1/e2e/test_spec_decode.py: "Qwen/Qwen3-8B",
        # "AngelSlim/Qwen3-8B_eagle3"); no public EAGLE-1 head exists for Qwen3.
        name="Qwen3-8B",
        target="Qwen/Qwen3-8B",
        eagle=None,
        eagle3="AngelSlim/Qwen3-8B_eagle3",
        gpu_gb=20,  # 16.4 GB of bf16 weights, the drafter head, the KV cache and activations
    ),
)}
DEFAULT_PRESET = "SmolLM2-135M-Instruct (embedded)"


def get_preset(name: str) -> Preset:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r} (choose one of: {', '.join(PRESETS)})") from None
