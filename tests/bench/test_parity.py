"""The parity check (demo/bench/parity.py) and the bench's capture lab flags: equal counts are called
equal; differing ones are named by draft position and by how much; a run of other prompts is refused;
``--fault`` and ``--check-parity`` refuse what they cannot check; and measured through the bench's own
loop, a faulted run keeps the text while the check names the fall. No weights, no GPU."""

from __future__ import annotations

import pytest

from demo.bench.tools import cli as bench
from demo.bench.capture_lab import lab_around
from demo.bench.config import BenchConfig
from demo.bench.measure import measure
from demo.bench.parity import parity, parity_cell, parity_sentence
from demo.bench.report import format_report
from demo.engine import Engine
from demo.models.prompts import chat_ids
from tests.tiny import FeatureOracle, run, tiny_target
from tests.tiny_chat import byte_tokenizer


def report(per_prompt: list[tuple[int, list[int]]], tokens: list[list[int]]) -> dict:
    """A bench report of prompts whose runs took `drafting steps` and accepted `[steps with >= i drafts]`."""
    records = [{"question_id": i, "turn": 1, "prompt_tokens": 9, "token_ids": t,
                "stats": {"num_drafts": steps, "num_accepted_tokens": sum(at),
                          "acceptance_per_position": [a / steps for a in at]}}
               for i, ((steps, at), t) in enumerate(zip(per_prompt, tokens))]
    totals = {"num_drafts": sum(s for s, _ in per_prompt),
              "num_accepted_tokens": sum(sum(at) for _, at in per_prompt),
              "accepted_per_position": [sum(col) for col in zip(*(at for _, at in per_prompt))]}
    return {"records": records, "totals": {"counts": totals}}


EAGER = report([(10, [8, 5, 2]), (6, [6, 6, 6])], [[1, 2, 3], [4, 5]])


def test_equal_counts_pass_the_parity_check():
    p = parity(EAGER, report([(10, [8, 5, 2]), (6, [6, 6, 6])], [[1, 2, 3], [4, 5]]))
    assert p["equal"] and p["positions"] == [] and p["prompts_differing"] == 0 and p["identical_text"] == 2
    assert parity_sentence(p) == ("parity: acceptance counts equal to eager's on 2 prompts (16 drafting steps, "
                                  "33 accepted drafts)")
    assert parity_cell(p) == "✓ equal to eager" and parity_cell(None) == "-"


def test_differing_counts_are_named_by_draft_position_and_by_how_many():
    # the second prompt drafted from stale features: 6 steps became 14, accepting little past draft 1
    p = parity(EAGER, report([(10, [8, 5, 2]), (14, [5, 1, 0])], [[1, 2, 3], [4, 5]]))
    assert not p["equal"] and p["prompts_differing"] == 1 and p["identical_text"] == 2
    assert p["positions"] == [{"draft": 1, "eager": 14, "captured": 13}, {"draft": 2, "eager": 11, "captured": 6},
                              {"draft": 3, "eager": 8, "captured": 2}]
    assert parity_sentence(p) == (
        "parity: differs from eager's on 1 of 2 prompts: accepted at draft 1 14 vs 13 (-1), draft 2 11 vs 6 (-5), "
        "draft 3 8 vs 2 (-6); 16 vs 24 drafting steps, mean acceptance length 3.06 vs 1.88; text identical on 2 of 2")
    assert parity_cell(p) == "✗ draft 1 -1, draft 2 -5, draft 3 -6; text identical 2/2"


def test_counts_moved_between_prompts_still_fail_the_check():
    # totals equal by chance, per prompt not: the check is per prompt too
    p = parity(EAGER, report([(6, [6, 6, 6]), (10, [8, 5, 2])], [[1, 2, 3], [4, 5]]))
    assert not p["equal"] and p["positions"] == [] and p["prompts_differing"] == 2


def test_runs_of_other_prompts_are_refused():
    other = report([(10, [8, 5, 2])], [[1, 2, 3]])
    with pytest.raises(ValueError, match="same prompts"):
        parity(EAGER, other)


@pytest.mark.parametrize("argv, message", [
    (["--check-parity"], "--check-parity holds a captured run's acceptance counts to eager's"),
    (["--fault", "stale-features", "--method", "none"], "--fault: a capture fault acts on the drafter's step"),
    (["--fault", "draft-shape", "--tree-topk", "2"], "--fault: the draft-shape fault replays a chain's drafting"),
    (["--fault", "none", "--check-parity", "--temperature", "0.7"], "--check-parity compares greedy runs"),
])
def test_capture_lab_flags_refuse_what_they_cannot_check(argv, message, capsys):
    assert bench.main(argv) == 2
    assert message in capsys.readouterr().err


def test_a_faulted_run_through_the_bench_keeps_the_text_and_its_parity_check_names_the_fall():
    hf, target = tiny_target("llama", vocab_size=258)
    tok = byte_tokenizer()
    question = {"question_id": 1, "category": "writing", "turns": ["Say a"]}
    ids = chat_ids(tok, [{"role": "user", "content": "Say a"}])
    reference, _ = run(Engine(target, None, max_context=256), ids, max_new_tokens=24, stop_token_ids=())
    engine = Engine(target, FeatureOracle(target, ids + reference, every=4), max_context=256)
    reports = {}
    for fault in ("none", "stale-features"):
        config = BenchConfig(method="eagle", num_spec_tokens=3, max_new_tokens=24, warmup=0, fault=fault,
                             check_parity=True, check_lossless=True)
        reports[fault] = measure(lab_around(engine, fault), tok, [question], config)
    clean, faulted = reports["none"]["totals"], reports["stale-features"]["totals"]
    assert clean["parity"]["equal"] and clean["lossless"]["identical"] == 1
    assert not faulted["parity"]["equal"] and faulted["lossless"]["identical"] == 1
    assert faulted["parity"]["identical_text"] == 1 and faulted["parity"]["positions"][0]["draft"] == 1
    text = format_report(reports["stale-features"])
    assert "capture lab: replayed, fault: stale features" in text.splitlines()[0]
    assert "parity: differs from eager's on 1 of 1 prompts: accepted at draft 1" in text
    assert BenchConfig(method="eagle", num_spec_tokens=3, fault="stale-features").label == \
        "EAGLE k=3 · replayed · fault: stale features"
