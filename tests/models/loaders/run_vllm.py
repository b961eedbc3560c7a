"""Load drafters with vLLM's own code on a CPU and run them: a script for tests/models/test_exports.py,
run in a subprocess whose PYTHONPATH holds one vLLM release (installed with --no-deps).

    python tests/models/loaders/run_vllm.py CASES.json OUT_DIR

What runs is vLLM's: SpeculativeConfig (method detection, EAGLEConfig wrapping), the model
registry, get_model with the default loader (the draft's load_weights, AutoWeightsLoader) and
load_eagle_model (sharing the target's embedding and lm_head; vllm/v1/worker/gpu/spec_decode/eagle/
utils.py, 0.33.0 and 0.34.0), then the drafter's forward and compute_logits. Three things stand in
for a GPU: the attention kernel (each `Attention` module, a GPU backend, is replaced by causal
SDPA over the same q, k, v), the attention backend's name (chosen before the swap, never run), and
torch.accelerator.empty_cache (a no-op). Custom ops run their PyTorch (native) forward.

Each case: {"name", "target": HF dir, "drafter": dir, "method": "eagle" | "eagle3" | null,
"features": a .pt of tokens [T], positions [T], hidden [T, F]}. For each, OUT_DIR/NAME.json holds
the method vLLM chose, the class it built, the parameters left at initialisation, the checkpoint
tensors found nowhere in the module, and OUT_DIR/NAME.pt its logits [T, V] (or "error").
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from accounting import checkpoint_tensors, left_at_init, poison, run_cases, unfound  # noqa: E402

torch.accelerator.empty_cache = lambda: None  # no accelerator here; vLLM calls it after loading

from vllm.config import (CompilationConfig, DeviceConfig, ModelConfig, ParallelConfig,  # noqa: E402
                         SpeculativeConfig, VllmConfig, set_current_vllm_config)
from vllm.distributed import ensure_model_parallel_initialized, init_distributed_environment  # noqa: E402
from vllm.model_executor.model_loader import get_model  # noqa: E402
from vllm.model_executor.model_loader.default_loader import DefaultModelLoader  # noqa: E402
from vllm.platforms import current_platform  # noqa: E402
from vllm.v1.worker.gpu.spec_decode.eagle.utils import load_eagle_model  # noqa: E402

# chosen at construction only: every Attention module is swapped for CausalSDPA before running
current_platform.get_attn_backend_cls = lambda *a, **k: "vllm.v1.attention.backends.triton_attn.TritonAttentionBackend"

_load_weights = DefaultModelLoader.load_weights


def _poisoned_load(self, model, model_config):
    poison(model)  # whatever is neither loaded nor shared stays NaN
    return _load_weights(self, model, model_config)


DefaultModelLoader.load_weights = _poisoned_load


class CausalSDPA(torch.nn.Module):
    """vLLM's Attention call (q, k, v: [T, heads * head_size]) as causal attention over one sequence."""

    def __init__(self, attn):
        super().__init__()
        impl = attn.impl  # the backend instance holds the scale it was built with
        self.heads, self.kv_heads, self.size, self.scale = impl.num_heads, impl.num_kv_heads, impl.head_size, impl.scale

    def forward(self, q, k, v, *args, **kwargs):
        T = q.shape[0]
        q = q.view(T, self.heads, self.size).transpose(0, 1)  # [nh, T, hd]
        k = k.view(T, self.kv_heads, self.size).transpose(0, 1).repeat_interleave(self.heads // self.kv_heads, 0)
        v = v.view(T, self.kv_heads, self.size).transpose(0, 1).repeat_interleave(self.heads // self.kv_heads, 0)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale)  # [nh, T, hd]
        return out.transpose(0, 1).reshape(T, self.heads * self.size)


def run_case(case: dict, out: Path, state: dict) -> dict:
    if case["target"] not in state:  # a target is configured and loaded once, for all its drafters
        state[case["target"]] = [ModelConfig(model=case["target"], skip_tokenizer_init=True, dtype="float32",
                                             enforce_eager=True), None]
    target, target_model = state[case["target"]]
    spec = SpeculativeConfig(model=case["drafter"], method=case["method"], num_speculative_tokens=3,
                             target_model_config=target, target_parallel_config=ParallelConfig())
    report = {"method": spec.method}
    if spec.method not in ("eagle", "eagle3"):
        return report  # vLLM would not build an EAGLE head from this checkpoint
    config = VllmConfig(model_config=target, speculative_config=spec, device_config=DeviceConfig("cpu"),
                        compilation_config=CompilationConfig(custom_ops=["none"]))
    with set_current_vllm_config(config):
        if "ready" not in state:
            init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                         distributed_init_method=f"file://{tempfile.mkdtemp()}/init")
            ensure_model_parallel_initialized(1, 1)
            state["ready"] = True
        if target_model is None:
            target_model = state[case["target"]][1] = get_model(vllm_config=config, model_config=target)
        drafter = load_eagle_model(target_model, config)
        for module in list(drafter.modules()):
            attn = getattr(module, "attn", None)
            if attn is not None and hasattr(attn, "num_kv_heads"):
                module.attn = CausalSDPA(attn)
        f = torch.load(case["features"])
        with torch.no_grad():
            hidden = f["hidden"]
            if spec.method == "eagle3":
                hidden = drafter.combine_hidden_states(hidden)  # fc over the three target streams
            x, _ = drafter(f["tokens"], f["positions"], hidden)
            logits = drafter.compute_logits(x)  # [T, V]
    checkpoint = checkpoint_tensors(case["drafter"])
    torch.save(logits, out / f"{case['name']}.pt")
    loaded = dict(drafter.named_parameters()) | dict(drafter.named_buffers())
    report.update(cls=type(drafter).__name__, left_at_init=left_at_init(drafter),
                  unfound=unfound(checkpoint, loaded))
    return report




if __name__ == "__main__":
    state: dict = {}
    run_cases(lambda case, out: run_case(case, out, state), *sys.argv[1:])
