"""Speculative decoding at T=0 emits exactly what greedy decoding of the target emits."""

import pytest
import torch

from demo.config import GenerationConfig, TreeShape
from demo.capture import compile_step
from demo.engine import Engine
from demo.step_buffers import state_tensors
from demo.target import Target
from tests.tiny import OracleDrafter, corrupted_oracle, hf_greedy, run, tiny_drafter, tiny_hf

PROMPT = [1, 17, 99, 4, 250, 31, 8]


def make_drafter(method, target, table):
    if method == "oracle":  # every 5th proposal wrong: uneven accepts
        return corrupted_oracle(table, target, every=5, skip=len(PROMPT) + 3)
    if method == "none":
        return None
    return tiny_drafter(method, target, draft_vocab_size=128 if method == "eagle3" else 0)


@pytest.mark.parametrize("method", ["none", "eagle", "eagle3", "oracle"])
@pytest.mark.parametrize("k", [1, 3, 7])
def test_greedy_spec_matches_transformers_generate_to_max_length(method, k):
    hf = tiny_hf("llama")
    ref = hf_greedy(hf, PROMPT, 40)
    target = Target(hf)
    engine = Engine(target, make_drafter(method, target, PROMPT + ref), max_context=128)
    tokens, events = run(engine, PROMPT, max_new_tokens=40, num_spec_tokens=k, stop_token_ids=())
    assert tokens == ref
    assert events[-1].finished and events[-1].finish_reason == "length"
    assert all(e.num_accepted <= k for e in events)


@pytest.mark.parametrize("method", ["none", "eagle", "eagle3", "oracle"])
@pytest.mark.parametrize("k", [1, 3, 7])
def test_greedy_spec_matches_transformers_generate_ending_on_eos(method, k):
    hf = tiny_hf("qwen2", seed=3)  # (no eos of its own: the test picks one from the free run)
    free = hf_greedy(hf, PROMPT, 40)
    eos = free[17]  # pretend the 18th token is the end of sequence
    ref = hf_greedy(hf, PROMPT, 40, eos=eos)
    assert ref[-1] == eos and len(ref) <= 18
    target = Target(hf)
    engine = Engine(target, make_drafter(method, target, PROMPT + free), max_context=128)
    tokens, events = run(engine, PROMPT, max_new_tokens=40, num_spec_tokens=k, stop_token_ids=(eos,))
    assert tokens == ref
    assert events[-1].finish_reason == "stop"


def test_oracle_drafter_is_accepted_and_counted():
    hf = tiny_hf("llama")
    ref = hf_greedy(hf, PROMPT, 30)
    target = Target(hf)
    engine = Engine(target, OracleDrafter(PROMPT + ref, 256, 64), max_context=128)
    tokens, events = run(engine, PROMPT, max_new_tokens=30, num_spec_tokens=4, stop_token_ids=())
    # a perfect drafter: every step accepts all 4 drafts and adds the bonus token
    assert tokens == ref
    assert [e.num_accepted for e in events[1:-1]] == [4] * (len(events) - 2)
    stats = events[-1].stats
    assert stats.num_generated == 30
    assert stats.mean_acceptance_length == pytest.approx(1 + stats.num_accepted_tokens / stats.num_drafts)


def test_target_only_through_a_speculative_engine_matches_generate():
    hf = tiny_hf("llama")
    target = Target(hf)
    engine = Engine(target, tiny_drafter("eagle3", target), max_context=128)
    tokens, events = run(engine, PROMPT, max_new_tokens=20, num_spec_tokens=0,
                         stop_token_ids=())
    assert tokens == hf_greedy(hf, PROMPT, 20)
    assert all(e.draft_ids == [] for e in events) and events[-1].stats.num_drafts == 0


def test_drafter_swap_keeps_output_identical():
    hf = tiny_hf("llama")
    target = Target(hf)
    engine = Engine(target, tiny_drafter("eagle", target), max_context=128)
    first, _ = run(engine, PROMPT, max_new_tokens=16, num_spec_tokens=3)
    engine.set_proposer(tiny_drafter("eagle3", target, draft_vocab_size=128))
    second, _ = run(engine, PROMPT, max_new_tokens=16, num_spec_tokens=3)
    assert first == second == hf_greedy(hf, PROMPT, 16)


