"""EAGLE-1 and EAGLE-3 as a proposer: the drafter's passes over the target's features (vLLM's
``EagleProposer``). A step's proposal:

1. project the features the last verification (or the prefill) staged into the drafter's width
   (EAGLE-3's fc over its aux layers; EAGLE-1 reads the final hidden state as it is);
2. catch up: one drafter pass over the R+1 slots of the tokens that verification emitted, each paired
   with the target's feature of the position before it (token x[i+1] with feature h[i]); the row of
   the last emitted token starts the draft;
3. draft: a chain of k greedy single-token passes feeding back the drafter's own hidden state, or a
   tree of depth k (demo/tree.py), beside which a prompt-lookup branch may hang
   (demo/proposers/ngram.py ``graft_branch``).

The drafter itself (demo/drafter_eagle.py, demo/drafter_eagle3.py) is a model with a forward; this
module is what a step does with it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from demo.config import TREE_SCRATCH, DraftShape
from demo.kernels.topk import row_topk
from demo.proposers.ngram import graft_branch, lookup_continuation
from demo.step_result import TOP_SHOWN
from demo.tree import draft_tree, tree_attention_mask, tree_seen_slots


@dataclass
class EagleState:
    """The drafter's persistent tensors of one draft shape (R = the shape's reach, its depth D plus a
    lookup branch; Hd, Vd: the drafter's width and draft vocabulary; F: the target's feature width)."""

    catch_tokens: torch.Tensor  # [1, R+1] int64: tokens emitted by the last verification (padded)
    catch_positions: torch.Tensor  # [1, R+1] int64: the positions of the features they pair with
    catch_hidden: torch.Tensor  # [1, R+1, Hd] drafter input after project()
    catch_last: torch.Tensor  # [1] int64: index of the last emitted token (= accepted count)
    catch_features: torch.Tensor  # [1, R+1, F] target features the catch-up projects
    root_logits: torch.Tensor  # [1, 1, Vd] the drafter's logits at the last emitted token
    draft_hidden: torch.Tensor  # [1, 1, Hd] its hidden output there
    draft_position: torch.Tensor  # [1, 1] int64: the drafter position of the first draft's row
    chain_logits: torch.Tensor  # [D, Vd]: a chain's logits at each draft position


class EagleProposer:
    """A drafter's proposals, chain or tree, over the target's features."""

    reads_history = False  # only a tree's lookup branch reads the token history (the shape asks for it)
    trees = True  # chains and trees (demo/tree.py)
    samples_drafts = True  # at T > 0 its drafts may be draws from q (the q and wor rules)
    copies = False  # drafted by the drafter (a tree's lookup branch, TreeShape.lookup, is a copy)

    def __init__(self, drafter):
        self.drafter = drafter
        self.method = drafter.cfg.method
        self.features: tuple[int, ...] = ()  # aux layer ids (EAGLE-3), () for the final hidden (bind sets them)
        self.max_context = 0

    @property
    def drafting_vocab(self) -> int:
        """The ids a draft is drawn from (a draft vocabulary, hot tokens, or the target's)."""
        return self.drafter.drafting_vocab

    # ------------------------------------------------------------------ setup
    def bind(self, target, max_context: int, dtype: torch.dtype, int8: bool | str = False) -> None:
        """The drafter on the target's device in `dtype`, its head shared where it borrows the target's,
        its int8 copies (a CPU's, ``DrafterBase.use_int8``), and its cache: the context, then scratch
        slots for the rows of a tree's frontier nodes (demo/tree.py)."""
        d = self.drafter
        if d.feature == "aux":
            self.features = tuple(d.cfg.aux_layer_ids or target.config.default_aux_layers())
            target.check_aux_layers(self.features)
        d.to(device=target.device, dtype=dtype).eval().requires_grad_(False)
        d.share_target(target)  # after the move: a head borrowed in another dtype is copied
        if hasattr(d, "use_int8"):  # a drafter without weights of its own (an oracle) has none to quantize
            d.use_int8(bool(int8), layer=int8 is True)
        self.max_context = max_context
        d.setup_cache(max_context + TREE_SCRATCH)

    def allocate(self, shape: DraftShape, target, dtype: torch.dtype) -> EagleState:
        dev, reach, d = target.device, shape.reach, self.drafter
        hd, vd = d.cfg.hidden_size, d.drafting_vocab
        width = target.config.hidden_size * (len(self.features) if d.feature == "aux" else 1)
        zeros = lambda *s, dtype=torch.int64: torch.zeros(*s, dtype=dtype, device=dev)  # noqa: E731
        return EagleState(catch_tokens=zeros(1, reach + 1),
                          catch_positions=torch.arange(reach + 1, device=dev).view(1, -1),
                          catch_hidden=zeros(1, reach + 1, hd, dtype=dtype), catch_last=zeros(1),
                          catch_features=zeros(1, reach + 1, width, dtype=target.dtype),
                          root_logits=zeros(1, 1, vd, dtype=target.dtype), draft_hidden=zeros(1, 1, hd, dtype=dtype),
                          draft_position=zeros(1, 1), chain_logits=zeros(max(shape.depth, 1), vd, dtype=target.dtype))

    def stack_weights(self) -> None:
        self.drafter.stack_weights()

    def to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return self.drafter.to_target(draft_ids)

    # ------------------------------------------------------------------ the prompt
    def prefill(self, b, ids: torch.Tensor, positions: torch.Tensor, features: torch.Tensor, rows: int,
                attend: int | None) -> None:
        """The drafter's cache over the prompt's rows 0..rows-2 (row i pairs x[i+1] with h[i]), and the
        last row's features staged for the first catch-up. ids, positions: [1, rows]; features:
        [1, rows, F]."""
        s = b.draft
        s.catch_features[:, :1].copy_(features.index_select(1, b.prefill_last))
        if rows > 1:
            hidden = self.drafter.project(features[:, : rows - 1])
            self.drafter.forward(ids[:, 1:], positions[:, : rows - 1], hidden, logits=False, attend=attend)

    def first(self, b, token: torch.Tensor, prompt_length: int) -> None:
        """After the prefill's first token: the first catch-up redoes the prompt's last drafter row,
        (first token, h[P-1]) at P-1. Its other rows are unused, but the previous generation's would
        reach row 0 through a CPU's int8 drafter, whose activation scale is taken over all of a call's rows."""
        s = b.draft
        s.catch_tokens[0, 1:].zero_()
        s.catch_features[:, 1:].zero_()
        s.catch_tokens[0, :1].copy_(token.view(1))
        s.catch_positions.copy_(torch.arange(prompt_length - 1, prompt_length + b.shape.reach,
                                             device=token.device).view(1, -1))
        s.catch_last.zero_()

    # ------------------------------------------------------------------ a step
    def phases(self, b, attend: int | None) -> dict:
        """The proposal as its phases, in order (what demo/bench/tools/perf.py times one by one)."""
        s = b.draft
        return {"project": lambda: s.catch_hidden.copy_(self.drafter.project(s.catch_features)),
                "catch_up": lambda: self.catch_up(b, attend),
                "draft": (lambda: self.draft_tree(b, attend)) if b.tree is not None else (lambda: self.chain(b, attend))}

    def propose(self, b, attend: int | None = None) -> None:
        """Project, catch up, then draft the chain or the tree. attend: the cache slots the target
        attends over (the engine's ``attended``); None: the whole context."""
        s = b.draft
        s.catch_hidden.copy_(self.drafter.project(s.catch_features))
        self.catch_up(b, attend)
        if b.tree is not None:
            self.draft_tree(b, attend)
        else:
            self.chain(b, attend)

    def catch_up(self, b, attend: int | None = None) -> None:
        """Drafter pass over the R+1 slots of the last verification's emitted tokens; keeps the row of
        the last emitted token as the start of the next draft. Rows after it write stale K/V that
        later steps overwrite before any query can see them."""
        s = b.draft
        logits, hidden = self.drafter.forward(s.catch_tokens, s.catch_positions, s.catch_hidden, attend=attend)
        last = s.catch_last
        s.root_logits.copy_(logits.index_select(1, last))  # [1, 1, Vd]
        s.draft_hidden.copy_(hidden.index_select(1, last))  # [1, 1, Hd]
        s.draft_position.copy_(s.catch_positions.index_select(1, last) + 1)  # [1, 1]

    def chain(self, b, attend: int | None = None) -> None:
        """k greedy drafts from the root's logits, k-1 single-token drafter passes; drafts go to
        verify_tokens[1:]."""
        s, k = b.draft, b.shape.depth
        token = self.drafter.select(s.root_logits)  # [1, 1]
        hidden, position = s.draft_hidden, s.draft_position
        b.verify_tokens[:, 1:2].copy_(token)
        s.chain_logits[0].copy_(s.root_logits.view(-1))  # kept for the event's candidates (one copy a draft)
        for j in range(1, k):
            logits, hidden = self.drafter.forward(token, position, hidden, attend=attend)
            token = self.drafter.select(logits)  # [1, 1]
            position = position + 1
            b.verify_tokens[:, j + 1:j + 2].copy_(token)
            s.chain_logits[j].copy_(logits.view(-1))

    def draft_tree(self, b, attend: int | None = None) -> None:
        """Expand and prune the step's tree (demo/tree.py), hang a lookup branch on it (if the shape has
        one); stage its tokens, positions, slots and mask. The frontier's drafter rows go to scratch
        slots right after the `attend` ones (the context's without it), which no committed row reaches
        before a catch-up rewrites it."""
        s, tb, shape = b.draft, b.tree, b.shape
        scratch = self.max_context if attend is None else attend
        draft = draft_tree(self.drafter, shape, tb.root_token, s.root_logits.view(-1), s.draft_hidden.view(-1),
                           s.draft_position.view(()), scratch, tb.uniforms, b.temperature)
        tokens, parents, depths, logq, q_row = draft.tokens, draft.parents, draft.depths, draft.draft_logq, draft.q_row
        if shape.lookup:  # what followed the text's last tokens where they last appeared, past the drafter's reach
            branch, _ = lookup_continuation(b.history, tb.root_slot.view(()) + 1, shape.reach)  # [R]
            tokens, parents, depths = graft_branch(tokens, parents, depths, branch, shape.depth, shape.lookup)
            # copied, not drafted: no q of the drafter's (the event's tree says which nodes: DraftTree.copied)
            logq = torch.cat((logq, logq.new_full((shape.lookup,), float("-inf"))))
            q_row = torch.cat((q_row, q_row.new_zeros(shape.lookup)))
        stage_tree(b, tokens, parents, depths, logq, q_row, attend)
        if tb.q is not None and tb.draft_to_target is None:  # the drafter's q over the target vocabulary,
            tb.q.copy_(draft.q)  # for the acceptance test (drafting over the target's own ids)
        elif tb.q is not None:  # a draft vocabulary of its own, or hot tokens: 0 for the target ids it lacks
            tb.q.zero_().index_copy_(1, tb.draft_to_target, draft.q)

    def accepted(self, b, tokens: torch.Tensor, positions: torch.Tensor, n: torch.Tensor,
                 features: torch.Tensor) -> None:
        """The drafter next pairs the emitted tokens [R+1] with this verification's features
        [1, R+1, F], at `positions` [1, R+1]; n: [] the accepted count (the last emitted's index)."""
        s = b.draft
        s.catch_tokens[0].copy_(tokens)
        s.catch_positions.copy_(positions)
        s.catch_last.copy_(n.view(1))
        s.catch_features.copy_(features)

    def chain_candidates(self, b):
        """The drafter's candidates at every chain draft position, in one softmax and one top-k:
        (q of each draft [k], the top TOP_SHOWN ids [k, TOP_SHOWN] and their q)."""
        s = b.draft
        q = torch.softmax(s.chain_logits.float(), dim=-1)  # [k, Vd]
        draft_q = q.gather(1, s.chain_logits.argmax(-1, keepdim=True)).view(-1)  # [k] q of each draft
        q_values, q_top = row_topk(q, TOP_SHOWN)
        return draft_q, self.drafter.to_target(q_top), q_values


def stage_tree(b, tokens: torch.Tensor, parents: torch.Tensor, depths: torch.Tensor, logq: torch.Tensor,
               q_row: torch.Tensor, attend: int | None) -> None:
    """A drafted tree into the verification's buffers: tokens [W] at positions root + depth, in slots
    root .. root + N, under its attention mask over the `attend` slots (the cache's without it);
    parents, depths, log q and q rows [W] for the acceptance test. Any proposer's tree stages so."""
    tb, shape, dev = b.tree, b.shape, tokens.device
    b.verify_tokens.copy_(tokens.view(1, -1))
    b.verify_positions.copy_((tb.root_slot + depths).view(1, -1))
    tb.verify_slots.copy_((tb.root_slot + torch.arange(shape.width, device=dev)).view(1, -1))
    S = tb.verify_mask.shape[-1] if attend is None else attend  # the slots the verification attends over
    if tb.verify_mask.dtype == torch.int32:  # in slot order here, with the drafting (compiled), not in the forward
        mask = tree_seen_slots(parents, depths, shape.reach, tb.root_slot.view(()), S)
    else:
        mask = tree_attention_mask(parents, shape.reach, tb.root_slot.view(()), S)  # [1, 1, W, S] bool
    tb.verify_mask[..., :S].copy_(mask)
    tb.parents.copy_(parents)
    tb.depths.copy_(depths)
    tb.draft_logq.copy_(logq)
    tb.q_row.copy_(q_row)
