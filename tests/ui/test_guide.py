"""The guided reading (demo/ui/html/guide.py): a reply's first steps told from its own trace, what
was drafted, verified, accepted and added, on hand-made steps."""

from demo.metrics import AcceptanceStats
from demo.service.chat import RunTrace, StepRecord
from demo.tree import DraftTree
from demo.ui.html.guide import render_guide, tell_step

TEXT = {1: " The", 2: " cat", 3: " sat", 4: " lay", 5: " on", 6: " mat", 7: "\n"}


def record(step, drafts, parents, path, emitted, num_accepted) -> StepRecord:
    tree = DraftTree(drafts, parents, None, [0.5] * len(drafts), path) if drafts else None
    return StepRecord(step, 1, drafts, num_accepted, emitted, [0.5] * len(emitted), False, 1.0, 2.0, 0.1, tree, [],
                      None)


def test_a_chain_step_says_what_was_drafted_accepted_rejected_and_added():
    # drafts " cat" " sat" " on": the target keeps " cat", turns down " sat" and writes " lay"
    step = record(1, [2, 3, 5], [0, 1, 2], [1], [2, 4], 1)
    told = tell_step(step, TEXT)
    assert told.startswith("Step 1: the drafter proposed ‘ cat’ ‘ sat’ ‘ on’; the target checked 4 positions in one call")
    assert "agreed with ‘ cat’ but not with ‘ sat’; it added its own ‘ lay’ in its place" in told
    assert told.endswith("2 tokens for one target call.")


def test_a_fully_accepted_chain_gets_the_bonus_token_after_its_drafts():
    told = tell_step(record(2, [2, 3], [0, 1], [1, 2], [2, 3, 5], 2), TEXT)
    assert "agreed with ‘ cat’ ‘ sat’; it added its own ‘ on’ after them: 3 tokens" in told and "not with" not in told


def test_a_tree_step_names_the_path_and_a_step_the_reply_ended_inside_says_so():
    tree_step = record(3, [2, 4, 3, 6], [0, 0, 1, 2], [1, 3], [2, 3, 7], 2)
    assert "a tree of 4 tokens" in tell_step(tree_step, TEXT)
    cut = record(4, [2, 3, 5], [0, 1, 2], [1, 2, 3], [2, 3], 3)  # the budget ended the reply after two drafts
    told = tell_step(cut, TEXT)
    assert "agreed with ‘ cat’ ‘ sat’; the reply ended there: 2 tokens" in told and "added" not in told


def test_the_guide_tells_the_prefill_and_the_first_steps_or_the_step_in_focus():
    steps = [record(0, [], [], [], [1], 0)] + [record(i, [2, 3], [0, 1], [1], [2, 4], 1) for i in range(1, 6)]
    trace = RunTrace("eagle3", "eager", 2, AcceptanceStats(2), steps=steps)
    html = render_guide(trace, TEXT)
    assert html.count("<li>") == 4 and "The prefill: the target wrote its first token, ‘ The’." in html
    assert "step ▸" in html
    focused = render_guide(trace, TEXT, focus=5)
    assert focused.count("<li>") == 1 and "Step 5:" in focused
    assert render_guide(None, {}) == ""
