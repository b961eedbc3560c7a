"""Tree verification rules (demo/tree_verify.py): greedy follows the target's argmax down the tree,
and the sampled rules emit exactly the target's distribution, with no host reads (drafted trees and
a chi-square test of every rule: test_rule_exactness.py)."""

import random

import pytest
import torch

from demo.sampling import verify_greedy, verify_sampled
from demo.tree_verify import (tree_pointmass_rule, tree_q_rule, tree_wor_rule, verify_tree_greedy,
                               verify_tree_pointmass, verify_tree_q, verify_tree_wor)


def _tree(parents, tokens):
    """Python lists -> (tokens, parents, depths) [N+1] int64 tensors, and the max depth D."""
    depths = [0]
    for i in range(1, len(parents)):
        depths.append(depths[parents[i]] + 1)
    return torch.tensor(tokens), torch.tensor(parents), torch.tensor(depths), max(depths)


def _logits_with_argmax(best, vocab=10):
    logits = torch.full((len(best), vocab), -5.0)
    logits[torch.arange(len(best)), torch.tensor(best)] = 5.0
    return logits


#          0 (9)
#        /       \
#     1 (4)       2 (5)
#     /   \          \
#  3 (1)  4 (2)     5 (6)
#                     |
#                   6 (7)
HAND = _tree(parents=[0, 0, 0, 1, 1, 2, 5], tokens=[9, 4, 5, 1, 2, 6, 7])


@pytest.mark.parametrize("best, n, path, out", [
    # the root's argmax 3 is neither child (4, 5): nothing accepted, the target's 3 follows
    ([3, 0, 0, 0, 0, 0, 0], 0, [0, 0, 0], [3]),
    # 5 -> node 2, 6 -> node 5, 7 -> node 6, a leaf: the bonus is the leaf's own argmax 8
    ([5, 0, 6, 0, 0, 7, 8], 3, [2, 5, 6], [5, 6, 7, 8]),
    # 4 -> node 1, then 2 -> node 4, node 1's 2nd child; node 4's row gives the bonus 3
    ([4, 2, 0, 0, 3, 0, 0], 2, [1, 4, 0], [4, 2, 3]),
    # 4 -> node 1; its row wants 0 (no child); node 5 matches row 2, but node 2 was rejected
    ([4, 0, 6, 0, 0, 7, 0], 1, [1, 0, 0], [4, 0]),
])
def test_greedy_accepts_the_path_of_argmax_children_then_the_targets_token(best, n, path, out):
    tokens, parents, depths, D = HAND
    got_n, got_path, got_out = verify_tree_greedy(tokens, parents, depths, _logits_with_argmax(best), D)
    assert got_n.item() == n and got_path.tolist() == path and got_out[:n + 1].tolist() == out


def test_greedy_on_a_chain_equals_verify_greedy():
    gen = torch.Generator().manual_seed(0)
    for k in range(6):
        _, parents, depths, D = _tree([0] + list(range(k)), [0] * (k + 1))
        for _ in range(20):
            logits = torch.randn(k + 1, 3, generator=gen)  # 3 tokens: drafts often match
            tokens = torch.randint(3, (k + 1,), generator=gen)
            n, path, out = verify_tree_greedy(tokens, parents, depths, logits, D)
            ref_n, ref_tokens = verify_greedy(tokens[1:], logits)
            assert n == ref_n and out[:n + 1].tolist() == ref_tokens[:n + 1].tolist()
            assert path[:n].tolist() == list(range(1, n + 1))


def _random_tree(rng: random.Random, n_drafts, max_depth, max_children, vocab):
    """A random tree of at most n_drafts drafts; siblings have distinct tokens."""
    parents, tokens, depths, kids = [0], [rng.randrange(vocab)], [0], [[]]
    for i in range(1, n_drafts + 1):
        open_nodes = [j for j in range(i) if depths[j] < max_depth and len(kids[j]) < max_children]
        if not open_nodes:
            break
        j = rng.choice(open_nodes)
        tokens.append(rng.choice([t for t in range(vocab) if t not in [tokens[c] for c in kids[j]]]))
        parents.append(j)
        depths.append(depths[j] + 1)
        kids[j].append(i)
        kids.append([])
    return parents, tokens