@pytest.mark.parametrize("tree", [None, TreeShape(3, 9)], ids=["chain", "tree"])
def test_step_tensors_live_in_persistent_buffers_across_requests(tree):
    # a replayed graph reads and writes the tensors it was captured with: a step that rebound a
    # buffer (b.x = new tensor instead of b.x.copy_) would leave a later replay reading stale data
    hf = tiny_hf("llama")
    target = Target(hf)
    engine = Engine(target, tiny_drafter("eagle3", target), max_context=128)
    gen = GenerationConfig(max_new_tokens=12, num_spec_tokens=4, tree=tree, stop_token_ids=())
    b = engine.prepare(gen.draft_shape(4))
    tensors = lambda: [t.data_ptr() for t in state_tensors(b)]  # noqa: E731  (the proposer's state included)
    before = tensors()
    run(engine, PROMPT, max_new_tokens=12, num_spec_tokens=4, tree=tree, temperature=0.9, stop_token_ids=())
    run(engine, PROMPT, max_new_tokens=12, num_spec_tokens=4, tree=tree, stop_token_ids=())
    assert tensors() == before and "catch_features" in vars(b.draft)


def test_events_stream_one_step_at_a_time_with_timings():
    hf = tiny_hf("llama")
    target = Target(hf)
    engine = Engine(target, tiny_drafter("eagle", target), max_context=128)
    _, events = run(engine, PROMPT, max_new_tokens=12, num_spec_tokens=2, stop_token_ids=())
    assert events[0].step == 0 and events[0].draft_ids == [] and len(events[0].token_ids) == 1
    for e in events[1:]:
        assert len(e.draft_ids) == 2 and 1 <= len(e.token_ids) <= 3
        assert e.draft_ms >= 0 and e.verify_ms > 0
        assert len(e.token_probs) == len(e.token_ids) and all(0 < p <= 1 for p in e.token_probs)
    assert [e.stats.num_generated for e in events] == list(
        __import__("itertools").accumulate(len(e.token_ids) for e in events))


def test_requests_beyond_the_context_are_refused():
    target = Target(tiny_hf("llama"))
    engine = Engine(target, None, max_context=64)
    with pytest.raises(ValueError, match="exceeds the context of 64 tokens"):
        list(engine.generate(PROMPT, GenerationConfig(max_new_tokens=60)))
    with pytest.raises(ValueError, match="empty"):
        list(engine.generate([], GenerationConfig()))


def test_cudagraph_mode_is_refused_without_cuda():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(ValueError, match="cudagraph mode needs a CUDA device"):
        Engine(Target(tiny_hf("llama")), None, mode="cudagraph")


def test_an_unknown_compile_scope_is_refused():
    with pytest.raises(ValueError, match="compile must be"):
        Engine(Target(tiny_hf("llama")), None, compile="sideways")
    for scope, label in ((True, "eager+compile(drafter)"), ("all", "eager+compile(all)"), (False, "eager")):
        assert Engine(Target(tiny_hf("llama")), None, compile=scope).describe()["mode"] == label


def test_default_target_with_random_drafters_matches_generate(default_target):
    hf, tok = default_target
    from demo.models.prompts import chat_ids

    prompt = chat_ids(tok, [{"role": "user", "content": "Write a haiku about the sea."}])
    ref = hf_greedy(hf, prompt, 32)
    target = Target(hf)
    for method in ("eagle", "eagle3"):
        drafter = tiny_drafter(method, target, draft_vocab_size=4096 if method == "eagle3" else 0)
        engine = Engine(target, drafter, max_context=256)
        tokens, _ = run(engine, prompt, max_new_tokens=32, num_spec_tokens=3)
        assert tokens == ref[: len(tokens)] and len(tokens) == len(ref)


def test_one_process_compiles_the_steps_of_any_number_of_engines():
    # every engine's captured steps are closures of the same lambdas; dynamo's recompile limit (8)
    # counts per code object, so a shared one made the ninth compiled capture of a process fail
    # (validate --compile over many depths, a long-lived app swapping drafters)
    def step_over(n: int):
        x = torch.arange(n, dtype=torch.float32)
        return lambda: (x * 2).sum()

    results = [float(compile_step(step_over(n))()) for n in range(1, 13)]  # 12 shapes: 12 compilations
    assert results == [float(n * (n - 1)) for n in range(1, 13)]
    with pytest.raises(TypeError, match="plain function"):
        compile_step(torch.nn.Identity())


