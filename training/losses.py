"""Training forwards and losses of the two drafters, built from the inference modules' own
submodules (``drafter.fc``, ``drafter.midlayer.self_attn.q_proj``, ...) so that training and
inference cannot drift: tests/training/test_losses.py checks that these forwards equal
``drafter.forward``.

Alignment (as at inference): slot i pairs token x[i+1] with the target's feature at position i and
predicts x[i+2]; the target's distribution for x[i+2] is its softmax at position i+1. A slot is
trained when x[i+2] is an assistant token (``mask[i+2]``).

- EAGLE-1: one causal pass over all slots; loss = SmoothL1(drafter output, target's final normed
  hidden at i+1) + 0.1 x soft cross-entropy against the target's softmax at i+1 through the
  target's lm_head; optional uniform noise on the input features.
- EAGLE-3, training-time test (TTT): step 0 consumes fc(target features); step j feeds back the
  drafter's own pre-norm output of step j-1, with tokens and targets shifted by j, at positions
  i+j. A query of step j attends to the step-0 keys causally plus the same-slot keys of steps
  1..j: exactly the cache contents an inference chain started at slot i sees at its j-th step.
  Loss: sum_j 0.8^j x soft cross-entropy against the target's softmax restricted (and
  renormalised) to the draft vocabulary, over slots whose target argmax is in the draft vocabulary
  (a shared-head drafter's vocabulary is the target's: every slot, nothing renormalised);
  optionally plus top1_weight x cross-entropy against the target's argmax (what a greedy draft at
  T = 0 is accepted on: where the target's distribution is flat, the soft target alone lets the
  draft's argmax land on a close second).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from demo.layers import apply_rope, rope_inv_freq, rope_tables
from training.head_loss_kernel import soft_ce_grad_

EAGLE_FEATURE_WEIGHT = 1.0  # EAGLE-1's v_w
EAGLE_TOKEN_WEIGHT = 0.1  # EAGLE-1's p_w
TTT_DECAY = 0.8  # EAGLE-3's per-step loss weight base


@dataclass
class TargetBatch:
    """What the frozen target gives for one batch of full sequences (no gradients)."""

    tokens: torch.Tensor  # [B, S] int64
    mask: torch.Tensor  # [B, S] bool: assistant tokens (prediction targets)
    features: torch.Tensor  # [B, S, F]: final normed hidden (EAGLE) or aux streams (EAGLE-3)
    hidden: torch.Tensor  # [B, S, H] final normed hidden (EAGLE-1's regression target)
    logits: torch.Tensor  # [B, S, V]


@torch.no_grad()
def run_target(target, tokens: torch.Tensor, mask: torch.Tensor, aux_layers: tuple[int, ...]) -> TargetBatch:
    """Full-sequence target forward over a cache of exactly [B, S] (positions = arange)."""
    B, S = tokens.shape
    target.setup_cache(S, B, exact=True)
    positions = torch.arange(S, device=tokens.device).expand(B, S)
    out = target.forward(tokens, positions, aux_layers=aux_layers)
    feats = out.aux if aux_layers else out.hidden
    return TargetBatch(tokens, mask, feats, out.hidden, out.logits)


def rope_for(drafter, length: int, device, dtype=torch.float32):
    """The drafter's cos/sin tables for positions [0, length), each [length, hd], computed as its
    setup_cache computes them."""
    cfg = drafter.cfg
    inv_freq = rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)
    return rope_tables(inv_freq, length, 1.0, dtype, device)


def _qkv(att, x: torch.Tensor, cfg, cos: torch.Tensor, sin: torch.Tensor):
    """q [B, nh, S, hd], k and v [B, nkv, S, hd] with RoPE applied; cos/sin [S, hd]."""
    B, S, _ = x.shape
    q = att.q_proj(x).view(B, S, cfg.num_heads, cfg.head_dim).transpose(1, 2)
    k = att.k_proj(x).view(B, S, cfg.num_kv_heads, cfg.head_dim).transpose(1, 2)
    v = att.v_proj(x).view(B, S, cfg.num_kv_heads, cfg.head_dim).transpose(1, 2)
    c, s = cos[None, None].to(q.dtype), sin[None, None].to(q.dtype)
    return apply_rope(q, c, s), apply_rope(k, c, s), v


def _merge_heads(o: torch.Tensor) -> torch.Tensor:
    B, nh, S, hd = o.shape
    return o.transpose(1, 2).reshape(B, S, nh * hd)


# ------------------------------------------------------------------------------------ EAGLE-1
def eagle_forward(drafter, tokens_next: torch.Tensor, features: torch.Tensor, cos, sin) -> torch.Tensor:
    """EAGLE-1 over all slots at once (positions 0..S-1), as EagleDrafter.forward computes it.

    tokens_next: [B, S] x[i+1] per slot; features [B, S, H] target feature i -> output [B, S, H]
    (the drafter's prediction of the target's feature at i+1; logits = target lm_head of it)."""
    cfg, layer = drafter.cfg, drafter.layers[0]
    dtype = drafter.fc.weight.dtype
    x = drafter.fc(torch.cat((drafter.embed(tokens_next).to(dtype), features.to(dtype)), dim=-1))
    att = layer.self_attn
    q, k, v = _qkv(att, x, cfg, cos, sin)
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=cfg.num_heads != cfg.num_kv_heads)
    x = x + att.o_proj(_merge_heads(o))
    return x + layer.mlp(layer.post_attention_layernorm(x))


def eagle_loss(drafter, tb: TargetBatch, lm_head, noise: float = 0.0) -> tuple[torch.Tensor, dict]:
    """EAGLE-1 loss on one batch; lm_head is the target's (frozen). Returns (loss, metrics)."""
    B, S = tb.tokens.shape
    feats = tb.features.float()
    if noise > 0:  # EAGLE's uniform feature noise, scaled to the features' RMS
        rms = feats.pow(2).mean(-1, keepdim=True).sqrt()
        feats = feats + (torch.rand_like(feats) - 0.5) * noise * rms
    tokens_next = F.pad(tb.tokens[:, 1:], (0, 1))  # [B, S] x[i+1]
    valid = F.pad(tb.mask[:, 2:], (0, 2))  # [B, S] slot i predicts x[i+2]
    cos, sin = rope_for(drafter, S, tb.tokens.device)
    out = eagle_forward(drafter, tokens_next, feats, cos, sin)  # [B, S, H]
    pred = out[:, :-1][valid[:, :-1]]  # [N, H]
    n = max(int(pred.shape[0]), 1)
    target_h = tb.hidden[:, 1:][valid[:, :-1]].float()  # [N, H] feature at i+1
    target_logits = tb.logits[:, 1:][valid[:, :-1]]  # [N, V] distribution of x[i+2]
    feature_loss = F.smooth_l1_loss(pred.float(), target_h, reduction="none").mean(-1).sum() / n
    draft_logits = lm_head(pred.to(lm_head.weight.dtype)).float()  # [N, V]
    target_p = torch.softmax(target_logits.float(), -1)
    token_loss = -(target_p * torch.log_softmax(draft_logits, -1)).sum(-1).sum() / n
    loss = EAGLE_FEATURE_WEIGHT * feature_loss + EAGLE_TOKEN_WEIGHT * token_loss
    with torch.no_grad():
        acc = (draft_logits.argmax(-1) == target_logits.argmax(-1)).float().mean() if pred.shape[0] else loss * 0
    return loss, {"loss": loss.detach(), "feature_loss": feature_loss.detach(), "token_loss": token_loss.detach(),
                  "acc": [acc], "positions": pred.shape[0]}