def _greedy_by_paths(parents, tokens, target_ids):
    """Naive reference: enumerate root-to-leaf paths, keep the longest accepted prefix."""
    children = [[c for c in range(1, len(parents)) if parents[c] == j] for j in range(len(parents))]
    best = []
    stack = [[0]]
    while stack:
        path = stack.pop()
        if children[path[-1]]:
            stack.extend(path + [c] for c in children[path[-1]])
            continue
        accepted = []
        for prev, node in zip(path, path[1:]):
            if tokens[node] != target_ids[prev]:
                break
            accepted.append(node)
        best = max(best, accepted, key=len)
    return best, target_ids[best[-1] if best else 0]


def test_greedy_matches_a_naive_per_path_reference_on_random_trees():
    rng = random.Random(0)
    gen = torch.Generator().manual_seed(0)
    for _ in range(300):
        parents, tokens = _random_tree(rng, rng.randrange(0, 13), rng.randrange(1, 5), rng.randrange(1, 4), 4)
        tok, par, dep, D = _tree(parents, tokens)
        logits = torch.randn(len(parents), 4, generator=gen)
        path, bonus = _greedy_by_paths(parents, tokens, logits.argmax(-1).tolist())
        n, got_path, out = verify_tree_greedy(tok, par, dep, logits, D)
        assert n.item() == len(path) and got_path.tolist() == path + [0] * (D - len(path))
        assert out.tolist() == [tokens[i] for i in path] + [bonus] + [0] * (D - len(path))


# --- statistical exactness: a Markov target over 6 tokens, its first two emitted tokens ----------
#
# p(next | previous token) is a fixed 6 x 6 table, so row i of probs is P[tokens[i]] and the exact
# joint of the first two emitted tokens is P[root, t1] * P[t1, t2]. When a step accepts nothing it
# emits only t1; the next step (drafted or not) must then emit P[t1], so t2 is drawn from it
# directly. A lossless rule therefore matches the joint, whatever it accepts.

V, ROOT, DRAWS = 6, 2, 40000
_g = torch.Generator().manual_seed(3)
P = torch.softmax(1.5 * torch.randn(V, V, generator=_g), -1)  # [V, V] the target
Q = torch.softmax(P.log() + torch.randn(V, V, generator=_g), -1)  # [V, V] a drafter close to it
JOINT = (P[ROOT][:, None] * P).flatten()  # [V*V]
# depth 3, 2-3 children: root has 3 children, each has 2, the first grandchild has 2
SHAPE = [0, 0, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4]


def _pointmass_tree():
    """SHAPE with EAGLE's drafts: the children of a node are the drafter's top tokens there."""
    tokens = [ROOT]
    for i, parent in enumerate(SHAPE[1:], start=1):
        rank = sum(1 for j in range(1, i) if SHAPE[j] == parent)
        tokens.append(Q[tokens[parent]].argsort(descending=True)[rank].item())
    return _tree(SHAPE, tokens)


def _q_trees(gen):
    """DRAWS trees of SHAPE, each node's children i.i.d. from the drafter at its parent's token
    -> tokens [DRAWS, N+1], q [DRAWS, N+1, V] (row j: the drafter after node j), q_row = parents."""
    tokens = torch.full((DRAWS, len(SHAPE)), ROOT)
    for i, parent in enumerate(SHAPE[1:], start=1):
        tokens[:, i] = torch.multinomial(Q[tokens[:, parent]], 1, generator=gen).squeeze(1)
    return tokens, Q[tokens], torch.tensor(SHAPE)


def _draws(gen, n_drafts):
    u = torch.rand(DRAWS, n_drafts, generator=gen)  # [DRAWS, N]
    noise = torch.empty(DRAWS, V).exponential_(generator=gen)  # [DRAWS, V]
    return u, noise


