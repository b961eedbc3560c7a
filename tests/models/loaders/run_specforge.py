"""Warm-start SpecForge's EAGLE-3 draft model from a checkpoint with SpecForge's own code and run it:
a script for tests/models/test_exports.py, run in a subprocess whose PYTHONPATH holds SpecForge 0.2.0.

    python tests/models/loaders/run_specforge.py CASES.json OUT_DIR

What runs is SpecForge's, as its EAGLE-3 recipe builds a draft (specforge/algorithms/
model_providers.py build_eagle3_draft): load_draft_config_source, AutoDraftModel.from_config (sdpa),
warm_start_draft_model (training/model_loading.py: AutoDraftModel.from_pretrained, then
load_state_dict with its own refusals), load_embedding from the target; then one training-style
step with no test-time rollout: embed_input_ids, project_hidden_states, backbone, compute_logits.

Each case: {"name", "target": HF dir, "drafter": dir, "features": a .pt of tokens [T], positions
[T], hidden [T, 3H]}. OUT_DIR/NAME.json holds the warm start's report, the parameters left at
initialisation and the checkpoint tensors found nowhere in the module (or "error"); OUT_DIR/NAME.pt
the logits [T, draft vocabulary].
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from accounting import checkpoint_tensors, left_at_init, poison, run_cases, unfound  # noqa: E402

from specforge.modeling.auto import AutoDraftModel  # noqa: E402
from specforge.training.model_loading import load_draft_config_source, warm_start_draft_model  # noqa: E402


def run_case(case: dict, out: Path) -> dict:
    config = load_draft_config_source(case["drafter"])
    model = AutoDraftModel.from_config(config, attention_backend="sdpa", torch_dtype=torch.float32)
    poison(model)  # whatever is neither loaded nor the target's embedding stays NaN
    report = warm_start_draft_model(model, case["drafter"], draft_config=config, strategy="eagle3",
                                    allow_missing_embedding=True)
    model.load_embedding(case["target"])  # build_eagle3_draft's load_target_embedding
    model.eval()
    f = torch.load(case["features"])
    with torch.no_grad():
        embeds = model.embed_input_ids(f["tokens"][None])  # [1, T, H]
        hidden = model.project_hidden_states(f["hidden"][None])  # [1, T, H]
        T = hidden.shape[1]
        mask = model.prepare_decoder_attention_mask(torch.ones(1, T, dtype=torch.bool), hidden, 1, T, 0)
        x = model.backbone(embeds, hidden, None, mask, f["positions"][None], use_cache=False)
        logits = model.compute_logits(x)[0]  # [T, Vd]
    torch.save(logits, out / f"{case['name']}.pt")
    checkpoint = checkpoint_tensors(case["drafter"])
    state = dict(model.named_parameters()) | dict(model.named_buffers())
    return {"cls": type(model).__name__, "loaded_keys": report.loaded_keys, "missing_keys": list(report.missing_keys),
            "left_at_init": left_at_init(model), "unfound": unfound(checkpoint, state)}




if __name__ == "__main__":
    run_cases(run_case, *sys.argv[1:])
