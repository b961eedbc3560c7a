"""python -m demo.perf takes one decoding step apart on any engine (here a tiny one on the CPU)."""

import pytest
import torch

from demo.bench.tools.perf import format_profile, profile_step
from demo.config import GenerationConfig, TreeShape
from demo.engine import PHASES, Engine
from demo.target import Target
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
    assert profile.step_graph_ms is None and profile.prefill_rows == 64  # a CPU: no graphs, a prompt of 64 rows
    text = format_profile(profile, "title")
    assert all(name in text for name in PHASES)


def test_a_tree_steps_profile_attends_over_every_slot_its_drafting_stages_wherever_the_reply_ends():
    # a tree's verification slots are staged by its drafting, after the attended window is chosen:
    # the window must be read off the next root, not off the last step's slots
    from demo.engine import ATTEND_ROUND

    target = Target(tiny_hf("llama"))
    engine = Engine(target, tiny_drafter("eagle3", target), max_context=256)
    gen = GenerationConfig(max_new_tokens=6, num_spec_tokens=2, tree=TreeShape(2, 6), stop_token_ids=())
    for length in range(ATTEND_ROUND - 14, ATTEND_ROUND - 4):  # replies ending on both sides of a window's edge
        profile = profile_step(engine, [1 + i % 50 for i in range(length)], gen, repeats=1)
        assert [p.name for p in profile.phases] == list(PHASES)


def test_target_only_profiles_verification_and_acceptance_only():
    engine = Engine(Target(tiny_hf("llama")), None, max_context=64)
    profile = profile_step(engine, [1, 2, 3], GenerationConfig(max_new_tokens=4, num_spec_tokens=0, stop_token_ids=()))
    assert [p.name for p in profile.phases] == ["verify", "accept"]


def test_the_table_plan_measures_every_mode_a_device_has_chains_and_trees():
    from demo.bench.tools.perf import table_plan

    cpu, gpu = table_plan("cpu"), table_plan("cuda")
    assert all("--mode" not in flags for _, flags in cpu)  # a CPU has eager mode only
    assert [name for name, _ in cpu if "target only" in name] == ["SpecLens target only, eager"]
    for method in ("eagle3", "eagle"):
        assert {("--tree-topk" in flags) for name, flags in gpu if name.startswith(method)} == {True, False}
        assert {tuple(flags[flags.index("--mode"):]) for name, flags in gpu if name.startswith(method) and "--mode" in flags} \
            == {("--mode", "cudagraph"), ("--mode", "cudagraph", "--compile", "drafter"),
                ("--mode", "cudagraph", "--compile", "all")}
    assert not any("drafter" in flags and "none" in flags for _, flags in gpu)  # target only has no drafter to compile


def test_the_tables_drafters_flag_picks_its_drafters_and_leaves_the_bench_flags():
    from demo.bench.tools.perf import _drafters_flag

    assert _drafters_flag(["--num-prompts", "4"]) == (["--num-prompts", "4"], ("eagle3", "eagle"))
    assert _drafters_flag(["--drafters", "eagle3", "--num-prompts", "4"]) == (["--num-prompts", "4"], ("eagle3",))
    with pytest.raises(SystemExit, match="eagle3 and/or eagle"):
        _drafters_flag(["--drafters", "medusa"])


def test_the_table_gives_each_row_its_speed_over_transformers_and_over_target_only():
    from demo.bench.tools.perf import PerfRow, format_table

    rows = [PerfRow("hf dynamic", 100.0, kind="transformers"), PerfRow("hf static", 200.0, kind="transformers"),
            PerfRow("target", 250.0, kind="target"), PerfRow("eagle3", 500.0, 3.2, 1.0, 2.0)]
    lines = format_table(rows).splitlines()
    assert lines[-1] == "| eagle3 | 500.0 | 3.20 | 1.00 | 2.00 | 2.50 | 2.00 |"  # over the best of each
    assert lines[2].endswith("| 0.50 | 0.40 |")


