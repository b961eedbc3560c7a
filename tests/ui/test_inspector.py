"""One step taken apart (demo/ui/html/inspector.py): the rejected draft a step shows, each draft's verdict
under the three acceptance rules, and the inspector's HTML. Hand-made steps, no model."""

import re
from dataclasses import replace

import pytest

from demo.metrics import AcceptanceStats
from demo.service.chat import RunTrace, StepRecord
from demo.tree import DraftTree
from demo.ui.html.inspector import (
    GREEDY,
    HINT,
    POINTMASS,
    Q,
    WOR,
    acceptance_rule,
    positions,
    rejected_ids,
    rejected_nodes,
    rejected_texts,
    render_inspector,
    shown_ids,
)
from tests.html_text import shown

page = shown


TOP5 = [(90, 0.5), (91, 0.2), (92, 0.1), (93, 0.05), (94, 0.01)]


def chain_step(step=1, drafts=(10, 11, 12, 13), n=1, emitted=None, p=(0.6, 0.1, 0.3, 0.2), q=(0.7, 0.5, 0.4, 0.3)):
    """A chain of len(drafts): the first n accepted, then the target's own token 99."""
    emitted = list(drafts[:n]) + [99] if emitted is None else emitted
    k = len(drafts)
    tree = DraftTree(list(drafts), list(range(k)), list(q), list(p), list(range(1, n + 1)))
    return StepRecord(step, 5, list(drafts), n, emitted, [0.5] * len(emitted), False, 2.5, 7.25, 0.1, tree,
                      [TOP5] * len(emitted), [[(d, qq), *TOP5[:4]] for d, qq in zip(drafts, q)])


# A tree of depth 3 (nodes 1..6): the root's children 1 and 2; node 1's children 3 and 4; node 3's
# child 5; node 2's child 6. Tokens 20 + node.
TREE_PARENTS = [0, 0, 1, 1, 3, 2]


def tree_step(path, step=1, p=(0.3, 0.5, 0.2, 0.4, 0.9, 0.1), q=(0.6, 0.3, 0.5, 0.4, 0.8, 0.7), emitted=None):
    tokens = [20 + i for i in range(1, 7)]
    tree = DraftTree(tokens, list(TREE_PARENTS), list(q), list(p), list(path))
    emitted = [tokens[i - 1] for i in path] + [99] if emitted is None else emitted
    return StepRecord(step, 5, tokens, len(path), emitted, [0.5] * len(emitted), False, 3.0, 9.0, 0.1, tree,
                      [TOP5] * len(emitted), None)


def prefill():
    return StepRecord(0, -1, [], 0, [7], [0.9], False, 0.0, 30.0, 0.03, None, [TOP5], None)


def trace_of(*steps, temperature=0.0, draft_sampling="pointmass", method="eagle3"):
    return RunTrace(method, "eager", 4, AcceptanceStats(4), steps=[prefill(), *steps],
                    settings={"temperature": temperature, "draft_sampling": draft_sampling})


def test_a_chains_rejected_draft_is_every_draft_after_the_accepted_ones():
    step = chain_step(drafts=(10, 11, 12, 13), n=1)
    assert rejected_nodes(step) == [2, 3, 4]  # draft 2 was rejected; 3 and 4 go with it
    assert rejected_ids(step) == [11, 12, 13]


def test_a_trees_rejected_draft_is_the_first_child_at_each_depth_below_the_last_accepted_token():
    assert rejected_nodes(tree_step(path=[])) == [1, 3, 5]  # nothing accepted: the drafter's first line
    assert rejected_nodes(tree_step(path=[2])) == [6]  # node 2 accepted: its only child
    assert rejected_ids(tree_step(path=[1])) == [23, 25]  # node 1 accepted: 3 (before its sibling 4), then 5


def test_no_rejected_draft_when_every_draft_was_accepted_or_the_reply_ended_inside_the_step():
    assert rejected_nodes(chain_step(n=4)) == []
    assert rejected_nodes(tree_step(path=[1, 3, 5])) == []
    cut = chain_step(n=3, emitted=[10, 11])  # a stop token at draft 2: drafts 3 and 4 were never rejected
    assert rejected_nodes(cut) == []
    assert rejected_nodes(prefill()) == []


def test_rejected_texts_decode_each_steps_draft_as_one_sequence_in_one_call():
    calls = []

    def texts(drafts):
        calls.append(drafts)
        return ["".join(f"<{i}>" for i in ids) for ids in drafts]

    trace = trace_of(chain_step(1, n=1), chain_step(2, n=4), tree_step([2], step=3))
    assert rejected_texts(trace, texts) == {1: "<11><12><13>", 3: "<26>"}
    assert calls == [[[11, 12, 13], [26]]]
    assert rejected_texts(None, texts) == {}


