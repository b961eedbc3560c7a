"""Every rule at T > 0 emits exactly the target's distribution, and the test that says so can fail.

Drafts come from the engine's own drafting (demo/tree.py: the drafter's top choices, i.i.d. draws
from q, or draws without replacement, each tree pruned to num_draft_tokens) and are verified by the
engine's own rules (demo/tree_verify.py), over many draws at once (torch.vmap). Pearson's chi-square
test compares the first two emitted tokens with the target's joint; the same test rejects each rule
given a wrong residual or biased drafts.

The target is a Markov chain over 6 tokens: p(next | previous token) is the table P, so row i of a
tree's probs is P[tokens[i]], the drafter's q at a node is Q[its token], and the first two emitted
tokens have the joint P[root, t1] * P[t1, t2]. When a step emits only t1, the next step (drafted or
not) must emit P[t1], so t2 is drawn from it directly: a lossless rule matches the joint whatever it
accepts.
"""

import torch

from demo.config import DraftShape, Rule, TreeShape
from demo.tree import best_in_order, draft_tree
from demo.proposers.ngram import graft_branch
from demo.tree_verify import tree_pointmass_rule, tree_q_rule, tree_wor_rule

V, ROOT, DRAWS = 6, 2, 30000
ALPHA = 1e-3  # a correct rule fails at one seed in a thousand; the seeds here are fixed
_g = torch.Generator().manual_seed(3)
P = torch.softmax(1.5 * torch.randn(V, V, generator=_g), -1)  # [V, V] the target
Q = torch.softmax(P.log() + torch.randn(V, V, generator=_g), -1)  # [V, V] a drafter close to it
JOINT = (P[ROOT][:, None] * P).flatten()  # [V*V]
DEPTH, TREE = 3, TreeShape(3, 9)  # 3 + 2 * 9 = 21 candidates, the best 8 verified