def test_the_transformers_row_is_the_generated_tokens_over_the_timed_calls_after_a_warm_up_on_the_longest_prompt(monkeypatch):
    import demo.bench.tools.perf as perf

    hf = tiny_hf("llama")
    hf.generation_config.eos_token_id = None  # run to the budget: 6 new tokens a prompt
    calls = []
    generate = hf.generate
    monkeypatch.setattr(hf, "generate", lambda ids, **k: calls.append(ids.shape[1]) or generate(ids, **k))
    ticks = iter([0, 1, 10, 13])  # two timed calls, 1 s and 3 s (a timed warm-up would run out of ticks)
    row = perf.transformers_row(hf, [[4, 5], [1, 2, 3]], max_new_tokens=6, clock=lambda: next(ticks))
    assert calls == [3, 2, 3]  # a warm-up on the longest prompt (a static cache fits the rest), then one a prompt
    assert row.kind == "transformers" and "dynamic" in row.name
    assert row.tokens_per_s == 12 / 4  # 2 x 6 new tokens (the prompts not counted) over 1 + 3 s


def test_the_profile_compiles_the_phases_the_engine_compiles():
    from demo.bench.tools.perf import compiled_phase

    target = Target(tiny_hf("llama"))
    drafter_phases = {"project", "catch_up", "draft"}
    for scope in (False, "drafter", "all"):
        engine = Engine(target, tiny_drafter("eagle3", target), compile=scope, max_context=64)
        assert not any(compiled_phase(engine, phase) for phase in PHASES)  # eager mode compiles nothing
        engine.mode = "cudagraph"  # as on a GPU
        compiled = {phase for phase in PHASES if compiled_phase(engine, phase)}
        assert compiled == {False: set(), "drafter": drafter_phases | {"accept"}, "all": set(PHASES)}[scope]


def test_count_rows_alike_counts_only_the_rows_a_wide_forward_computes_as_a_one_row_forward():
    from demo.bench.tools.perf_forward import count_rows_alike

    def forward(tokens, positions):  # [1, W] -> [1, W, 5]; a wide pass rounds its third row otherwise
        logits = (tokens.float() + positions.float())[..., None].repeat(1, 1, 5)
        if tokens.shape[1] > 1:
            logits[0, 2] += 1e-3
        return logits

    tokens = torch.tensor([[3, 1, 4, 1, 5]])
    assert count_rows_alike(forward, tokens, torch.arange(10, 15).view(1, -1)) == 4
    assert count_rows_alike(forward, tokens[:, :1], torch.tensor([[10]])) == 1


def test_perf_forward_gives_a_row_per_kernels_choice_and_width_with_the_verification_forwards_rows_alike():
    from demo.bench.tools.perf_forward import main

    table = main(["--shape", "tiny", "--widths", "1,3", "--attend", "256", "--repeats", "3", "--device", "cpu",
                  "--top", "2"])
    rows = [line.split(" | ") for line in table.splitlines() if line.startswith("| torch")]
    assert "torch, 3 rows, eager:" in table and "aten::" in table.split("torch, 3 rows, eager:")[1]
    assert [(r[1], r[2]) for r in rows] == [("1", "eager"), ("3", "eager")]
    assert rows[0][6].startswith("1/1") and rows[1][6].split("/")[1].startswith("3")
    assert all(int(r[3]) > 0 and float(r[5]) > 0 for r in rows)


def test_perf_forward_refuses_an_attend_window_that_does_not_cover_the_context_and_the_widest_forward():
    from demo.bench.tools.perf_forward import parse_args

    with pytest.raises(SystemExit):
        parse_args(["--context", "200", "--widths", "1,64", "--attend", "256", "--device", "cpu"])
    assert parse_args(["--context", "192", "--widths", "1,64", "--attend", "256", "--device", "cpu"]).dtype == "float32"


