"""Write a drafter checkpoint in the form one engine loads, for what one checkpoint cannot give both.

    python -m demo.export_drafter --engine sglang assets/drafters/smollm2-135m-eagle OUT
    python -m demo.export_drafter --engine vllm IN OUT

``save_drafter`` writes what vLLM (>= 0.11) and SGLang (>= 0.5.2) both read; an export differs from
it only where they cannot agree (tests/models/test_interop.py re-implements how each engine reads these):

- EAGLE-1 ``fc.bias``. SGLang's EAGLE-1 fc always has a bias (sglang llama_eagle.py,
  ``LlamaForCausalLMEagle``: ``nn.Linear(2H, H)``), left at its random initialisation when the
  checkpoint has none: ``--engine sglang`` adds a zero one, which computes what the head computes
  without. vLLM's has none (vllm llama_eagle.py: ``bias=False``) and fails on one (a KeyError in
  ``load_weights``): ``--engine vllm`` drops a zero ``fc.bias`` and refuses any other.
- EAGLE-3 aux layer ids, written only when not the target default: each engine reads its own field
  in its own convention (demo/models/checkpoints.py AUX_ID_FIELDS); each export keeps the field its engine
  reads. SGLang has no id for the embedding output (layer 0): refused for ``--engine sglang``.
- ``norm_before_residual`` (speculators' variant): SGLang computes no such head; refused for
  ``--engine sglang``.

IN is any layout SpecLens reads (a local directory); OUT gets config.json, the weights under
SpecLens' names (sharded as save_drafter shards them) and IN's hot_tokens.json if it has one.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import torch

from demo.models.checkpoints import HOT_TOKENS_FILE, DrafterLoadError, config_json, read_drafter, write_weights

ENGINES = ("vllm", "sglang")


class ExportError(ValueError):
    """A checkpoint that the asked-for engine cannot run as it is; the message says why."""


def export_drafter(src: str | Path, out: str | Path, engine: str, max_shard_bytes: int = 9_500_000) -> list[str]:
    """Write the drafter in `src` to `out` in the form `engine` loads; returns what the export
    changed against save_drafter's form, one line each (empty: the saved form is that engine's)."""
    if engine not in ENGINES:
        raise ExportError(f"--engine: {engine!r}, not one of {', '.join(ENGINES)}")
    src, out = Path(src), Path(out)
    if out.exists() and out.resolve() == src.resolve():
        raise ExportError(f"OUT: {str(out)!r} is IN; write the export to another directory")
    cfg, state = read_drafter(src)
    dtype = next(t.dtype for t in state.values() if t.is_floating_point())
    config = config_json(cfg, dtype)
    notes = (for_sglang if engine == "sglang" else for_vllm)(cfg, config, state)
    write_weights(state, out, max_shard_bytes)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    if (src / HOT_TOKENS_FILE).exists():
        shutil.copyfile(src / HOT_TOKENS_FILE, out / HOT_TOKENS_FILE)
    return notes


def for_sglang(cfg, config: dict, state: dict[str, torch.Tensor]) -> list[str]:
    """Edit `config` and `state` in place into the form SGLang >= 0.5.2 loads."""
    notes = []
    if cfg.method == "eagle" and "fc.bias" not in state:
        w = state["fc.weight"]  # [H, 2H]
        state["fc.bias"] = torch.zeros(w.shape[0], dtype=w.dtype)
        notes.append(f"added fc.bias, zeros [{w.shape[0]}] (SGLang's EAGLE-1 fc has a bias it would leave random)")
    if cfg.method == "eagle3":
        if cfg.norm_before_residual:
            raise ExportError("norm_before_residual: true; SGLang's EAGLE-3 head (llama_eagle3.py) has no such "
                              "variant, it would run this head wrong")
        if cfg.aux_layer_ids is not None and "eagle_config" not in config:
            raise ExportError(f"aux layers {list(cfg.aux_layer_ids)}: SGLang adds 1 to every id it reads, so the "
                              f"embedding output (layer 0) has no SGLang id")
        if config.pop("eagle_aux_hidden_state_layer_ids", None) is not None:
            notes.append("aux layer ids only in eagle_config, as outputs of layers (SGLang's convention)")
    return notes


def for_vllm(cfg, config: dict, state: dict[str, torch.Tensor]) -> list[str]:
    """Edit `config` and `state` in place into the form vLLM >= 0.11 loads."""
    notes = []
    if cfg.method == "eagle" and "fc.bias" in state:
        if bool(state["fc.bias"].ne(0).any()):
            raise ExportError("fc.bias: nonzero, and vLLM's EAGLE-1 fc has no bias (llama_eagle.py, bias=False); "
                              "this head cannot run in vLLM without changing what it computes")
        del state["fc.bias"]
        notes.append("dropped fc.bias (zeros; vLLM's EAGLE-1 fc has none and refuses one)")
    if cfg.method == "eagle3" and config.pop("eagle_config", None) is not None:
        notes.append("aux layer ids only at the top level, as the streams entering layers (vLLM's convention)")
    return notes


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m demo.export_drafter", description=__doc__.split("\n\n")[0])
    p.add_argument("--engine", required=True, choices=ENGINES, help="the engine that will load OUT")
    p.add_argument("src", metavar="IN", help="a drafter directory SpecLens reads")
    p.add_argument("out", metavar="OUT", help="the directory to write (its weight files are replaced)")
    p.add_argument("--max-shard-bytes", type=int, default=9_500_000, help="largest weight file (default 9.5 MB)")
    args = p.parse_args(argv)
    try:
        notes = export_drafter(args.src, args.out, args.engine, args.max_shard_bytes)
    except (DrafterLoadError, ExportError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"wrote {args.out} for {args.engine}" + "".join(f"\n  {n}" for n in notes))
    return 0
