"""Where a training run's drafter starts: built fresh for the target, from a saved drafter
(``--init-drafter``), or from the run's own checkpoint (``--resume``).

Each start fixes the drafter's layout (its feature layers, whether EAGLE-3 has an lm_head of its
own over a draft vocabulary or reads through the target's, and its MLP width): a fresh run takes it
from the flags, a saved drafter or a checkpoint brings its own. ``start_drafter`` is the one call
the trainer makes; the rest are its steps.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from demo.drafter_common import DrafterConfig
from demo.drafter_eagle import EagleDrafter
from demo.drafter_eagle3 import Eagle3Drafter
from training.data import DraftVocab, build_draft_vocab

MAX_SHARD_BYTES = 9_500_000  # demo.models.checkpoints.save_drafter's default: a Space takes files < 10 MB without LFS
MLP_ROWS = ("mlp.gate_proj.weight", "mlp.up_proj.weight")  # [I, H]: one row per MLP unit
MLP_COLUMNS = ("mlp.down_proj.weight",)  # [H, I]: one column per MLP unit


@dataclass
class Layout:
    """A run's drafter beyond its method; what a resumed run must keep."""

    aux_layers: tuple[int, ...] | None = None  # EAGLE-3 feature layers; None: the target default
    own_lm_head: bool = False  # EAGLE-3: an lm_head of its own over a draft vocabulary (else the target's)
    vocab_ids: np.ndarray | None = None  # that vocabulary's target ids in draft order; None: built from the data
    intermediate_size: int | None = None  # MLP width; None: the target's


# ------------------------------------------------------------------------------------ the three starts
def fresh_layout(args) -> Layout:
    """A new head: an lm_head of its own only when --draft-vocab asks for one."""
    return Layout(args.aux_layers, args.method == "eagle3" and args.draft_vocab is not None, None,
                  args.intermediate_size)


def saved_drafter_layout(init, args) -> Layout:
    """The layout of a saved drafter, widened to --intermediate-size when that is wider."""
    width = args.intermediate_size or init.cfg.intermediate_size
    if width < init.cfg.intermediate_size:
        raise SystemExit(f"--intermediate-size {width}: narrower than {args.init_drafter}'s "
                         f"{init.cfg.intermediate_size} (a run widens an MLP, never cuts one)")
    if args.method != "eagle3":
        return Layout(intermediate_size=width)
    return Layout(args.aux_layers or init.cfg.aux_layer_ids, init.cfg.own_lm_head,
                  draft_vocab_ids(init) if init.cfg.own_lm_head else None, width)


def checkpoint_layout(state: dict, args) -> Layout:
    """The layout a run's checkpoint was trained with; refuses a resume that would change it."""
    if state["method"] != args.method:
        raise SystemExit(f"--resume: the checkpoint is a {state['method']} run, not {args.method}")
    saved = state.get("aux_layers")  # None: the target default
    saved = None if saved is None else tuple(saved)
    if args.aux_layers is not None and args.aux_layers != saved:
        raise SystemExit(f"--resume: the run trained on aux layers {saved or 'the target default'}, "
                         f"not {args.aux_layers}")
    own = args.method == "eagle3" and not state.get("share_lm_head", False)
    ids = state["vocab_ids"] if own else None
    return Layout(saved, own, None if ids is None else np.asarray(ids), mlp_width(state["drafter"]))


