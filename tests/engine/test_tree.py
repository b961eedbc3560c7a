"""Draft trees (demo/tree.py and the engine's tree path): greedy output is the target's own, a
top-1 tree is the chain, a wider tree accepts what the chain rejects, the tree's mask and positions
give every node the logits of its own path, pruning keeps ancestors, and sampled trees keep the
target's distribution. Tiny random models on the CPU."""

import pytest
import torch

from demo.accept import SAMPLED_TREE_RULES
from demo.config import MAX_TREE_TOPK, DraftShape, GenerationConfig, Rule, TreeShape
from demo.engine import Engine
from demo.target import Target
from demo.tree import ancestors, tree_attention_mask, tree_seen_slots
from demo.tree_verify import tree_q_rule
from tests.tiny import corrupted_oracle, hf_greedy, run, six_token_target, tiny_drafter, tiny_hf

PROMPT = [1, 17, 99, 4, 250, 31, 8]


def drafter_for(method, target, table):
    if method == "oracle":  # every 4th first choice wrong, the right token second
        return corrupted_oracle(table, target, every=4, skip=len(PROMPT) + 2, runner_up=True)
    return tiny_drafter(method, target, draft_vocab_size=128 if method == "eagle3" else 0)


SHAPES = [(1, TreeShape(2, 0)), (3, TreeShape(2, 0)), (4, TreeShape(3, 9)), (5, TreeShape(4, 12)),
          (6, TreeShape(1, 0))]


@pytest.mark.parametrize("method", ["eagle", "eagle3", "oracle"])
@pytest.mark.parametrize("depth, tree", SHAPES, ids=[f"D{d}-K{t.topk}-N{t.size}" for d, t in SHAPES])
def test_greedy_tree_output_is_the_targets_greedy_output_to_max_length(method, depth, tree):
    hf = tiny_hf("llama")
    ref = hf_greedy(hf, PROMPT, 40)
    target = Target(hf)
    engine = Engine(target, drafter_for(method, target, PROMPT + ref), max_context=128)
    tokens, events = run(engine, PROMPT, max_new_tokens=40, num_spec_tokens=depth, tree=tree, stop_token_ids=())
    assert tokens == ref
    assert events[-1].finish_reason == "length"
    assert all(e.num_accepted <= depth and len(e.tree.path) == e.num_accepted for e in events[1:])


@pytest.mark.parametrize("method", ["eagle3", "oracle"])
def test_greedy_tree_output_is_the_targets_greedy_output_ending_on_eos(method):
    hf = tiny_hf("qwen3", seed=3)
    free = hf_greedy(hf, PROMPT, 40)
    eos = free[17]  # pretend the 18th token is the end of sequence
    ref = hf_greedy(hf, PROMPT, 40, eos=eos)
    target = Target(hf)
    engine = Engine(target, drafter_for(method, target, PROMPT + free), max_context=128)
    tokens, events = run(engine, PROMPT, max_new_tokens=40, num_spec_tokens=4, tree=TreeShape(3, 10),
                         stop_token_ids=(eos,))
    assert tokens == ref and events[-1].finish_reason == "stop"


@pytest.mark.parametrize("method", ["eagle", "eagle3", "oracle"])
def test_a_top1_tree_gives_the_chains_tokens_and_counts(method):
    hf = tiny_hf("llama")
    ref = hf_greedy(hf, PROMPT, 40)
    target = Target(hf)
    engine = Engine(target, drafter_for(method, target, PROMPT + ref), max_context=128)
    chain, chain_events = run(engine, PROMPT, max_new_tokens=40, num_spec_tokens=5, stop_token_ids=())
    tree, tree_events = run(engine, PROMPT, max_new_tokens=40, num_spec_tokens=5, tree=TreeShape(1, 0),
                            stop_token_ids=())
    assert tree == chain
    assert [e.num_accepted for e in tree_events] == [e.num_accepted for e in chain_events]
    assert [e.draft_ids for e in tree_events] == [e.draft_ids for e in chain_events]
    assert tree_events[-1].stats.summary()["acceptance_per_position"] == \
        chain_events[-1].stats.summary()["acceptance_per_position"]