def _tv_of_first_two(n, out, gen):
    """n: [DRAWS], out: [DRAWS, D+1] -> total variation from the target's joint of two tokens."""
    t1 = out[:, 0]
    next_step = torch.multinomial(P[t1], 1, generator=gen).squeeze(1)  # after a step that emits one
    t2 = torch.where(n >= 1, out[:, 1], next_step)
    counts = torch.bincount(t1 * V + t2, minlength=V * V).float()
    return 0.5 * (counts / counts.sum() - JOINT).abs().sum().item()


def _from_p_after_rejection(n, out, noise):
    """A wrong rule: the target's own token drawn from its full row, rejected drafts included."""
    previous = torch.where(n >= 1, out.gather(1, (n - 1).clamp(min=0)[:, None]).squeeze(1), ROOT)
    return out.scatter(1, n[:, None], (P[previous] / noise).argmax(1, keepdim=True))


# 40000 draws over 36 cells: a correct rule lands near TV 0.01
TOLERANCE, DETECTED = 0.02, 0.04


def test_pointmass_rule_emits_the_targets_joint_and_the_check_catches_wrong_rules():
    tokens, parents, depths, D = _pointmass_tree()
    gen = torch.Generator().manual_seed(0)
    u, noise = _draws(gen, len(SHAPE) - 1)
    rule = torch.vmap(tree_pointmass_rule, in_dims=(None, None, None, None, None, 0, 0))
    probs = P[tokens]  # [N+1, V]
    n, path, out = rule(tokens, parents, depths, probs, D, u, noise)
    assert (n >= 2).float().mean() > 0.2  # the second token often comes from a depth-2 acceptance
    assert _tv_of_first_two(n, out, gen) < TOLERANCE
    # wrong: after every child failed, sample the full row (the rejected drafts come back)
    assert _tv_of_first_two(n, _from_p_after_rejection(n, out, noise), gen) > DETECTED
    # wrong: try each sibling with p(x) rather than p(x) / (mass left after the earlier siblings);
    # the same rule fed u / left accepts iff u < p(x)
    earlier = (parents[:, None] == parents[None, :]) & torch.ones(len(SHAPE), len(SHAPE)).tril(-1).bool()
    earlier[:, 0] = False
    left = 1 - (earlier * probs[parents, tokens][None, :]).sum(1)  # [N+1]
    n, _, out = rule(tokens, parents, depths, probs, D, u / left[1:], noise)
    assert _tv_of_first_two(n, out, gen) > DETECTED


def test_q_rule_emits_the_targets_joint_on_iid_trees_and_the_check_catches_a_wrong_residual():
    gen = torch.Generator().manual_seed(1)
    tokens, q, q_row = _q_trees(gen)
    _, parents, depths, D = _tree(SHAPE, [0] * len(SHAPE))
    u, noise = _draws(gen, len(SHAPE) - 1)
    rule = torch.vmap(tree_q_rule, in_dims=(0, None, None, 0, 0, None, None, 0, 0, None))
    n, path, out = rule(tokens, parents, depths, P[tokens], q, q_row, D, u, noise, 3)
    assert (n >= 2).float().mean() > 0.2
    assert _tv_of_first_two(n, out, gen) < TOLERANCE
    # wrong: after every child failed, sample p rather than the residual max(0, p - q)
    assert _tv_of_first_two(n, _from_p_after_rejection(n, out, noise), gen) > DETECTED


def _chains(gen: torch.Generator, draws: int = 30):
    """Chains of 0..5 drafts, `draws` random target distributions p [k+1, 5] over each."""
    for k in range(6):
        _, parents, depths, D = _tree([0] + list(range(k)), [0] * (k + 1))
        for draw in range(draws):
            yield k, parents, depths, D, draw, torch.softmax(2 * torch.randn(k + 1, 5, generator=gen), -1)


def test_pointmass_rule_on_a_chain_is_verify_sampled_draw_for_draw():
    gen = torch.Generator().manual_seed(0)
    for k, parents, depths, D, seed, probs in _chains(gen):
        tokens = torch.randint(5, (k + 1,), generator=gen)
        n, path, out = verify_tree_pointmass(tokens, parents, depths, probs, D, torch.Generator().manual_seed(seed))
        ref_n, ref = verify_sampled(tokens[1:], probs, torch.Generator().manual_seed(seed))
        assert n == ref_n and out[:n + 1].tolist() == ref[:n + 1].tolist()