def start_drafter(args, target, answer: np.ndarray, state: dict | None) -> tuple[torch.nn.Module, DraftVocab | None,
                                                                                   Layout]:
    """The run's drafter in fp32 on the target's device, sharing the target's modules: from the
    checkpoint's layout with --resume (its weights come later, with the optimiser's), from
    --init-drafter's weights, or fresh. `answer`: the training data's answer tokens, for the draft
    vocabulary's counts. Returns (drafter, draft vocabulary or None for EAGLE-1, layout)."""
    init = None
    if state is not None:
        layout = checkpoint_layout(state, args)
    elif args.init_drafter:
        from demo.models.checkpoints import load_drafter

        init = load_drafter(args.init_drafter, target, method=args.method, hot_tokens="off")
        layout = saved_drafter_layout(init, args)
    else:
        layout = fresh_layout(args)
    vocab = draft_vocab(args.method, layout, answer, target.config.vocab_size, args.draft_vocab)
    if vocab is not None:
        print(f"draft vocabulary: {len(vocab.ids)} of {target.config.vocab_size} target tokens, covering "
              f"{100 * vocab.coverage:.2f}% of answer tokens" + ("" if layout.own_lm_head else " (the target's lm_head)"))
    if layout.aux_layers is not None:
        target.check_aux_layers(layout.aux_layers)
    drafter = build_drafter(args.method, target, vocab, layout)
    if init is not None:
        load_saved_weights(drafter, init)
        print(f"initialised from {args.init_drafter}")
    return drafter, vocab, layout


# ------------------------------------------------------------------------------------ the steps
def draft_vocab(method: str, layout: Layout, answer: np.ndarray, V: int, size: int | None) -> DraftVocab | None:
    """EAGLE-3's draft vocabulary and its coverage of the answer tokens: the target's whole
    vocabulary for a head that reads through the target's lm_head, the layout's for a saved head of
    its own, else the `size` most frequent answer tokens. None for EAGLE-1."""
    if method != "eagle3":
        return None
    if layout.own_lm_head and layout.vocab_ids is None:
        return build_draft_vocab(answer, min(size, V), V)
    ids = layout.vocab_ids if layout.own_lm_head else np.arange(V)
    counts = np.bincount(answer.astype(np.int64), minlength=V)
    return DraftVocab(ids, float(counts[ids].sum() / max(counts.sum(), 1)), V)


def build_drafter(method: str, target, vocab: DraftVocab | None, layout: Layout):
    """A fresh drafter shaped like one target layer, in fp32 on the target's device, borrowing the
    target's embedding (and its lm_head for EAGLE-1, or for EAGLE-3 without one of its own). An
    own lm_head starts from the target's rows of the draft vocabulary, and EAGLE-3's final norm
    from the target's. A sharing drafter must never be cast: .to(dtype) would cast the target's
    borrowed modules too."""
    tc = target.config
    width = {"intermediate_size": layout.intermediate_size} if layout.intermediate_size else {}
    if method == "eagle":
        drafter = EagleDrafter(DrafterConfig.for_target("eagle", tc, **width))
    else:
        cfg = DrafterConfig.for_target("eagle3", tc, draft_vocab_size=len(vocab.ids), own_lm_head=layout.own_lm_head,
                                       aux_layer_ids=layout.aux_layers, **width)  # aux None: the target default
        drafter = Eagle3Drafter(cfg)
        with torch.no_grad():
            if cfg.own_lm_head:
                drafter.d2t.copy_(vocab.d2t)
                drafter.t2d.copy_(vocab.t2d)
                ids = torch.from_numpy(vocab.ids.astype(np.int64)).to(target.lm_head.weight.device)
                drafter.lm_head.weight.copy_(target.lm_head.weight[ids].float().cpu())
            drafter.norm.weight.copy_(target.norm.weight.float().cpu())
    drafter.to(target.device).train()
    drafter.share_target(target)
    return drafter


def load_saved_weights(drafter, init) -> None:
    """Load a saved drafter's weights into `drafter` (same architecture, key for key), its MLP
    widened first when `drafter`'s is wider."""
    saved = {k: v.float() if v.is_floating_point() else v for k, v in init.state_dict().items()}
    if "fc.bias" in saved and getattr(getattr(drafter, "fc", None), "bias", None) is None:
        # the shipped EAGLE-1 carries a zero fc.bias for SGLang (demo/models/checkpoints.zero_fc_bias),
        # which computes nothing; a bias that is not zero would change the head, so it is refused
        if saved["fc.bias"].any():
            raise ValueError("the saved drafter's fc has a nonzero bias, which this drafter's fc has not")
        del saved["fc.bias"]
    if drafter.cfg.intermediate_size > init.cfg.intermediate_size:
        added = widen_mlp(saved, drafter)
        print(f"MLP widened from {init.cfg.intermediate_size} to {drafter.cfg.intermediate_size} units ({added} new, "
              f"silent until trained)")
    drafter.load_state_dict(saved)