def test_a_wider_tree_accepts_the_runner_up_the_chain_rejects():
    hf = tiny_hf("llama")
    ref = hf_greedy(hf, PROMPT, 60)
    target = Target(hf)
    engine = Engine(target, drafter_for("oracle", target, PROMPT + ref), max_context=160)
    _, chain = run(engine, PROMPT, max_new_tokens=60, num_spec_tokens=6, stop_token_ids=())
    tokens, tree = run(engine, PROMPT, max_new_tokens=60, num_spec_tokens=6, tree=TreeShape(2, 0),
                       stop_token_ids=())
    assert tokens == ref
    # the chain stops at every 4th position; the tree takes the second child there
    assert tree[-1].stats.mean_acceptance_length > chain[-1].stats.mean_acceptance_length + 1.5
    def sibling_rank(tree, node):  # 0: its parent's first child (the drafter's first choice), 1: the second
        return [i for i, p in enumerate(tree.parents, 1) if p == tree.parents[node - 1]].index(node)
    assert any(sibling_rank(e.tree, node) == 1 for e in tree[1:] for node in e.tree.path)


def _tree_of(engine, depth, tree, prompt=PROMPT):
    """Run the prefill and one tree draft by hand; returns the engine's step buffers."""
    shape = DraftShape.of(depth, tree)
    b = engine.prepare(shape)
    with torch.inference_mode():
        engine._prefill(b, prompt, GenerationConfig().sampling, None)
        engine.propose(b)
    return b


def test_every_tree_node_gets_the_logits_of_its_own_path():
    hf = tiny_hf("llama")
    target = Target(hf)
    engine = Engine(target, tiny_drafter("eagle3", target), max_context=128)
    b = _tree_of(engine, 4, TreeShape(3, 14))
    with torch.inference_mode():
        logits, _ = engine.verify(b)
    tokens, parents = b.verify_tokens[0].tolist(), b.tree.parents.tolist()
    for i in range(len(tokens)):  # a naive reference: the prompt, then the node's path, in one causal forward
        path, j = [], i
        while j:
            path.append(tokens[j])
            j = parents[j]
        seq = PROMPT + [tokens[0]] + path[::-1]
        want = hf(torch.tensor([seq])).logits[0, -1]
        assert torch.allclose(logits[0, i], want, atol=1e-4), i


def test_tree_positions_are_root_plus_depth_and_the_mask_shows_each_node_its_ancestors():
    hf = tiny_hf("llama")
    target = Target(hf)
    engine = Engine(target, tiny_drafter("eagle", target), max_context=96)
    b = _tree_of(engine, 5, TreeShape(3, 16))
    root = len(PROMPT)
    parents = b.tree.parents.tolist()
    depth = [0] * len(parents)
    for i in range(1, len(parents)):
        assert parents[i] < i
        depth[i] = depth[parents[i]] + 1
    assert b.verify_positions[0].tolist() == [root + d for d in depth]
    assert b.tree.verify_slots[0].tolist() == list(range(root, root + len(parents)))
    mask = b.tree.verify_mask[0, 0]
    for i in range(len(parents)):
        seen, j = {root + i}, i
        while j:
            j = parents[j]
            seen.add(root + j)
        want = set(range(root)) | seen
        assert set(torch.nonzero(mask[i]).view(-1).tolist()) == want, i


def test_pruning_keeps_every_ancestor_and_orders_siblings_by_the_drafters_score():
    hf = tiny_hf("llama")
    target = Target(hf)
    drafter = tiny_drafter("eagle3", target)
    engine = Engine(target, drafter, max_context=96)
    for nodes in (6, 11, 20):
        b = _tree_of(engine, 4, TreeShape(4, nodes + 1))
        parents = b.tree.parents.tolist()
        logq = b.tree.draft_logq.tolist()
        assert len(parents) == nodes + 1 and all(parents[i] < i for i in range(1, len(parents)))
        for p in set(parents[1:]):
            kids = [i for i in range(1, len(parents)) if parents[i] == p]
            assert [logq[i] for i in kids] == sorted((logq[i] for i in kids), reverse=True)