def test_perf_forward_measures_the_fused_kernels_once_per_tiles_entry_the_persistent_once_per_tiles_and_grid_and_refuses_a_malformed_one():
    from demo.bench.tools.perf_forward import parse_args, parse_grid, variants
    from demo.kernels.persistent import Grid

    config = parse_args(["--kernels", "torch,fused", "--tiles", "default,block_n=16:steps=3", "--device", "cpu"])
    assert variants(config) == [("torch", None, None), ("fused", "default", None),
                                ("fused", "block_n=16:steps=3", None)]
    assert variants(parse_args(["--kernels", "fused", "--device", "cpu"])) == [("fused", None, None)]
    config = parse_args(["--kernels", "fused,persistent", "--tiles", "default,steps=0", "--grid", "default,per_sm=0",
                         "--device", "cpu"])
    assert variants(config) == [("fused", "default", None), ("fused", "steps=0", None),
                                ("persistent", "default", "default"), ("persistent", "default", "per_sm=0"),
                                ("persistent", "steps=0", "default"), ("persistent", "steps=0", "per_sm=0")]
    assert parse_grid("per_sm=0:prefetch=0") == Grid(per_sm=0, prefetch=0) and parse_grid("default") == Grid()
    assert str(Grid(per_sm=2)) == "per_sm=2" and str(Grid()) == "default"
    assert parse_grid("max_rows=64:trace=1") == Grid(max_rows=64, trace=1)
    for bad in ("per_sm=-1", "prefetch=3", "poll=1", "sm=1", "per_sm", "max_rows=0", "trace=2"):
        with pytest.raises(SystemExit):
            parse_args(["--kernels", "persistent", "--grid", bad, "--device", "cpu"])
    for bad in ("32x1x4", "block_n=24", "head_split=3", "num_warps=3", "block_k=48", "num_stages=0", "steps=-1",
                "block_m", "rows=16", "wide_block_n=48", "wide_block_n=8", "unroll_norm=2"):
        with pytest.raises(SystemExit):
            parse_args(["--kernels", "fused", "--tiles", bad, "--device", "cpu"])


def test_the_phases_asked_for_list_every_launch_in_order_and_the_others_none():
    from demo.bench.tools.perf import _launches_flag

    target = Target(tiny_hf("llama"))
    engine = Engine(target, tiny_drafter("eagle3", target), max_context=128)
    gen = GenerationConfig(max_new_tokens=8, num_spec_tokens=3, tree=TreeShape(2, 6), stop_token_ids=())
    profile = profile_step(engine, [1, 17, 99, 4], gen, listed=("draft",))
    draft = next(p for p in profile.phases if p.name == "draft")
    assert draft.launches is not None and len(draft.launches) == draft.kernels
    assert sum(c for _, c, _ in draft.top) <= draft.kernels and all(ms >= 0 for _, ms in draft.launches)
    assert all(p.launches is None for p in profile.phases if p.name != "draft")
    text = format_profile(profile, "title")
    assert f"draft: {draft.kernels} launches in order" in text and draft.launches[0][0][:40] in text
    assert _launches_flag(["-k", "3", "--launches", "draft,verify"]) == (["-k", "3"], ("draft", "verify"))
    with pytest.raises(SystemExit, match="step phases"):
        _launches_flag(["--launches", "drafting"])


def test_a_traced_launchs_stage_profile_splits_each_stage_into_the_slowest_programs_work_and_the_barrier():
    """Two programs, three stages (ns): a stage spans from the first leaving of the barrier before it to
    the first leaving of the one after it; its work per program from leaving to arriving; its barrier
    from the last arrival to the first leaving."""
    from demo.bench.tools.perf_forward import format_stages, stage_profile

    trace = torch.tensor([
        [[0, 0], [3000, 5000], [7000, 9500], [12000, 12000]],  # program 0: start; (arrive, leave) per stage
        [[1000, 1000], [4000, 5200], [8000, 9000], [11000, 11000]],
    ])
    costs = stage_profile(trace, ["a", "b", "a"])
    a, b = costs
    assert (a.name, a.count, b.name, b.count) == ("a", 2, "b", 1)
    # stage 0: opened 0 -> 5000, work 3000 and 3000, barrier 5000 - 4000; stage 2: opened 9000 -> 11000,
    # work 12000 - 9500 = 2500 and 11000 - 9000 = 2000, barrier 11000 - 12000 (the end: no barrier but a skew)
    assert a.span_us == pytest.approx((5.0 + 2.0) / 2) and a.slowest_us == pytest.approx((3.0 + 2.5) / 2)
    assert a.mean_us == pytest.approx((3.0 + 3.0 + 2.5 + 2.0) / 4) and a.barrier_us == pytest.approx((1.0 - 1.0) / 2)
    assert b.span_us == pytest.approx(4.0) and b.slowest_us == pytest.approx(2.8) and b.barrier_us == pytest.approx(1.0)
    assert "| a | 2 | 3.50 |" in format_stages("persistent", 8, costs)