def widen_mlp(saved: dict[str, torch.Tensor], drafter) -> int:
    """Fit a saved state to `drafter`'s wider MLP, in place, without changing what it computes: the
    saved units keep their weights, new units take the drafter's fresh gate/up rows and a zero
    down_proj column, so they add silu(g) u x 0 = 0 until training moves them. Returns the units added."""
    fresh = own_state(drafter)
    added = 0
    for name, t in list(saved.items()):
        if name.endswith(MLP_ROWS):
            added = fresh[name].shape[0] - t.shape[0]
            saved[name] = torch.cat((t, fresh[name][t.shape[0]:].to(t)), 0)
        elif name.endswith(MLP_COLUMNS):
            saved[name] = torch.cat((t, t.new_zeros(t.shape[0], fresh[name].shape[1] - t.shape[1])), 1)
    return added


def mlp_width(state: dict[str, torch.Tensor]) -> int:
    """The MLP width of a drafter state (its gate_proj rows)."""
    return next(int(v.shape[0]) for k, v in state.items() if k.endswith(MLP_ROWS[0]))


def draft_vocab_ids(drafter) -> np.ndarray:
    """The target ids of an EAGLE-3 drafter's draft vocabulary, in draft order (id + d2t[id])."""
    n = drafter.cfg.draft_vocab_size
    d2t = drafter.d2t.cpu().numpy() if drafter.d2t is not None else np.zeros(n, np.int64)
    return np.arange(n) + d2t


# ------------------------------------------------------------------------------------ its own weights
def trainable(drafter) -> list[torch.nn.Parameter]:
    """The drafter's own parameters (not the target modules it borrows)."""
    return [p for n, p in drafter.named_parameters() if not n.startswith("_target")]


def own_state(drafter) -> dict[str, torch.Tensor]:
    """The drafter's own tensors (not the target modules it borrows): what is saved."""
    return {k: v for k, v in drafter.state_dict().items() if not k.startswith("_target")}


def unshared_copy(drafter, dtype: torch.dtype):
    """The drafter alone, in `dtype`, for saving: the same config and own tensors, no target modules."""
    copy = type(drafter)(drafter.cfg)
    copy.load_state_dict(own_state(drafter))
    return copy.to(dtype).eval()


def saved_bytes(drafter, dtype: torch.dtype) -> int:
    size = torch.tensor([], dtype=dtype).element_size()
    return sum(t.numel() * (size if t.is_floating_point() else t.element_size()) for t in own_state(drafter).values())


def check_shardable(drafter, dtype: torch.dtype, max_shard_bytes: int = MAX_SHARD_BYTES) -> None:
    """Refuse before training a drafter whose largest tensor cannot fit one shard file (a tensor is
    never split across files): an own EAGLE-3 lm_head [Vd, H] bounds the draft vocabulary."""
    size = torch.tensor([], dtype=dtype).element_size()
    for name, t in own_state(drafter).items():
        need = t.numel() * (size if t.is_floating_point() else t.element_size()) + len(name) + 256
        if need > max_shard_bytes:
            most = (max_shard_bytes - len(name) - 256) // (size * t.shape[-1]) if t.dim() == 2 else 0
            raise SystemExit(f"{name} {list(t.shape)} would take {need} bytes as {dtype}, over the {max_shard_bytes}-byte "
                             f"shard limit" + (f": use --draft-vocab {most} or less" if name == "lm_head.weight" else ""))