def _speculative_sampling(drafts, p, q, u, noise):
    """Leviathan et al. 2023, written plainly: drafts [k] from q [k, V]; p [k+1, V]."""
    for i, x in enumerate(drafts.tolist()):
        if u[i] < p[i, x] / q[i, x]:
            continue
        residual = (p[i] - q[i]).clamp(min=0)
        return i, drafts[:i].tolist() + [(residual / residual.sum() / noise).argmax().item()]
    k = len(drafts)
    return k, drafts.tolist() + [(p[k] / noise).argmax().item()]


@pytest.mark.parametrize("rule", [tree_q_rule, tree_wor_rule], ids=["q", "wor"])
def test_sampled_rules_on_a_chain_are_standard_speculative_sampling_draw_for_draw(rule):
    gen = torch.Generator().manual_seed(0)
    for k, parents, depths, D, _, p in _chains(gen):
        q = torch.softmax(2 * torch.randn(max(k, 1), 5, generator=gen), -1)
        drafts = torch.multinomial(q, 1, generator=gen).squeeze(1)[:k]
        tokens = torch.cat((torch.zeros(1, dtype=torch.int64), drafts))
        q_row = (torch.arange(k + 1) - 1).clamp(min=0)  # draft i was drawn from q[i-1]
        u, noise = torch.rand(k, generator=gen), torch.empty(5).exponential_(generator=gen)
        n, path, out = rule(tokens, parents, depths, p, q, q_row, D, u, noise)
        ref_n, ref = _speculative_sampling(drafts, p, q, u, noise)
        assert n.item() == ref_n and out[:n + 1].tolist() == ref


def test_wor_rule_tries_each_sibling_against_what_the_earlier_rejections_left_of_p_and_q():
    # one node, two children x1 = 0 then x2 = 1, drawn without replacement from q
    p = torch.tensor([0.1, 0.5, 0.4])
    q = torch.tensor([0.5, 0.3, 0.2])
    tokens, parents, depths, D = _tree([0, 0, 0], [2, 0, 1])
    probs = torch.stack((p, p, p))
    q_row = torch.zeros(3, dtype=torch.int64)
    noise = torch.ones(3)
    # x1 = 0 is accepted with p(0) / q(0) = 0.2: u = 0.19 accepts it, u = 0.21 does not
    assert tree_wor_rule(tokens, parents, depths, probs, q[None], q_row, D, torch.tensor([0.19, 0.99]), noise)[0] == 1
    # after the rejection p2 = max(0, p - q) / 0.4 = (0, 0.5, 0.5) and q2 = q without 0 = (0, 0.6, 0.4):
    # x2 = 1 is accepted with min(1, 0.5 / 0.6) = 5/6 (SpecInfer's rule would use q(1) = 0.3 and accept always)
    for u2, accepted in ((0.83, True), (0.84, False)):
        n, path, out = tree_wor_rule(tokens, parents, depths, probs, q[None], q_row, D, torch.tensor([0.99, u2]), noise)
        assert (n.item() == 1 and path[0].item() == 2) == accepted
    # both rejected: what is left is p3 = max(0, p2 - q2) normalised = (0, 0, 1), so token 2 follows
    n, _, out = tree_wor_rule(tokens, parents, depths, probs, q[None], q_row, D, torch.tensor([0.99, 0.99]), noise)
    assert n.item() == 0 and out[0].item() == 2


@pytest.mark.parametrize("rule", [tree_q_rule, tree_wor_rule], ids=["q", "wor"])
def test_sampled_rules_max_children_bounds_only_the_loop(rule):
    rng = random.Random(1)
    gen = torch.Generator().manual_seed(1)
    for _ in range(40):
        parents, tokens = _random_tree(rng, 10, 3, 3, 6)
        tok, par, dep, D = _tree(parents, tokens)
        probs = torch.softmax(torch.randn(len(parents), 6, generator=gen), -1)
        q = torch.softmax(torch.randn(len(parents), 6, generator=gen), -1)
        u, noise = torch.rand(len(parents) - 1, generator=gen), torch.empty(6).exponential_(generator=gen)
        args = (tok, par, dep, probs, q, par, D, u, noise)
        assert all(torch.equal(a, b) for a, b in zip(rule(*args), rule(*args, max_children=3)))


