"""Write a drafter checkpoint in the form one library loads as it is.

    python -m demo.export_drafter --engine vllm|sglang IN OUT          # serving
    python -m demo.export_drafter --engine specforge IN OUT            # SpecForge's warm start (training on)
    python -m demo.export_drafter --engine speculators IN OUT          # speculators' `convert` (then vLLM)

``save_drafter`` writes what vLLM (>= 0.11) and SGLang (>= 0.5.2) both read; an export differs from
it only where a library reads the checkpoint otherwise (tests/models/test_interop.py replays the
engines' rules; tests/models/test_exports.py runs each library's own loader where it installs):

- EAGLE-1 ``fc.bias``. SGLang's EAGLE-1 fc always has a bias (llama_eagle.py ``nn.Linear(2H, H)``),
  left at its random initialisation when the checkpoint has none; ``save_drafter`` therefore writes
  a zero one. vLLM's fc has none: vLLM >= 0.25 drops an unexpected ``.bias`` without a word
  (AutoWeightsLoader.load_weights ignores the suffix ``.bias``), which is harmless only for a zero
  one; vLLM <= 0.24 fails on it (KeyError in ``LlamaModel.load_weights``). ``--engine vllm`` drops a
  zero ``fc.bias`` and refuses any other. vLLM never reads an EAGLE-3 ``t2d`` (d2t says the same):
  dropped too.
- vLLM builds an EAGLE-1 head only when told (``"method": "eagle"`` in ``--speculative-config``) or
  when its path holds "eagle-" (config/speculative.py: anything else is a plain draft model); no
  config.json field says it, so ``--engine vllm`` says so when OUT's path does not.
- EAGLE-3 aux layer ids, written only when not the target default: each library reads its own field
  in its own convention (demo/models/checkpoints.py AUX_ID_FIELDS). SGLang and SpecForge (its
  convention) have no id for the embedding output (layer 0): refused there.
- ``norm_before_residual`` (speculators' variant): SGLang and SpecForge compute no such head; refused.
- SpecForge (its warm start, training/model_loading.py) needs an explicit ``draft_vocab_size``,
  ``lm_head.weight``, ``t2d`` and ``d2t``: a head drafting through the target's lm_head gets the
  target's head, ``t2d`` all true and ``d2t`` zeros (the identity), which compute what it computes.
- speculators' ``convert`` (convert/utils.py, eagle3_converter.py) reads one ``model.safetensors``
  (it refuses shards) and ``draft_vocab_size`` (absent: 32000), and builds an ``lm_head`` that stays
  random without one: it gets one file, the explicit size and the target's head; aux ids and
  ``norm_before_residual`` travel on its command line, which the notes print.

IN is any layout SpecLens reads (a local directory); OUT gets config.json, the weights (sharded as
save_drafter shards them for vLLM and SGLang, in one file for SpecForge and speculators) and IN's
hot_tokens.json if it has one. The target's lm_head is read only where an export needs it.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Callable

import torch

from demo.models.checkpoints import (HOT_TOKENS_FILE, DrafterLoadError, config_json, read_drafter, write_weights,
                                     zero_fc_bias)

ENGINES = ("vllm", "sglang", "specforge", "speculators")
SINGLE_FILE = 1 << 62  # max_shard_bytes that keeps every tensor in one model.safetensors


class ExportError(ValueError):
    """A checkpoint that the asked-for library cannot run as it is; the message says why."""


def export_drafter(src: str | Path, out: str | Path, engine: str, max_shard_bytes: int = 9_500_000,
                   target_head: Callable[[], torch.Tensor] | None = None) -> list[str]:
    """Write the drafter in `src` to `out` in the form `engine` loads; returns what the export
    changed against save_drafter's form, one line each (empty: the saved form is that library's).
    target_head() gives the target's lm_head weight [V, H], called only when the export needs it."""
    if engine not in ENGINES:
        raise ExportError(f"--engine: {engine!r}, not one of {', '.join(ENGINES)}")
    src, out = Path(src), Path(out)
    if out.exists() and out.resolve() == src.resolve():
        raise ExportError(f"OUT: {str(out)!r} is IN; write the export to another directory")
    cfg, state = read_drafter(src)
    dtype = next(t.dtype for t in state.values() if t.is_floating_point())
    config = config_json(cfg, dtype)
    edit = {"vllm": for_vllm, "sglang": for_sglang, "specforge": for_specforge, "speculators": for_speculators}
    notes = edit[engine](cfg, config, state, target_head, out)
    if engine in ("specforge", "speculators"):  # training-side copies, never on a Space: the target's head is
        max_shard_bytes = SINGLE_FILE             # one tensor past any Space-sized shard
    write_weights(state, out, max_shard_bytes)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    if (src / HOT_TOKENS_FILE).exists():
        shutil.copyfile(src / HOT_TOKENS_FILE, out / HOT_TOKENS_FILE)
    return notes