@pytest.mark.parametrize("tree", [None, TreeShape(2, 6)], ids=["chain", "tree"])
@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_events_carry_each_positions_top_candidates_for_the_inspector(tree, temperature):
    from demo.engine import TOP_SHOWN

    hf = tiny_hf("llama")
    target = Target(hf)
    engine = Engine(target, tiny_drafter("eagle3", target, draft_vocab_size=128), max_context=128)
    # point mass: a chain's drafts are the drafter's top choices, shown with its other candidates
    tokens, events = run(engine, PROMPT, max_new_tokens=24, num_spec_tokens=3, tree=tree, temperature=temperature,
                         draft_sampling="pointmass", stop_token_ids=())
    for e in events:
        assert len(e.target_top) == len(e.token_ids)  # one row per emitted token
        for row, token, p in zip(e.target_top, e.token_ids, e.token_probs):
            ps = [q for _, q in row]
            assert len(row) == TOP_SHOWN and ps == sorted(ps, reverse=True) and 0 < sum(ps) <= 1 + 1e-5
            if temperature == 0:  # the emitted token is the target's first choice
                assert row[0] == (token, pytest.approx(p, rel=1e-5))
            elif token in dict(row):
                assert dict(row)[token] == pytest.approx(p, rel=1e-5)
        if e.step == 0 or tree is not None:
            assert e.draft_top is None
            continue
        assert len(e.draft_top) == 3
        for row, draft, q in zip(e.draft_top, e.draft_ids, e.tree.draft_probs):  # the chain drafts its first choice
            assert row[0] == (draft, pytest.approx(q, rel=1e-5)) and [x for _, x in row] == sorted(x for _, x in row)[::-1]


@pytest.mark.parametrize("rule", ["q", "wor"])
def test_a_sampled_chain_shows_the_drafters_other_candidates_at_each_draft(rule):
    from demo.engine import TOP_SHOWN

    target = Target(tiny_hf("llama"))
    engine = Engine(target, tiny_drafter("eagle3", target, draft_vocab_size=128), max_context=128)
    tokens, events = run(engine, PROMPT, max_new_tokens=24, num_spec_tokens=3, temperature=0.9, draft_sampling=rule,
                         seed=3, stop_token_ids=())
    shown = 0
    for e in events[1:]:
        assert len(e.draft_top) == 3  # one row per draft position, the drafts drawn from q there
        for row, draft, q in zip(e.draft_top, e.draft_ids, e.tree.draft_probs):
            qs = [x for _, x in row]
            assert len(row) == TOP_SHOWN and qs == sorted(qs, reverse=True) and 0 < sum(qs) <= 1 + 1e-5
            assert q <= qs[-1] + 1e-6 or draft in dict(row)  # a draw likelier than the fifth choice is listed
            if draft in dict(row):
                assert dict(row)[draft] == pytest.approx(q, rel=1e-5)
                shown += 1
    assert shown > 0


def test_prefill_buckets_are_powers_of_two_from_the_smallest_up_to_the_context():
    from demo.engine import PREFILL_MIN_BUCKET, prefill_rows

    assert [prefill_rows(n, 300) for n in (1, PREFILL_MIN_BUCKET, PREFILL_MIN_BUCKET + 1, 200, 257, 300)] == \
        [PREFILL_MIN_BUCKET, PREFILL_MIN_BUCKET, 2 * PREFILL_MIN_BUCKET, 256, 300, 300]


@pytest.mark.parametrize("tree", [None, TreeShape(3, 10)], ids=["chain", "tree"])
def test_a_prompt_padded_to_its_bucket_emits_what_the_unpadded_prompt_emits(tree):
    # a GPU pads every prompt (eager and graph alike); the padding rows' K/V lie past the prompt,
    # where no query looks before a step rewrites them
    hf = tiny_hf("llama")
    ref = hf_greedy(hf, PROMPT, 30)
    target = Target(hf)
    drafter = tiny_drafter("eagle3", target, draft_vocab_size=128)
    outs = {}
    for pad in (False, True):
        engine = Engine(target, drafter, max_context=200)
        engine.pad_prefill = pad  # what a GPU does, here on the CPU
        outs[pad] = run(engine, PROMPT, max_new_tokens=30, num_spec_tokens=3, tree=tree, stop_token_ids=())
    assert outs[True][0] == outs[False][0] == ref
    assert [e.draft_ids for e in outs[True][1]] == [e.draft_ids for e in outs[False][1]]  # the drafter saw the same