def test_the_best_n_by_rank_are_what_a_stable_sort_keeps_in_index_order(monkeypatch):
    from demo import tree as tree_module

    g = torch.Generator().manual_seed(0)
    for M, n in ((10, 3), (456, 95), (456, 455), (73, 1)):
        for scores in (torch.randn(M, generator=g),
                       torch.randint(-3, 1, (M,), generator=g).float(),  # many ties
                       torch.where(torch.rand(M, generator=g) < 0.3, float("-inf"), torch.randn(M, generator=g))):
            expected = torch.sort(torch.argsort(scores, descending=True, stable=True)[:n]).values
            assert torch.equal(tree_module.best_in_order(scores, n), expected), (M, n)
            monkeypatch.setattr(tree_module, "RANK_MAX_CANDIDATES", M - 1)  # the sorting path
            assert torch.equal(tree_module.best_in_order(scores, n), expected), (M, n)
            monkeypatch.undo()


def test_ancestors_and_the_mask_of_a_hand_made_tree():
    parents = torch.tensor([0, 0, 0, 1, 3])  # root -> 1 -> 3 -> 4, root -> 2
    anc = ancestors(parents, 3)
    assert anc[4].tolist() == [True, True, False, True, True]
    assert anc[2].tolist() == [True, False, True, False, False]
    mask = tree_attention_mask(parents, 3, torch.tensor(3), 10)[0, 0]
    # slots 0..2 are the committed text; the tree sits at slots 3..7
    assert mask[4].tolist() == [True] * 3 + [True, True, False, True, True] + [False, False]
    assert mask[0].tolist() == [True] * 4 + [False] * 6


def test_ancestors_of_random_trees_are_each_nodes_walk_to_the_root():
    g = torch.Generator().manual_seed(0)
    for n in (2, 9, 97):
        parents = torch.tensor([0] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, n)])
        depth = 0
        expected = torch.zeros(n, n, dtype=torch.bool)
        for i in range(n):  # walk up from each node
            j, steps = i, 0
            expected[i, j] = True
            while j:
                j, steps = int(parents[j]), steps + 1
                expected[i, j] = True
            depth = max(depth, steps)
        assert torch.equal(ancestors(parents, depth), expected)


def test_a_trees_seen_slots_are_its_masks_rows_in_slot_order():
    from demo.kernels.attend import seen_slots

    g = torch.Generator().manual_seed(1)
    for n, root, S in ((2, 0, 4), (9, 5, 20), (65, 200, 512), (97, 31, 128)):
        parents = torch.tensor([0] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, n)])
        depths = ancestors(parents, n).sum(-1) - 1  # ancestors-or-self, less the node itself
        depth = int(depths.max())
        expected = seen_slots(tree_attention_mask(parents, depth, torch.tensor(root), S))
        assert torch.equal(tree_seen_slots(parents, depths, depth, torch.tensor(root), S), expected), (n, root)


def test_a_tree_shape_that_cannot_be_drafted_is_refused():
    with pytest.raises(ValueError, match="verifies"):
        DraftShape.of(3, TreeShape(2, 20)).check()  # 2 + 2*4 = 10 candidates, 19 asked
    with pytest.raises(ValueError, match="top-k"):
        DraftShape.of(3, TreeShape(MAX_TREE_TOPK + 1, 64)).check()
    # every node of a sampled tree of depth 7 x top-8 is 393 tokens: the refusal names the flag and the most
    with pytest.raises(ValueError, match=r"not 393: .*num_draft_tokens \(--num-draft-tokens\) 256 or less"):
        DraftShape.drawn(7, TreeShape(8, 0), "q", temperature=1.0).check()
    DraftShape.drawn(7, TreeShape(8, 64), "q", temperature=1.0).check()  # the default tree's 64, sampled
    hf = tiny_hf("llama")
    target = Target(hf)
    engine = Engine(target, tiny_drafter("eagle", target), max_context=64)
    with pytest.raises(ValueError, match="context"):  # 40 + 20 + 1 + 12 verified per step > 64
        list(engine.generate(list(range(1, 41)), GenerationConfig(max_new_tokens=20, num_spec_tokens=3,
                                                                   tree=TreeShape(3, 13))))