def for_sglang(cfg, config: dict, state: dict[str, torch.Tensor], target_head=None, out=None) -> list[str]:
    """Edit `config` and `state` in place into the form SGLang >= 0.5.2 loads."""
    notes = []
    if cfg.method == "eagle" and zero_fc_bias(state):
        notes.append(f"added fc.bias, zeros [{cfg.hidden_size}] (SGLang's EAGLE-1 fc has a bias it would leave random)")
    if cfg.method == "eagle3":
        notes += _sglang_aux(cfg, config, "SGLang", "llama_eagle3.py")
    return notes


def for_vllm(cfg, config: dict, state: dict[str, torch.Tensor], target_head=None, out=None) -> list[str]:
    """Edit `config` and `state` in place into the form vLLM >= 0.11 loads."""
    notes = []
    if cfg.method == "eagle":
        if "fc.bias" in state:
            if bool(state["fc.bias"].ne(0).any()):
                raise ExportError("fc.bias: nonzero, and vLLM's EAGLE-1 fc has no bias (llama_eagle.py, bias=False): "
                                  "vLLM >= 0.25 would drop it silently, <= 0.24 refuses it; this head cannot run in "
                                  "vLLM without changing what it computes")
            del state["fc.bias"]
            notes.append("dropped fc.bias (zeros; vLLM's EAGLE-1 fc has none: <= 0.24 refuses it, >= 0.25 drops it)")
        if out is not None and "eagle-" not in str(out).lower():
            notes.append('serve it with "method": "eagle" in --speculative-config: vLLM takes a head for EAGLE-1 '
                         'only when told, or from "eagle-" in its path, and builds a plain draft model otherwise')
    if cfg.method == "eagle3" and config.pop("eagle_config", None) is not None:
        notes.append("aux layer ids only at the top level, as the streams entering layers (vLLM's convention)")
    if state.pop("t2d", None) is not None:  # llama_eagle3.py load_weights skips it
        notes.append("dropped t2d (vLLM never reads it; d2t maps the same draft vocabulary)")
    return notes


def for_specforge(cfg, config: dict, state: dict[str, torch.Tensor], target_head=None, out=None) -> list[str]:
    """Edit `config` and `state` in place into what SpecForge's warm start loads
    (``warm_start_draft_model`` in training/model_loading.py, SpecForge 0.2.0)."""
    if cfg.method == "eagle":
        raise ExportError("SpecForge trains no EAGLE-1 head (its draft models are EAGLE-3 and later); "
                          "export an EAGLE-3 drafter")
    notes = _sglang_aux(cfg, config, "SpecForge", "its LlamaForCausalLMEagle3")
    notes += _explicit_head(cfg, config, state, target_head, "SpecForge")
    if "t2d" not in state:  # a full vocabulary: the identity mapping, as SpecForge initialises its buffers
        state["t2d"] = torch.ones(cfg.vocab_size, dtype=torch.bool)
        state["d2t"] = torch.zeros(cfg.vocab_size, dtype=torch.int64)
        notes.append(f"added t2d (all true [{cfg.vocab_size}]) and d2t (zeros): the full vocabulary, which the "
                     f"warm start requires")
    return notes