def test_the_rule_comes_from_the_runs_temperature_and_draft_sampling():
    assert acceptance_rule({"temperature": 0.0, "draft_sampling": "q"}) == GREEDY
    assert acceptance_rule({"temperature": 0.8, "draft_sampling": "pointmass"}) == POINTMASS
    assert acceptance_rule({"temperature": 0.8, "draft_sampling": "q"}) == Q
    assert acceptance_rule({"temperature": 0.8, "draft_sampling": "wor"}) == WOR
    assert acceptance_rule({}) == GREEDY


def test_at_t0_each_draft_is_judged_against_the_targets_argmax():
    pos = positions(chain_step(n=1), GREEDY)
    assert [c.status for p in pos for c in p.drafts] == ["accepted", "rejected", "discarded", "discarded"]
    assert "= the target's argmax" in pos[0].drafts[0].why and "≠ the target's argmax" in pos[1].drafts[0].why
    tree = positions(tree_step(path=[2]), GREEDY)
    assert [[(c.token, c.status) for c in p.drafts] for p in tree] == [[(21, "rejected"), (22, "accepted")],
                                                                       [(26, "rejected")]]


def test_point_mass_siblings_are_accepted_with_p_over_the_mass_left():
    # root's children 1 (p 0.3) then 2 (p 0.5): 1 rejected, 2 tried against the 0.7 left
    first, second = positions(tree_step(path=[2]), POINTMASS)[0].drafts
    assert first.status == "rejected" and "accept with p(x) = 0.300 → rejected" in first.why
    assert second.status == "accepted" and "0.500 / 0.700 = 0.714 → accepted" in second.why
    # node 1 accepted first: its sibling 2 was never tried
    first, second = positions(tree_step(path=[1]), POINTMASS)[0].drafts
    assert first.status == "accepted" and second.status == "untried"
    chain = positions(chain_step(n=1, p=(0.6, 0.1, 0.3, 0.2)), POINTMASS)
    assert "accept with p(x) = 0.600" in chain[0].drafts[0].why and "p(x) = 0.100" in chain[1].drafts[0].why


def test_drafts_from_q_are_accepted_with_min_1_p_over_q():
    first, second = positions(tree_step(path=[], p=(0.3, 0.5, 0.2, 0.4, 0.9, 0.1), q=(0.6, 0.3, 0.5, 0.4, 0.8, 0.7)),
                              Q)[0].drafts
    assert "min(1, 0.300 / 0.600) = 0.500 → rejected" in first.why
    assert "against the residual" in second.why  # a later sibling meets what the first rejection left
    high = positions(tree_step(path=[1], p=(0.9, 0.5, 0.2, 0.4, 0.9, 0.1), q=(0.6, 0.3, 0.5, 0.4, 0.8, 0.7)), Q)
    assert "min(1, 0.900 / 0.600) = 1.000 → accepted" in high[0].drafts[0].why


def test_each_position_has_both_models_candidates_and_the_target_candidates_stop_after_the_emitted_tokens():
    pos = positions(chain_step(n=1), GREEDY)
    assert [p.depth for p in pos] == [1, 2, 3, 4]
    assert pos[0].drafter_top[0] == (10, 0.7) and pos[0].target_top == TOP5
    assert pos[1].target_top == TOP5 and pos[1].emitted[0] == 99  # the target's own token replaced draft 2
    assert pos[2].target_top is None and pos[2].emitted is None  # past the first rejection: not kept
    tree = positions(tree_step(path=[1]), GREEDY)
    assert tree[1].drafter_top == [(23, 0.5), (24, 0.4)]  # a tree's candidates are the path node's children


def test_a_fully_accepted_chain_ends_with_the_bonus_position():
    pos = positions(chain_step(n=4), GREEDY)
    assert [p.depth for p in pos] == [1, 2, 3, 4, 5]
    assert pos[-1].drafts == [] and "bonus" in pos[-1].emitted[2]


def test_the_inspector_shows_the_step_its_rule_candidates_emitted_token_and_times():
    texts = {i: f"t{i}" for i in range(100)}
    html = render_inspector(trace_of(chain_step(n=1)), 1, texts)
    shown = page(html)
    for words in ("Step 1", "draft 2.5 ms · verify 7.2 ms", "accepted 1 and emitted 2 tokens", "T = 0",
                  "drafter's top 5 (q)", "target's top 5 (p)", "t10", "t99", "q = 0.700", "p = 0.500",
                  "in place of the rejected draft"):
        assert words in shown.text, words
    buttons = {a["data-step"]: a for t, a in shown.tags if t == "button"}
    assert set(buttons) == {"0", "2", "-1"} and "disabled" in buttons["2"]  # previous, next (none yet), close
    assert ('div', {'class': 'sl-inspector', 'data-inspected': '1'}) in shown.tags