def test_zero_mass_never_makes_nan_or_emits_an_impossible_token():
    tokens, parents, depths, D = _tree([0, 0, 0], [2, 0, 1])  # the root's two children: 0 and 1
    half = torch.tensor([0.5, 0.5, 0.0, 0.0])  # the children hold all the mass
    probs = torch.stack((half, half, half))
    drafts_impossible = torch.stack((torch.tensor([0.0, 0.0, 0.0, 1.0]), half, half))  # root: only 3
    q_row = torch.zeros(3, dtype=torch.int64)
    gen = torch.Generator().manual_seed(0)
    for _ in range(200):
        n, _, out = verify_tree_pointmass(tokens, parents, depths, probs, D, gen)
        assert n.item() == 1 and out[0].item() in (0, 1)  # one child is always accepted
        # q = p: no residual mass is ever left; q(x) = 0 for a token p holds: no division by zero
        for q in (half, torch.tensor([0.0, 0.0, 0.5, 0.5])):
            n, _, out = verify_tree_q(tokens, parents, depths, probs, torch.stack((q, q)), q_row, D, gen)
            assert n.item() == 1 and out[0].item() in (0, 1) and out[1].item() in (0, 1)
        # without replacement: q = p is always accepted; a child q cannot have drawn never is
        n, _, out = verify_tree_wor(tokens, parents, depths, probs, torch.stack((half, half)), q_row, D, gen)
        assert n.item() == 1 and out[0].item() in (0, 1) and out[1].item() in (0, 1)
        q = torch.tensor([0.0, 0.0, 0.5, 0.5])
        n, _, out = verify_tree_wor(tokens, parents, depths, probs, torch.stack((q, q)), q_row, D, gen)
        assert n.item() == 0 and out[0].item() in (0, 1) and not out.isnan().any()
        # drafts the target gives no mass are never accepted; what is left is still p
        q = torch.stack((half, half))
        for n, _, out in (verify_tree_pointmass(tokens, parents, depths, drafts_impossible, D, gen),
                          verify_tree_q(tokens, parents, depths, drafts_impossible, q, q_row, D, gen),
                          verify_tree_wor(tokens, parents, depths, drafts_impossible, q, q_row, D, gen)):
            assert n.item() == 0 and out[0].item() == 3


def _all_rules(tokens, parents, depths, probs, q, D, generator):
    q_row = torch.zeros_like(parents)
    return [verify_tree_greedy(tokens, parents, depths, probs, D),
            verify_tree_pointmass(tokens, parents, depths, probs, D, generator),
            verify_tree_q(tokens, parents, depths, probs, q, q_row, D, generator, max_children=2),
            verify_tree_wor(tokens, parents, depths, probs, q, q_row, D, generator, max_children=2)]


def test_rules_read_nothing_on_the_host_and_return_the_documented_shapes():
    # on the meta device any .item(), .tolist(), branch on a tensor value or data-dependent shape
    # (nonzero, boolean indexing) raises: the rules can run inside a captured CUDA graph
    tokens, parents, depths, D = HAND
    meta = [t.to("meta") for t in (tokens, parents, depths, torch.rand(7, 10), torch.rand(1, 10))]
    for n, path, out in _all_rules(*meta[:4], meta[4], D, None):
        assert n.shape == () and path.shape == (D,) and out.shape == (D + 1,)
        assert n.dtype == path.dtype == out.dtype == torch.int64


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_rules_capture_in_a_cuda_graph_and_replay_like_eager():
    tokens, parents, depths, D = (t.cuda() if torch.is_tensor(t) else t for t in HAND)
    probs = torch.softmax(torch.randn(7, 10, device="cuda"), -1)
    q = torch.softmax(torch.randn(1, 10, device="cuda"), -1)
    u, noise = torch.rand(6, device="cuda"), torch.empty(10, device="cuda").exponential_()
    pure = [lambda: verify_tree_greedy(tokens, parents, depths, probs, D),
            lambda: tree_pointmass_rule(tokens, parents, depths, probs, D, u, noise),
            lambda: tree_q_rule(tokens, parents, depths, probs, q, torch.zeros_like(parents), D, u, noise, 2),
            lambda: tree_wor_rule(tokens, parents, depths, probs, q, torch.zeros_like(parents), D, u, noise, 2)]
    torch.cuda.synchronize()
    for fn in pure:
        eager = fn()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = fn()
        graph.replay()
        assert all(torch.equal(a, b) for a, b in zip(eager, captured))
    graph = torch.cuda.CUDAGraph()  # and with their draws inside (the default CUDA generator)
    with torch.cuda.graph(graph):
        outs = _all_rules(tokens, parents, depths, probs, q, D, None)
    graph.replay()
    for n, path, out in outs:
        assert path.shape == (D,) and out.shape == (D + 1,) and 0 <= n.item() <= D