# ------------------------------------------------------------------------------------ EAGLE-3
HEAD_CHUNK_ELEMENTS = 1 << 28  # logits per chunk of rows in head_cross_entropy (1 GiB in fp32)


class _HeadCrossEntropy(torch.autograd.Function):
    """Soft cross-entropy (plus optional top-1 cross-entropy) of an output head over chunks of rows,
    with the gradient computed in the forward: no [N, V] tensor outlives its chunk (at V = 49,152
    and N ~ 10^4 rows per TTT step, autograd would keep several GB per step and stream them twice)."""

    @staticmethod
    def forward(ctx, x, weight, source, rows_b, rows_s, top, top1_weight, chunk, row_weight):
        # x [N, H]; weight [V, H]; source [B, S, V] target logits, row n at (rows_b[n], rows_s[n]); top [N] or None;
        # row_weight [N] or None (the loss is then the weighted mean over rows)
        n_rows = x.shape[0]
        total_weight = n_rows if row_weight is None else row_weight.float().sum()
        cast = not torch.is_autocast_enabled(x.device.type)  # under autocast the matmuls pick their dtype
        loss = torch.zeros((), dtype=torch.float32, device=x.device)
        picks = torch.empty(n_rows, dtype=torch.long, device=x.device)
        grad_x = torch.empty(x.shape, dtype=torch.float32, device=x.device)
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=x.device) if ctx.needs_input_grad[1] else None
        for a in range(0, n_rows, chunk):
            xc = x[a: a + chunk]
            xc = xc.to(weight.dtype) if cast else xc
            logits = F.linear(xc, weight)  # [c, V], becomes dL/dlogits in place
            row_loss, picks[a: a + chunk] = soft_ce_grad_(
                logits, source, rows_b[a: a + chunk], rows_s[a: a + chunk],
                None if top is None else top[a: a + chunk], top1_weight,
                None if row_weight is None else row_weight[a: a + chunk])
            loss += row_loss.sum()
            grad_x[a: a + chunk] = (logits @ weight).float()
            if grad_w is not None:
                grad_w += (logits.t() @ xc).float()
        ctx.save_for_backward(grad_x / total_weight, None if grad_w is None else grad_w / total_weight)
        ctx.dtypes = (x.dtype, weight.dtype)
        ctx.mark_non_differentiable(picks)
        return loss / total_weight, picks

    @staticmethod
    def backward(ctx, grad_loss, _grad_picks):
        grad_x, grad_w = ctx.saved_tensors
        gx = (grad_x * grad_loss).to(ctx.dtypes[0])
        gw = None if grad_w is None else (grad_w * grad_loss).to(ctx.dtypes[1])
        return gx, gw, None, None, None, None, None, None, None


