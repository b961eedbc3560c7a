"""The prompt-lookup estimate (demo.bench.tools.lookup): what a lookup copies, that a replay without a
branch gives the recorded steps back, that a branch shortens a reply that repeats itself, and that the
tool runs the bench's decode on a tiny model and refuses what it cannot measure."""

from __future__ import annotations

from demo.bench.tools import lookup
from demo.bench.tools.lookup import Recorded, continuation, mean_acceptance, replay
from tests.bench.test_bench import FAST, _drafter


def test_a_lookup_copies_what_followed_the_latest_occurrence_of_the_longest_suffix():
    context = [1, 2, 3, 9, 4, 2, 3, 7, 1, 2, 3, 8, 5, 1, 2, 3]
    # [1, 2, 3] last occurred ending at index 10 (the 2-gram [2, 3] later, at 6, is shorter):
    # the copy is 8, 5, 1, 2, 3, then the same span again where it reaches the end
    assert continuation(context, 7) == [8, 5, 1, 2, 3, 8, 5]
    assert continuation(context, 3, max_ngram=1) == [8, 5, 1]  # the 1-gram [3]: its latest occurrence
    assert continuation([1, 2, 3, 4], 3) == []  # nothing before repeats
    assert continuation([5, 5], 3) == [5, 5, 5]


def test_a_replay_without_a_branch_gives_the_recorded_steps_back():
    tokens = list(range(100, 129))
    steps = [(0, 3), (4, 0), (5, 6), (12, 2), (15, 7), (23, 5)]  # the last ends at the reply's end (29 tokens)
    r = Recorded([1, 2], tokens, steps)
    assert replay(r, 0) == (sum(a for _, a in steps), len(steps))
    assert mean_acceptance([r], 0) == 1 + 23 / 6


def test_a_lookup_branch_takes_fewer_steps_over_a_reply_that_repeats_itself():
    tokens = [7, 8, 9, 10] * 10  # a loop the lookup can copy once it has seen it
    steps = [(p, 1) for p in range(0, 40, 2)]  # a drafter that always gets one draft right
    r = Recorded([1, 2, 7, 8, 9, 10], tokens, steps)
    # step 1 has nothing to copy (the drafter's 1); from position 2 on the loop is in the text, and each
    # step copies the whole branch of 8, the last one the 2 tokens left
    assert replay(r, 8) == (1 + 8 + 8 + 8 + 8 + 2, 6)
    assert mean_acceptance([r], 8) > mean_acceptance([r], 0) == 2.0


def test_the_tool_decodes_with_the_bench_flags_and_prints_a_row_a_branch(models, capsys):
    argv = ["--branch", "4", "--branch", "8", "--target", str(models["target"]), "--method", "eagle3",
            "--drafter", _drafter(models, "eagle3"), *FAST, "-k", "2", "--tree-topk", "2", "--num-draft-tokens", "5",
            "--prompts", str(models["prompts"])]
    assert lookup.main(argv) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("|")]
    assert len(rows) == 2 + 1 + 2 and "lookup branch of 8" in rows[-1]


def test_the_tool_refuses_sampled_text_and_empty_branches(models, capsys):
    assert lookup.main(["--branch", "4", "--temperature", "1"]) == 2
    assert "T = 0" in capsys.readouterr().err
    assert lookup.main(["--branch", "0"]) == 2
    assert lookup.main(["--branch", "4", "-k", "-1"]) == 2  # the bench's own checks hold
    assert "error" in capsys.readouterr().err