def for_speculators(cfg, config: dict, state: dict[str, torch.Tensor], target_head=None, out=None) -> list[str]:
    """Edit `config` and `state` in place into what speculators' ``convert --algorithm eagle3`` takes
    (speculators 0.9.0 convert/eagle/eagle3_converter.py); its flags go in the notes."""
    if cfg.method == "eagle":
        raise ExportError("speculators converts no EAGLE-1 head (its algorithms are EAGLE-3, MTP and DFlash); "
                          "export an EAGLE-3 drafter")
    notes = _explicit_head(cfg, config, state, target_head, "speculators' convert")
    config.pop("eagle_config", None)
    notes.append("one model.safetensors (speculators' convert refuses sharded checkpoints)")
    kwargs = {}
    if cfg.aux_layer_ids is not None:
        kwargs["eagle_aux_hidden_state_layer_ids"] = list(cfg.aux_layer_ids)  # vLLM's convention, as its converter
    if cfg.norm_before_residual:
        kwargs["norm_before_residual"] = True
    flags = f" --algorithm-kwargs '{json.dumps(kwargs)}'" if kwargs else ""
    notes.append(f"then: speculators convert OUT --verifier TARGET --algorithm eagle3{flags}")
    return notes


def _sglang_aux(cfg, config: dict, who: str, where: str) -> list[str]:
    """SGLang's conventions, which SpecForge shares: aux ids as outputs of layers, no variant."""
    if cfg.norm_before_residual:
        raise ExportError(f"norm_before_residual: true; {who}'s EAGLE-3 head ({where}) has no such variant, it "
                          f"would run this head wrong")
    if cfg.aux_layer_ids is not None and "eagle_config" not in config:
        raise ExportError(f"aux layers {list(cfg.aux_layer_ids)}: {who} reads ids as outputs of layers (it adds 1), "
                          f"so the embedding output (layer 0) has no {who} id")
    if config.pop("eagle_aux_hidden_state_layer_ids", None) is not None:
        return [f"aux layer ids only in eagle_config, as outputs of layers ({who}'s convention)"]
    return []


def _explicit_head(cfg, config: dict, state: dict[str, torch.Tensor], target_head, who: str) -> list[str]:
    """An explicit draft_vocab_size and an lm_head.weight: the target's, for a head sharing it."""
    config["draft_vocab_size"] = cfg.draft_vocab_size
    if "lm_head.weight" in state:
        return []
    if target_head is None:
        raise ExportError(f"lm_head.weight: this head drafts through the target's lm_head, and {who} needs it in "
                          f"the checkpoint; give the target (--target)")
    head = target_head().detach().to("cpu")
    want = (cfg.vocab_size, cfg.hidden_size)
    if tuple(head.shape) != want:
        raise ExportError(f"lm_head.weight: the target's is {list(head.shape)}, this head drafts through {list(want)}")
    dtype = state["fc.weight"].dtype
    state["lm_head.weight"] = head.to(dtype).contiguous()
    return [f"added lm_head.weight, the target's {list(want)}, and draft_vocab_size {cfg.draft_vocab_size} "
            f"({who} would otherwise build a head of its own at random)"]


def default_target_head(spec: str) -> Callable[[], torch.Tensor]:
    """The lm_head weight of target `spec` ('default', a directory or a hub id), loaded when called."""
    def head() -> torch.Tensor:
        from demo.models.loading import LoadError, load_target

        try:
            model, _ = load_target(spec, device="cpu", dtype="float32")
        except LoadError as e:
            raise ExportError(f"--target: {e}") from None
        return model.get_output_embeddings().weight
    return head


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m demo.export_drafter", description=__doc__.split("\n\n")[0])
    p.add_argument("--engine", required=True, choices=ENGINES, help="the library that will load OUT")
    p.add_argument("src", metavar="IN", help="a drafter directory SpecLens reads")
    p.add_argument("out", metavar="OUT", help="the directory to write (its weight files are replaced)")
    p.add_argument("--target", default="default",
                   help="the target whose lm_head a shared-head EAGLE-3 export carries (specforge, speculators): "
                        "'default' (the embedded SmolLM2-135M-Instruct), a directory or a hub id")
    p.add_argument("--max-shard-bytes", type=int, default=9_500_000, help="largest weight file (default 9.5 MB)")
    args = p.parse_args(argv)
    try:
        notes = export_drafter(args.src, args.out, args.engine, args.max_shard_bytes, default_target_head(args.target))
    except (DrafterLoadError, ExportError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"wrote {args.out} for {args.engine}" + "".join(f"\n  {n}" for n in notes))
    return 0