@pytest.mark.parametrize("tree", [None, TreeShape(3, 10)], ids=["chain", "tree"])
def test_a_cpu_attending_over_the_slots_in_use_writes_what_attending_over_the_whole_cache_writes(tree, monkeypatch):
    target = Target(tiny_hf("llama"))
    drafter = tiny_drafter("eagle3", target)
    gen = GenerationConfig(max_new_tokens=150, num_spec_tokens=4, tree=tree, stop_token_ids=())
    cut = Engine(target, drafter, max_context=512)
    assert cut.attended(70) == 128 and cut.attended(600) == 512
    prompt = list(range(3, 60))
    events = list(cut.generate(prompt, gen))
    monkeypatch.setattr(Engine, "attended", lambda self, used: None)  # the whole cache, as a GPU attends
    whole = list(Engine(target, drafter, max_context=512).generate(prompt, gen))
    assert [e.token_ids for e in events] == [e.token_ids for e in whole]  # prefix crossed several rounds
    assert [e.num_accepted for e in events] == [e.num_accepted for e in whole]


@pytest.mark.parametrize("tree", [None, TreeShape(2, 6)], ids=["chain", "tree"])
@pytest.mark.parametrize("end", ["stop", "budget"])
def test_no_draft_accepted_after_the_end_of_the_reply_is_counted(tree, end):
    # a perfect drafter, a reply ending inside a step: a stop token among the drafts, or the token
    # budget; the counts must be those of the tokens the reply kept
    hf = tiny_hf("llama")
    ref = hf_greedy(hf, PROMPT, 30)
    target = Target(hf)
    engine = Engine(target, OracleDrafter(PROMPT + ref, target.config.vocab_size, target.config.hidden_size),
                    max_context=128)
    stop = (ref[9],) if end == "stop" else ()
    tokens, events = run(engine, PROMPT, max_new_tokens=30 if end == "stop" else 10, num_spec_tokens=4, tree=tree,
                         stop_token_ids=stop)
    stats = events[-1].stats
    assert len(tokens) == ref.index(ref[9]) + 1 if end == "stop" else len(tokens) == 10
    cut = events[-1]
    assert len(cut.token_ids) < cut.num_accepted + 1  # the last step was cut inside its accepted drafts
    kept = sum(min(e.num_accepted, len(e.token_ids)) for e in events[1:])
    assert stats.num_accepted_tokens == kept
    assert stats.num_accepted_tokens + stats.num_target_tokens + 1 == stats.num_generated == len(tokens)
    assert stats.tokens_per_call == pytest.approx((len(tokens) - 1) / stats.num_steps)


def test_a_target_runs_one_generation_at_a_time_whichever_engine_asks():
    """A generation leaves its state in the target's cache between steps: a second one on any engine
    of the same target, or a capture, is refused while the first is open, and runs once it ends."""
    from demo.kv_cache import CacheInUse

    hf = tiny_hf("llama")
    target = Target(hf)
    speculative, plain = Engine(target, tiny_drafter("eagle", target), max_context=128), Engine(target, max_context=128)
    gen = GenerationConfig(max_new_tokens=12, num_spec_tokens=2, stop_token_ids=())
    first = speculative.generate(PROMPT, gen)
    next(first)
    with pytest.raises(CacheInUse):
        next(plain.generate(PROMPT, gen))
    with pytest.raises(CacheInUse):
        next(speculative.generate(PROMPT, gen))
    with pytest.raises(CacheInUse):
        speculative.prepare(3)
    rest = [t for e in first for t in e.token_ids]  # the first, undisturbed, runs to its end
    first.close()
    assert len(rest) == 11 and run(plain, PROMPT, max_new_tokens=12, stop_token_ids=())[0] == hf_greedy(hf, PROMPT, 12)