@pytest.mark.parametrize("draft_sampling", ["q", "wor"])
def test_sampled_drafts_are_draws_from_q_in_a_tree_of_num_draft_tokens(draft_sampling):
    hf = tiny_hf("llama")
    target = Target(hf)
    engine = Engine(target, tiny_drafter("eagle", target), max_context=96)
    shape = DraftShape.drawn(3, TreeShape(3, 8), draft_sampling, temperature=1.0)
    assert shape.nodes == 7 < shape.candidates and shape.without_replacement == (draft_sampling == "wor")
    assert DraftShape.drawn(3, TreeShape(3, 0), draft_sampling, temperature=1.0).nodes == 3 + 2 * 9  # 0: every node
    b = engine.prepare(shape)
    with torch.inference_mode():
        engine._prefill(b, PROMPT, GenerationConfig(temperature=1.0).sampling, torch.Generator().manual_seed(0))
        b.tree.uniforms.uniform_(generator=torch.Generator().manual_seed(1))
        engine.propose(b)
    q = b.tree.q  # [R, V] rows are distributions over the target vocabulary
    assert torch.allclose(q.sum(-1), torch.ones(q.shape[0]))
    tokens, rows, parents, depths = b.verify_tokens[0], b.tree.q_row, b.tree.parents, b.tree.depths
    assert (q[rows[1:], tokens[1:]] > 0).all()  # every draft was a possible draw of its parent's q
    assert torch.equal(depths[1:], depths[parents[1:]] + 1)  # every kept node's parent is kept
    if draft_sampling == "wor":  # siblings drawn without replacement are distinct tokens
        pairs = {(p, t) for p, t in zip(parents[1:].tolist(), tokens[1:].tolist())}
        assert len(pairs) == shape.nodes


def _first_two_tokens(engine, prompt, runs, **gen):
    counts = torch.zeros(36)
    accepted = 0
    for seed in range(runs):
        cfg = GenerationConfig(max_new_tokens=2, temperature=1.0, seed=seed, stop_token_ids=(), **gen)
        events = list(engine.generate(prompt, cfg))
        t1, t2 = [t for e in events for t in e.token_ids][:2]
        counts[t1 * 6 + t2] += 1
        accepted += events[1].num_accepted
    return counts, accepted


@pytest.mark.parametrize("gen", [dict(num_spec_tokens=2, tree=TreeShape(3, 0), draft_sampling="pointmass"),
                                 dict(num_spec_tokens=2, tree=TreeShape(2, 0), draft_sampling="q"),
                                 dict(num_spec_tokens=2, draft_sampling="q")],
                         ids=["pointmass-tree", "q-tree", "q-chain"])
def test_sampled_trees_emit_the_targets_joint_distribution(gen, monkeypatch):
    hf, target, prompt, joint = six_token_target()
    engine = Engine(target, tiny_drafter("eagle", target, seed=5), max_context=48)
    counts, accepted = _first_two_tokens(engine, prompt, 2000, **gen)
    assert accepted > 300  # the second token went through accepted drafts as well as rejections
    tv = lambda c: 0.5 * (c / c.sum() - joint).abs().sum().item()  # noqa: E731
    assert tv(counts) < 0.075  # 2000 draws over 36 cells: a correct sampler sits near 0.045
    # the check has the power to catch a wrong rule: accepting every sampled draft emits q, not p
    if gen.get("draft_sampling") == "q":
        monkeypatch.setitem(SAMPLED_TREE_RULES, Rule.Q, lambda tokens, parents, depths, probs, q, *rest, **kw:
                            tree_q_rule(tokens, parents, depths, probs, torch.zeros_like(q), *rest, **kw))
        wrong, _ = _first_two_tokens(engine, prompt, 2000, **gen)
        assert tv(wrong) > 0.1