def _walk_node_by_node(tokens, parents, probs, q, q_row, u, noise, D, without_replacement):
    """The q and wor rules written plainly, one node at a time down the tree: (num_accepted, out)."""
    cur, out = 0, []
    for _ in range(D):
        kids = [c for c in range(1, len(parents)) if parents[c] == cur]
        p, qv, taken = probs[cur], (q[q_row[kids[0]]] if kids else None), None
        for c in kids:
            x = int(tokens[c])
            if (qv[x] > 0 or not without_replacement) and u[c - 1] * qv[x] < p[x]:
                taken = c
                break
            rest = (p - qv).clamp(min=0)
            p = rest / rest.sum() if rest.sum() > 0 else p
            if without_replacement:
                qv = qv.clone()
                qv[x] = 0
                qv = qv / qv.sum() if qv.sum() > 0 else qv
        if taken is None:
            return len(out), out + [int((p / noise).argmax())]
        out.append(int(tokens[taken]))
        cur = taken
    return len(out), out + [int((probs[cur] / noise).argmax())]


@pytest.mark.parametrize("without_replacement", [False, True], ids=["q", "wor"])
def test_sampled_tree_rules_decide_every_node_at_once_as_a_walk_down_the_tree_would(without_replacement):
    # the rules compute each node's residuals for all nodes together; a walk that computes them
    # only where it goes must emit the same tokens, draw for draw
    rule = tree_wor_rule if without_replacement else tree_q_rule
    gen, rng, V = torch.Generator().manual_seed(5), random.Random(5), 6
    accepted = 0
    for _ in range(300):
        parents = [0]
        for i in range(1, rng.randint(2, 12)):
            parents.append(rng.randrange(i))
        parents.sort()  # children after their parents, siblings in draw order
        tokens = [rng.randrange(V) for _ in parents]
        tokens_t, parents_t, depths_t, D = _tree(parents, tokens)
        probs = torch.softmax(2 * torch.randn(len(parents), V, generator=gen), -1)
        # a node was drawn from its parent's q row: one row per expanded node, in any order, and a
        # row no kept node was drawn from (as the engine's rows of pruned expansions)
        expanded = sorted(set(parents[1:]))
        row_of = dict(zip(expanded, rng.sample(range(len(expanded) + 1), len(expanded))))
        q = torch.softmax(2 * torch.randn(len(expanded) + 1, V, generator=gen), -1)
        q_row = [0] + [row_of[parent] for parent in parents[1:]]
        u, noise = torch.rand(len(parents) - 1, generator=gen), torch.empty(V).exponential_(generator=gen)
        kids = max(parents.count(i) for i in range(len(parents)))
        n, _, out = rule(tokens_t, parents_t, depths_t, probs, q, torch.tensor(q_row), D, u, noise, max_children=kids)
        ref_n, ref = _walk_node_by_node(tokens, parents, probs, q, q_row, u, noise, D, without_replacement)
        assert (int(n), out[:int(n) + 1].tolist()) == (ref_n, ref)
        accepted += ref_n
    assert accepted > 150  # the walks go deep enough to test the residuals of accepted nodes' children