def head_cross_entropy(x: torch.Tensor, weight: torch.Tensor, source: torch.Tensor, rows_b: torch.Tensor,
                       rows_s: torch.Tensor, top: torch.Tensor | None = None, top1_weight: float = 0.0,
                       chunk_elements: int = HEAD_CHUNK_ELEMENTS,
                       row_weight: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """mean over rows n of [CE(softmax(source[rows_b[n], rows_s[n]]), x[n] W^T) + top1_weight x
    CE(onehot(top[n]), x[n] W^T)] (weighted by row_weight [N] if given), and each row's argmax
    (draft id). x [N, H]; weight [V, H] (a frozen target head or a trained one); source [B, S, V];
    rows_b, rows_s, top [N]. Returns (loss scalar fp32, picks [N] int64); equal to the plain autograd
    formula (tests/training/test_losses.py)."""
    chunk = max(1, chunk_elements // weight.shape[0])
    return _HeadCrossEntropy.apply(x, weight, source, rows_b, rows_s, top if top1_weight else None,
                                   float(top1_weight), chunk, row_weight)


def head_argmax(x: torch.Tensor, weight: torch.Tensor, chunk_elements: int = HEAD_CHUNK_ELEMENTS) -> torch.Tensor:
    """argmax of x W^T over chunks of rows, without gradients. x [N, H]; weight [V, H]. Returns [N] int64."""
    chunk = max(1, chunk_elements // weight.shape[0])
    with torch.no_grad():
        return torch.cat([F.linear(x[a: a + chunk], weight).argmax(-1) for a in range(0, x.shape[0], chunk)])


def chain_starts(hits: torch.Tensor, valid: torch.Tensor, first: torch.Tensor) -> torch.Tensor:
    """The slots where the engine starts a chain at T = 0 on this text, found by pointer doubling.

    hits [B, S, k] bool: the chain rooted at slot i drafts its j-th token as the text has it (False
    where it has no step j); valid [B, S] bool: slots the engine drafts from (the text goes on);
    first [B, S] bool: each answer's first slot (the target wrote the token before it, as prefill
    does). A chain rooted at slot i accepts its leading hits L (0..k) and the next one is rooted at
    slot i + L + 1; a walk ends where the text does. Returns [B, S] bool: every slot a walk visits."""
    B, S, _ = hits.shape
    accepted = hits.int().cumprod(-1).sum(-1)  # [B, S] leading hits
    slot = torch.arange(S, device=hits.device)
    end = torch.full((B, 1), S, dtype=torch.long, device=hits.device)  # column S: past the end, maps to itself
    jump = torch.cat([torch.where(valid, (slot + accepted + 1).clamp(max=S), S), end], 1)  # [B, S + 1]
    seen = torch.cat([first & valid, torch.zeros_like(end, dtype=torch.bool)], 1).float()  # 0/1: amax is an or
    for _ in range(S.bit_length()):  # round m adds the slots 2^m .. 2^(m+1) - 1 chains down every walk
        seen = seen.scatter_reduce(1, jump, seen, reduce="amax")
        jump = jump.gather(1, jump)
    return seen[:, :S].bool() & valid


def ttt_attention(q: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor]) -> torch.Tensor:
    """Attention of TTT step j = len(keys) - 1.

    q: [B, nh, S, hd]; keys/values: j+1 tensors [B, nkv, S, hd]. Query slot i sees keys[0][0..i]
    (causal) and keys[m][i] for m = 1..j (its own slot only), as a chain rooted at slot i would.
    The same-slot scores are dot products, so memory is O(S^2) once, not O(S^2 (j+1))."""
    B, nh, S, hd = q.shape
    nkv = keys[0].shape[1]
    g = nh // nkv
    qg = q.view(B, nkv, g, S, hd)  # query head h uses kv head h // g, as SDPA's enable_gqa does
    scale = hd ** -0.5
    s0 = torch.matmul(qg, keys[0].unsqueeze(2).transpose(-1, -2)) * scale  # [B, nkv, g, S, S]
    causal = torch.ones(S, S, dtype=torch.bool, device=q.device).tril()
    s0 = s0.masked_fill(~causal, float("-inf"))
    diag = [(qg.float() * k.unsqueeze(2).float()).sum(-1, keepdim=True) * scale for k in keys[1:]]  # j x [B, nkv, g, S, 1]
    p = torch.softmax(torch.cat([s0.float()] + diag, dim=-1), dim=-1)  # [B, nkv, g, S, S + j] float32
    o = torch.matmul(p[..., :S].to(q.dtype), values[0].unsqueeze(2)).float()  # [B, nkv, g, S, hd]
    for m, v in enumerate(values[1:]):
        o = o + p[..., S + m: S + m + 1] * v.unsqueeze(2).float()
    return _merge_heads(o.to(q.dtype).reshape(B, nh, S, hd))


def eagle3_ttt_forward(drafter, tokens: torch.Tensor, features: torch.Tensor, steps: int, cos, sin) -> list[torch.Tensor]:
    """EAGLE-3 unrolled for `steps` draft steps over all slots.

    tokens: [B, S + steps] with tokens[:, i + 1 + j] the token of slot i at step j (x itself,
    padded); features [B, S, 3*Ht]; cos/sin [S + steps, hd]. Returns the pre-norm outputs of every
    step, each [B, S, H] (logits = drafter.lm_head(drafter.norm(h)))."""
    cfg, layer = drafter.cfg, drafter.midlayer
    att = layer.self_attn
    B, S = features.shape[:2]
    hidden = drafter.fc(features.to(drafter.fc.weight.dtype))  # [B, S, H]
    keys, values, outs = [], [], []
    for j in range(steps):
        normed = layer.hidden_norm(hidden)
        residual = normed if cfg.norm_before_residual else hidden
        emb = layer.input_layernorm(drafter.embed(tokens[:, j + 1: j + 1 + S]).to(hidden.dtype))  # x[i+1+j]
        x = torch.cat((emb, normed.to(emb.dtype)), dim=-1)  # [B, S, 2H]
        q, k, v = _qkv(att, x, cfg, cos[j: j + S], sin[j: j + S])  # slot i sits at position i + j
        keys.append(k)
        values.append(v)
        h = residual + att.o_proj(ttt_attention(q, keys, values))
        h = h + layer.mlp(layer.post_attention_layernorm(h))
        outs.append(h)
        hidden = h
    return outs


def eagle3_loss(drafter, tb: TargetBatch, steps: int = 7, top1_weight: float = 0.0,
                chain_start_weight: float = 1.0, decay: float = TTT_DECAY,
                align_mask: bool = False) -> tuple[torch.Tensor, dict]:
    """EAGLE-3 TTT loss on one batch: sum_j decay^j x (soft CE over the draft vocabulary + top1_weight
    x CE against the target's argmax), each step averaged over its valid slots; with
    chain_start_weight W != 1 the chains rooted where the engine would start one on this text (the
    drafter's own chains at T = 0, see chain_starts) weigh W times the others. With align_mask, step
    j trains only the chains whose greedy drafts 0..j-1 all equal the text: a T = 0 chain never
    reaches step j otherwise, so the capacity goes to the steps it does reach (GRIFFIN's
    token-alignable training), and acc[j] becomes the accuracy given the step is reached. Returns
    (loss, metrics with per-step accuracy acc[j], and start_acc: step-0 accuracy at those chain
    starts, the training-side estimate of the engine's acceptance at token 0)."""
    B, S = tb.tokens.shape
    dev = tb.tokens.device
    cos, sin = rope_for(drafter, S + steps, dev)
    outs = eagle3_ttt_forward(drafter, F.pad(tb.tokens, (0, steps + 1)), tb.features, steps, cos, sin)
    draft_ids, target_top, valids = _targets_and_valid_slots(drafter, tb, len(outs))
    # [B, S, Vd] the target's logits over the draft vocabulary (a full-vocabulary head: all of them)
    restricted = tb.logits if drafter.d2t is None else tb.logits.index_select(-1, draft_ids)
    if top1_weight:
        to_draft = torch.full((drafter.cfg.vocab_size,), -1, dtype=torch.long, device=dev)  # [V] target id -> draft id
        to_draft[draft_ids] = torch.arange(len(draft_ids), device=dev)
    walk = _ChainWalk(tb, len(outs))
    weights = starts = None
    if (chain_start_weight != 1.0 or align_mask) and outs:
        with torch.no_grad():  # where the drafter, as it is, would start chains: one argmax pass per step
            drafted = _greedy_drafts(drafter, outs, valids, draft_ids)
            starts = walk.starts(drafted)
            if chain_start_weight != 1.0:
                weights = 1.0 + (chain_start_weight - 1.0) * starts.float()  # [B, S]
            if align_mask:  # [B, S, steps] step j is reached: drafts 0..j-1 of the chain at slot i all hit
                hits = walk.hits(drafted).int()
                reached = F.pad(hits.cumprod(-1)[..., :-1], (1, 0), value=1).bool()
                valids = [v & reached[..., j] for j, v in enumerate(valids)]
    else:  # the loss's own picks show where the chains started
        drafted = [torch.full((B, S), -1, dtype=torch.long, device=dev) for _ in outs]
    total = tb.features.new_zeros((), dtype=torch.float32)
    accs, counts = [], []
    for j, (h, valid) in enumerate(zip(outs, valids)):
        n = int(valid.sum())
        counts.append(n)
        if n == 0:
            accs.append(total.new_zeros(()))
            continue
        rows = valid.nonzero(as_tuple=True)
        want = target_top[rows[0], rows[1] + 1 + j]  # [N] the target's argmax, in the draft vocabulary
        top = to_draft[want] if top1_weight else None
        step_loss, picks = head_cross_entropy(drafter.norm(h[rows]), drafter.lm_head.weight, restricted, rows[0],
                                              rows[1] + 1 + j, top, top1_weight,  # [Vd] renormalised soft target
                                              row_weight=None if weights is None else weights[rows])
        total = total + decay ** j * step_loss
        accs.append((draft_ids[picks] == want).float().mean())
        if starts is None:
            drafted[j][rows] = draft_ids[picks]
    metrics = {"loss": total.detach(), "acc": accs, "positions": counts[0] if counts else 0}
    if outs:
        with torch.no_grad():
            starts = walk.starts(drafted) if starts is None else starts
            metrics["start_acc"] = walk.hits(drafted)[..., 0][starts].float().mean() if starts.any() else None
            metrics["chain_starts"] = starts  # [B, S] bool
    return total, metrics


def _targets_and_valid_slots(drafter, tb: TargetBatch, steps: int):
    """(draft_ids [Vd], target_top [B, S + steps + 1], valids): valids[j] [B, S] marks
    the slots whose step-j prediction is trained and scored (an answer token whose target argmax
    is in the draft vocabulary, at a target position that exists)."""
    B, S = tb.tokens.shape
    dev = tb.tokens.device
    draft_ids = torch.arange(drafter.cfg.draft_vocab_size, device=dev)  # [Vd] target ids of the draft vocabulary
    in_draft = torch.ones(drafter.cfg.vocab_size, dtype=torch.bool, device=dev)  # [V]
    if drafter.d2t is not None:
        draft_ids, in_draft = draft_ids + drafter.d2t, drafter.t2d
    target_top = F.pad(tb.logits.argmax(-1), (0, steps + 1))  # [B, S + steps + 1] target's greedy next token
    shifted_mask = F.pad(tb.mask, (0, steps + 2))
    valids = []  # slot i at step j predicts x[i+2+j] from the target's position i+1+j
    for j in range(steps):
        valid = shifted_mask[:, 2 + j: 2 + j + S] & in_draft[target_top[:, 1 + j: 1 + j + S]]  # [B, S]
        valid[:, max(S - 1 - j, 0):] = False  # the target position i+1+j must exist
        valids.append(valid)
    return draft_ids, target_top, valids


def _greedy_drafts(drafter, outs: list[torch.Tensor], valids: list[torch.Tensor], draft_ids: torch.Tensor):
    """The drafter's greedy pick at every scored slot of every step, as target ids [B, S] (-1 where
    not scored), one argmax pass over the head per step."""
    B, S = valids[0].shape if valids else (0, 0)
    return [torch.where(v, draft_ids[head_argmax(drafter.norm(h).flatten(0, 1), drafter.lm_head.weight)].view(B, S), -1)
            for v, h in zip(valids, outs)]


class _ChainWalk:
    """The text of a batch as the engine's T = 0 chains meet it: which slots it drafts from, where
    each answer's first chain is rooted, and what each step's draft must equal to be accepted."""

    def __init__(self, tb: TargetBatch, steps: int):
        S = tb.tokens.shape[1]
        mask = F.pad(tb.mask, (0, 2))
        self.S = S
        self.text = F.pad(tb.tokens, (0, steps + 1))[:, 2: 2 + S + steps]  # text[:, i + j] = x[i+2+j]
        self.drafts_here = mask[:, 2: 2 + S].clone()  # [B, S] slots the engine drafts from: x[i+2] is an answer token
        self.drafts_here[:, max(S - 1, 0):] = False
        first = tb.mask & ~F.pad(tb.mask, (1, 0))[:, :S]  # [B, S] an answer's first token at position a ...
        self.first = F.pad(first[:, 1:], (0, 1))  # ... roots its first chain at slot a - 1

    def hits(self, drafted: list[torch.Tensor]) -> torch.Tensor:
        """[B, S, steps] bool: the chain rooted at slot i drafts its j-th token as the text has it
        (drafted[j] [B, S] target ids, -1: none)."""
        return torch.stack([d == self.text[:, j: j + self.S] for j, d in enumerate(drafted)], -1)

    def starts(self, drafted: list[torch.Tensor]) -> torch.Tensor:
        return chain_starts(self.hits(drafted), self.drafts_here, self.first)


@torch.no_grad()
def eagle3_chain_walk(drafter, tb: TargetBatch, steps: int) -> dict:
    """The engine's T = 0 chains of `steps` drafts over a text the target wrote greedily, without
    decoding: one training-time-test forward, the drafter's greedy pick at every slot and step, and
    the walk from each answer's first chain start (chain_starts). On the engine's own output this
    is its run draft for draft (tests/training/test_walk_eval.py), so on the target's greedy
    answers to the hold-out prompts it measures the headline's acceptance at T = 0 in one batched
    pass.

    Returns {"accepted": [C] int64 drafts accepted by each chain (0..steps), "correct" and
    "positions": per step, the scored slots where the greedy draft is the target's argmax (teacher
    forced), and all scored slots (0-d tensors)}."""
    B, S = tb.tokens.shape
    cos, sin = rope_for(drafter, S + steps, tb.tokens.device)
    outs = eagle3_ttt_forward(drafter, F.pad(tb.tokens, (0, steps + 1)), tb.features, steps, cos, sin)
    draft_ids, target_top, valids = _targets_and_valid_slots(drafter, tb, steps)
    drafted = _greedy_drafts(drafter, outs, valids, draft_ids)
    walk = _ChainWalk(tb, steps)
    hits = walk.hits(drafted)  # [B, S, steps]
    starts = chain_starts(hits, walk.drafts_here, walk.first)
    accepted = hits.int().cumprod(-1).sum(-1)[starts]  # [C]
    correct = [(d == target_top[:, 1 + j: 1 + j + S])[v].sum() for j, (d, v) in enumerate(zip(drafted, valids))]
    return {"accepted": accepted, "correct": correct, "positions": [v.sum() for v in valids]}


def chain_acceptance(accs: list[float], k: int) -> float:
    """Expected mean acceptance length of a k-token chain at T=0 if TTT step j's accuracy were the
    chance of accepting draft j given drafts < j were accepted: 1 + sum_j prod_{m<=j} acc_m."""
    total, run = 1.0, 1.0
    for a in accs[:k]:
        run *= a
        total += run
    return total
