"""python -m demo.perf takes one decoding step apart on any engine (here a tiny one on the CPU)."""

import pytest

from demo.engine import Engine, GenerationConfig
from demo.perf import PHASES, format_profile, profile_step
from demo.target import Target
from demo.tree import TreeShape
from tests.tiny import tiny_drafter, tiny_hf


@pytest.mark.parametrize("tree", [None, TreeShape(2, 6)], ids=["chain", "tree"])
def test_a_step_profile_counts_the_work_of_every_phase_in_step_order(tree):
    target = Target(tiny_hf("llama"))
    engine = Engine(target, tiny_drafter("eagle3", target), max_context=128)
    gen = GenerationConfig(max_new_tokens=8, num_spec_tokens=3, tree=tree, stop_token_ids=())
    profile = profile_step(engine, [1, 17, 99, 4], gen)
    assert [p.name for p in profile.phases] == list(PHASES)
    assert all(p.kernels > 0 and p.kernel_ms > 0 and p.top for p in profile.phases)
    verify = next(p for p in profile.phases if p.name == "verify")
    assert verify.kernels > next(p for p in profile.phases if p.name == "catch_up").kernels  # 2 layers vs 1
    assert profile.step_graph_ms is None and profile.prefill_rows == 4  # eager on a CPU: no graphs, no padding
    text = format_profile(profile, "title")
    assert all(name in text for name in PHASES)


def test_target_only_profiles_verification_and_acceptance_only():
    engine = Engine(Target(tiny_hf("llama")), None, max_context=64)
    profile = profile_step(engine, [1, 2, 3], GenerationConfig(max_new_tokens=4, num_spec_tokens=0, stop_token_ids=()))
    assert [p.name for p in profile.phases] == ["verify", "accept"]