def test_the_inspector_of_the_prefill_shows_the_targets_first_choice_without_drafts():
    shown = page(render_inspector(trace_of(chain_step()), 0, {i: f"t{i}" for i in range(100)})).text
    assert "the prefill" in shown and "prefill 30.0 ms" in shown and "t7" in shown
    assert "drafter" not in shown and "accepted" not in shown


def test_inspector_shows_token_markup_as_text():
    html = render_inspector(trace_of(chain_step()), 1, {10: "<b>x</b>", 99: "{{v}} ${a}"})
    shown = page(html)
    assert "<b>x</b>" in shown.text and "{{v}}" in shown.text and "${a}" not in html
    plain = page(render_inspector(trace_of(chain_step()), 1, {10: "x", 99: "v"}))
    assert [t for t, _ in shown.tags] == [t for t, _ in plain.tags]  # no tag from a token's text


@pytest.mark.parametrize("step", [None, -1, 2, 7])
def test_without_a_step_to_show_the_inspector_says_how_to_open_one(step):
    assert HINT in page(render_inspector(trace_of(chain_step()), step, {})).text
    assert HINT in page(render_inspector(None, 1, {})).text


def test_shown_ids_cover_every_token_the_inspector_names():
    step = chain_step(n=1)
    ids = set(shown_ids(step))
    assert {10, 11, 12, 13, 99} | {t for t, _ in TOP5} <= ids


def test_a_lookup_branchs_nodes_are_named_copies_with_no_q_and_stay_out_of_the_drafters_candidates():
    # TREE_PARENTS, then a lookup branch of 2 hung on node 1 (nodes 7, 8), accepted along 1, 7, 8
    tokens = [20 + i for i in range(1, 9)]
    tree = DraftTree(tokens, TREE_PARENTS + [1, 7], [0.6, 0.3, 0.5, 0.4, 0.8, 0.7, 0.0, 0.0],
                     [0.3, 0.5, 0.2, 0.4, 0.9, 0.1, 0.8, 0.7], [1, 7, 8], copied=2)
    emitted = [21, 27, 28, 99]
    step = StepRecord(1, 5, tokens, 3, emitted, [0.5] * 4, False, 3.0, 9.0, 0.1, tree, [TOP5] * 4, None)
    at = positions(step, GREEDY)
    depth2 = {c.token: c for c in at[1].drafts}
    assert set(depth2) == {23, 24, 27} and depth2[27].copied and depth2[27].q is None
    assert "copied from the text" in depth2[27].why and depth2[27].status == "accepted"
    assert [t for t, _ in at[1].drafter_top] == [23, 24]  # the drafter's own candidates only
    assert "prompt lookup" in at[1].emitted[2] and "accepted draft 1" == at[0].emitted[2]
    html = page(render_inspector(trace_of(step), 1, {t: f"t{t}" for t in tokens + [99]})).text
    assert "the last 2 copied from the text" in html and "q = 0.000" not in html


def test_the_q_rule_shows_small_probabilities_with_significant_digits():
    # p = 2.1e-05 and q = 6.7e-04: at 3 decimals both read 0.000 and min(1, 0.000 / 0.000) means nothing
    first = positions(tree_step(path=[], p=(0.000021, 0.5, 0.2, 0.4, 0.9, 0.1), q=(0.00067, 0.3, 0.5, 0.4, 0.8, 0.7)),
                      Q)[0].drafts[0]
    assert "min(1, 2.1e-05 / 0.00067) = 0.031 → rejected" in first.why, first.why
    # under pointmass the mass left and the sibling's chance keep their digits too
    second = positions(tree_step(path=[2], p=(0.9996, 0.0004, 0.2, 0.4, 0.9, 0.1)), POINTMASS)[0].drafts[1]
    assert "= 0.0004 / 0.0004 = 1.000 → accepted" in second.why, second.why


def test_the_inspector_shows_every_small_p_and_q_with_significant_digits():
    tiny = [(90, 0.00003), *TOP5[1:]]
    step = replace(chain_step(n=0, p=(0.000021, 0.1, 0.3, 0.2), q=(0.00067, 0.5, 0.4, 0.3)),
                   token_probs=[0.000456], target_top=[tiny])
    shown = page(render_inspector(trace_of(step, temperature=0.8, draft_sampling="q"), 1,
                                  {i: f"t{i}" for i in range(100)})).text
    # p = 0.200 (TOP5's): from 0.001 up, 3 decimals as before
    for words in ("q = 0.00067 · p = 2.1e-05", "p = 3e-05", "q = 0.00067", "(p = 0.000456:", "p = 0.200"):
        assert words in shown, words
    assert not re.search(r"0\.000(?!\d)", shown), shown  # no value rounded to nothing