def chi_square_p_value(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's chi-square test of counts [C] against probs [C]: the probability that a sample of
    the same size from probs lies at least as far from them. Cells expected fewer than 5 times are
    pooled; a count in a cell of probability 0 gives 0."""
    counts, probs = counts.double(), probs.double()
    if (counts[probs == 0] > 0).any():
        return 0.0
    expected = probs * counts.sum()
    small = expected < 5
    observed = torch.cat((counts[~small], counts[small].sum().view(1)))
    expected = torch.cat((expected[~small], expected[small].sum().view(1)))
    observed, expected = observed[expected > 0], expected[expected > 0]
    stat = ((observed - expected) ** 2 / expected).sum()
    dof = observed.numel() - 1
    return torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), stat / 2).item()


def first_two_p_value(n: torch.Tensor, out: torch.Tensor, gen: torch.Generator) -> float:
    """n: [DRAWS], out: [DRAWS, D+1] -> the chi-square p-value of (t1, t2) against the target's joint."""
    t1 = out[:, 0]
    next_step = torch.multinomial(P[t1], 1, generator=gen).squeeze(1)  # after a step that emits one
    t2 = torch.where(n >= 1, out[:, 1], next_step)
    return chi_square_p_value(torch.bincount(t1 * V + t2, minlength=V * V), JOINT)


class MarkovDrafter:
    """The drafter contract demo/tree.py drafts through: q at a node is Q[its token]."""

    def __init__(self, table: torch.Tensor):
        self.logits = table.log()

    def forward(self, tokens, positions, hidden, slots=None, mask=None, logits=True, attend=None):
        return self.logits[tokens], hidden  # [1, F, V]

    def to_target(self, ids):
        return ids


def drafted(shape: DraftShape, gen: torch.Generator, table: torch.Tensor = Q):
    """DRAWS trees drafted by demo.tree.draft_tree from `table` at T = 1 -> (tokens, parents, depths [B, N+1],
    q [B, R, V], q_row [B, N+1], draft_logq [B, N+1]); the top choices are one tree (no B, q None)."""
    def one(uniforms):
        t = draft_tree(MarkovDrafter(table), shape, torch.tensor([ROOT]), table[ROOT].log(), torch.zeros(1),
                       torch.tensor(0), 0, uniforms, torch.ones(1))
        return t.tokens, t.parents, t.depths, t.q, t.q_row, t.draft_logq
    if not shape.sampled:
        return one(None)
    size = (shape.depth, shape.topk, V) if shape.without_replacement else (shape.depth, shape.topk ** 2)
    return torch.vmap(one)(torch.rand(DRAWS, *size, generator=gen))


def draws(gen: torch.Generator, n_drafts: int):
    u = torch.rand(DRAWS, n_drafts, generator=gen)  # [DRAWS, N] one per draft
    noise = torch.empty(DRAWS, V).exponential_(generator=gen)  # [DRAWS, V]
    return u, noise


def from_p_after_rejection(n: torch.Tensor, out: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """A wrong residual: the target's own token drawn from its full row, rejected drafts included."""
    previous = torch.where(n >= 1, out.gather(1, (n - 1).clamp(min=0)[:, None]).squeeze(1), ROOT)
    return out.scatter(1, n[:, None], (P[previous] / noise).argmax(1, keepdim=True))


def test_pointmass_trees_emit_the_targets_distribution_and_the_test_rejects_wrong_rules():
    gen = torch.Generator().manual_seed(0)
    shape = DraftShape.of(DEPTH, TREE)
    tokens, parents, depths, *_ = drafted(shape, gen)
    u, noise = draws(gen, shape.nodes)
    rule = torch.vmap(tree_pointmass_rule, in_dims=(None, None, None, None, None, 0, 0))
    probs = P[tokens]  # [N+1, V]
    n, _, out = rule(tokens, parents, depths, probs, DEPTH, u, noise)
    assert (n >= 2).float().mean() > 0.2  # the second token often comes from a depth-2 acceptance
    assert first_two_p_value(n, out, gen) > ALPHA
    # wrong residual: after every child failed, sample the full row (the rejected drafts come back)
    assert first_two_p_value(n, from_p_after_rejection(n, out, noise), gen) < ALPHA
    # wrong acceptance: each sibling tried with p(x), not p(x) / (the mass left after the earlier
    # ones); the same rule fed u / left accepts iff u < p(x)
    idx = torch.arange(len(parents))
    earlier = (parents[:, None] == parents[None, :]) & (idx[None, :] < idx[:, None]) & (idx[None, :] >= 1)
    left = 1 - (earlier * probs[parents, tokens][None, :]).sum(1)  # [N+1]
    n, _, out = rule(tokens, parents, depths, probs, DEPTH, u / left[1:], noise)
    assert first_two_p_value(n, out, gen) < ALPHA


def test_a_pointmass_tree_with_a_lookup_branch_emits_the_targets_distribution():
    # a lookup branch is a function of the text before the step, so to the rule it is more deterministic
    # drafts: hung past the tree's first node (the walk follows it), it adds depth-2 to depth-6 nodes
    gen = torch.Generator().manual_seed(1)
    shape = DraftShape.of(DEPTH, TREE)
    tokens, parents, depths, *_ = drafted(shape, gen)
    lookup = 3
    branch = torch.cat((tokens[1:2], torch.tensor([0, 4, 1, 5])))  # [DEPTH + lookup]
    tokens, parents, depths = graft_branch(tokens, parents, depths, branch, DEPTH, lookup)
    reach = DEPTH + lookup
    u, noise = draws(gen, tokens.shape[0] - 1)
    rule = torch.vmap(tree_pointmass_rule, in_dims=(None, None, None, None, None, 0, 0))
    n, _, out = rule(tokens, parents, depths, P[tokens], reach, u, noise)
    assert (n > DEPTH).any()  # some draws accept past the drafter's depth, along the branch
    assert first_two_p_value(n, out, gen) > ALPHA
    assert first_two_p_value(n, from_p_after_rejection(n, out, noise), gen) < ALPHA


def _run(rule, tokens, parents, depths, q, q_row, gen):
    u, noise = draws(gen, tokens.shape[1] - 1)
    return torch.vmap(rule, in_dims=(0, 0, 0, 0, 0, 0, None, 0, 0, None))(
        tokens, parents, depths, P[tokens], q, q_row, DEPTH, u, noise, TREE.topk) + (noise,)


def told(q: torch.Tensor, drawn_from: torch.Tensor, claimed: torch.Tensor) -> torch.Tensor:
    """q [B, R, V], rows of the table `drawn_from` -> the rows of `claimed` at the same tokens: what
    a rule is told when the drafts came from another drafter than the one it believes."""
    token = (q[:, :, None, :] - drawn_from[None, None]).abs().sum(-1).argmin(-1)  # [B, R]
    return claimed[token]


def test_q_trees_pruned_to_num_draft_tokens_emit_the_targets_distribution_and_the_test_rejects_wrong_rules():
    gen = torch.Generator().manual_seed(1)
    shape = DraftShape.of(DEPTH, TREE, Rule.Q)
    assert shape.nodes < shape.candidates
    tokens, parents, depths, q, q_row, _ = drafted(shape, gen)
    n, _, out, noise = _run(tree_q_rule, tokens, parents, depths, q, q_row, gen)
    assert (n >= 2).float().mean() > 0.2
    assert first_two_p_value(n, out, gen) > ALPHA
    # wrong residual: after every child failed, sample p rather than what max(0, p - q) left
    assert first_two_p_value(n, from_p_after_rejection(n, out, noise), gen) < ALPHA
    # biased drafts: drawn from a sharper drafter than the q the rule is told
    sharp = torch.softmax(3 * Q.log(), -1)
    tokens, parents, depths, q, q_row, _ = drafted(shape, gen, sharp)
    n, _, out, _ = _run(tree_q_rule, tokens, parents, depths, told(q, sharp, Q), q_row, gen)
    assert first_two_p_value(n, out, gen) < ALPHA


def pruned_by_own_draws(tokens, parents, depths, q_row, logq, n: int):
    """A biased pruning of one full tree [N+1 each]: its n best nodes by the log q of their own
    drawn tokens along the path (a greedy tree's score), where a sampled tree must not look at them."""
    path_logq = logq
    for _ in range(DEPTH):
        path_logq = logq + path_logq[parents]  # [N+1] (the root's logq is 0)
    keep = torch.cat((torch.zeros(1, dtype=torch.int64), best_in_order(path_logq[1:], n) + 1))  # [n+1]
    node_of = torch.zeros_like(parents).scatter(0, keep, torch.arange(n + 1))
    return tokens[keep], node_of[parents[keep]], depths[keep], q_row[keep]


def test_wor_trees_pruned_to_num_draft_tokens_emit_the_targets_distribution_and_the_test_rejects_wrong_rules():
    gen = torch.Generator().manual_seed(2)
    shape = DraftShape.of(DEPTH, TREE, Rule.WOR)
    tokens, parents, depths, q, q_row, _ = drafted(shape, gen)
    siblings = (parents[:, :, None] == parents[:, None, :]) & ~torch.eye(shape.nodes + 1, dtype=torch.bool)
    siblings[:, 0] = siblings[:, :, 0] = False  # [B, N+1, N+1]: two drafts of one parent
    assert not (siblings & (tokens[:, :, None] == tokens[:, None, :])).any()  # drawn without replacement
    n, _, out, noise = _run(tree_wor_rule, tokens, parents, depths, q, q_row, gen)
    assert (n >= 2).float().mean() > 0.2
    assert first_two_p_value(n, out, gen) > ALPHA
    # wrong residual: q left as it was after a rejection (SpecInfer's rule, exact for i.i.d. siblings only)
    n, _, out, _ = _run(tree_q_rule, tokens, parents, depths, q, q_row, gen)
    assert first_two_p_value(n, out, gen) < ALPHA
    # biased drafts: the full tree pruned by the drafted tokens' own log q, which keeps likelier draws
    full = DraftShape.of(DEPTH, TreeShape(TREE.topk, 0), Rule.WOR)
    tokens, parents, depths, q, q_row, logq = drafted(full, gen)
    tokens, parents, depths, q_row = torch.vmap(pruned_by_own_draws, in_dims=(0, 0, 0, 0, 0, None))(
        tokens, parents, depths, q_row, logq, shape.nodes)
    n, _, out, _ = _run(tree_wor_rule, tokens, parents, depths, q, q_row, gen)
    assert first_two_p_value(n, out, gen) < ALPHA
