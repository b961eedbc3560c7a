"""A step's acceptance test on the device, after the verification forward: which drafts the target
accepts and which token it adds (the rules of demo/sampling.py for chains and demo/tree_verify.py for
trees), then the staging of the next step (the target's next root, the token history, what the
proposer reads: ``Proposer.accepted``) and the packed result the host reads (demo/step_result.py).

Both functions read and write only persistent buffers and caches, never sync with the host, and are
captured (and compiled) as they stand.
"""

from __future__ import annotations

import torch

from demo.config import Rule, SamplingParams
from demo.kernels.topk import row_topk
from demo.sampling import ShownProbs, sampled_rule, verify_greedy
from demo.step_buffers import StepBuffers
from demo.step_result import TOP_SHOWN, pack_result
from demo.tree import compact_path
from demo.tree_verify import tree_pointmass_rule, tree_q_rule, tree_wor_rule, verify_tree_greedy


def accept_chain(b: StepBuffers, proposer, logits: torch.Tensor, features: torch.Tensor, params: SamplingParams):
    """A chain's acceptance test (a target-only step's too: k = 0). logits: [1, W, V]; features: [1, W, F]."""
    k = b.k
    logits = logits[:, : k + 1]  # [1, k+1, V]: a padded target-only step's padding rows are dropped
    drafts = b.verify_tokens[0, 1 : k + 1]  # [k]
    shown = ShownProbs(logits[0], params)  # [k+1, V]
    if params.greedy:
        n, tokens = verify_greedy(drafts, logits[0])
    else:
        n, tokens = sampled_rule(drafts, shown.probs, b.draws.u, b.draws.noise)
    positions = torch.arange(k + 1, device=drafts.device)  # [k+1]
    token_probs = shown.at(positions, tokens)  # [k+1]
    draft_p = shown.at(positions[:k], drafts)  # [k] p of each draft at its position
    if b.history is not None:  # the emitted tokens at their positions (those past n are rewritten later)
        b.history.index_copy_(0, b.verify_positions[0, : k + 1] + 1, tokens)  # one past the root's
    if k:  # the proposer next reads these tokens and this verification's features, at their positions
        # (computed, not a view of verify_positions: inductor writes a mutated input back at the end
        # of the graph, so a view passed on to another input's copy_ would read it after the add_)
        proposer.accepted(b, tokens, b.verify_positions[:, :1] + positions, n, features)
    # the next verification starts from the target's own token, one past the last emitted
    b.verify_tokens[:, :1].copy_(tokens.index_select(0, n.view(1)).view(1, 1))
    b.verify_positions.add_(n + 1)
    chain = torch.arange(k, device=drafts.device)  # [k] node i+1's parent is node i
    top_values, top_ids = shown.top(positions, TOP_SHOWN)  # [k+1, TOP_SHOWN] at each emitted position
    if k:  # the proposer's candidates at every draft position
        draft_q, q_ids, q_values = proposer.chain_candidates(b)
    else:  # target only: no drafts
        draft_q, q_ids, q_values = draft_p, tokens.new_zeros(0, TOP_SHOWN), draft_p.new_zeros(0, TOP_SHOWN)
    b.result.copy_(pack_result(n, tokens, token_probs, chain + 1, drafts, chain, draft_q, draft_p,
                               top_ids, top_values, q_ids, q_values))

SAMPLED_TREE_RULES = {Rule.Q: tree_q_rule, Rule.WOR: tree_wor_rule}  # a tree of drafts drawn from q, by its rule


def accept_tree(b: StepBuffers, proposer, cache, logits: torch.Tensor, features: torch.Tensor,
                params: SamplingParams):
    """A tree's acceptance test; moves the accepted path's target K/V (in `cache`) next to the root,
    stages the proposer's next step over the path and the next root, and packs the result. D: the
    most a step accepts (a lookup branch reaches past the drafter's depth). logits: [1, W, V];
    features: [1, W, F]."""
    tb, shape, D, dev = b.tree, b.shape, b.shape.reach, logits.device
    tokens = b.verify_tokens[0]  # [W]
    shown = ShownProbs(logits[0], params)  # [W, V]
    if params.greedy:
        n, path, out = verify_tree_greedy(tokens, tb.parents, tb.depths, logits[0], D)
    elif shape.sampled:
        n, path, out = SAMPLED_TREE_RULES[shape.rule](tokens, tb.parents, tb.depths, shown.probs, tb.q, tb.q_row, D,
                                                      b.draws.u, b.draws.noise, max_children=shape.topk)
    else:
        n, path, out = tree_pointmass_rule(tokens, tb.parents, tb.depths, shown.probs, D, b.draws.u, b.draws.noise)
    rows = torch.cat((path.new_zeros(1), path))  # [D+1] the root, then the path's nodes
    token_probs = shown.at(rows, out)  # [D+1] each emitted token under the target at its parent
    root = tb.root_slot.view(())
    compact_path(cache, root, path)
    positions = (root + torch.arange(D + 1, device=dev)).view(1, -1)  # [1, D+1]
    proposer.accepted(b, out, positions, n, features.index_select(1, rows))  # [1, D+1, F]
    if b.history is not None:  # the emitted tokens at their positions (those past n are rewritten later)
        b.history.index_copy_(0, root + 1 + torch.arange(D + 1, device=dev), out)
    tb.root_token.copy_(out.index_select(0, n.view(1)))
    tb.root_slot.add_(n + 1)
    nodes = tokens[1:]  # [N]
    node_p = shown.at(tb.parents[1:], nodes)  # [N] p of each node's token at its parent
    top_values, top_ids = shown.top(rows, TOP_SHOWN)  # [D+1, TOP_SHOWN] at each emitted position
    if shape.sampled and shape.topk == 1:  # a sampled chain: node d was drawn from q row d - 1 (over the
        # target's vocabulary), whose likeliest tokens are the proposer's other candidates there
        q_values, q_ids = row_topk(tb.q.index_select(0, tb.q_row[1:]), TOP_SHOWN)  # [D, TOP_SHOWN]
    else:  # a tree's candidates are its siblings
        q_ids = q_values = torch.full((D, TOP_SHOWN), -1.0, device=dev)
    b.result.copy_(pack_result(n, out, token_probs, path, nodes, tb.parents[1:], tb.draft_logq[1:].exp(), node_p,
                               top_ids, top_values, q_ids, q_values))
