"""Graph mode's run-ahead (demo/engine.py Replica): step s + 1 is launched before step s is read.

No GPU here, so the graphs, events and pinned copies are stood in for by synchronous CPU ones: a
"replay" runs the step function at once, so launching s + 1 really does overwrite every device
buffer before s is read. What the stand-in proves is the order: step s is read from its own replica's
copy, the generator's draws come in eager's order, a step that may end on the budget is never run
ahead (past the context a slot index fails at once on a CPU), and a step run ahead of a stop token
is wasted but changes nothing. tests/gpu/test_graph_mode_gpu.py checks the same on a GPU with real graphs."""

import pytest
import torch

import demo.capture as capture_module
import demo.engine as engine_module
from demo.config import GenerationConfig, TreeShape
from demo.engine import Engine
from demo.step_buffers import state_tensors
from demo.target import Target
from tests.tiny import corrupted_oracle, hf_greedy, tiny_drafter, tiny_hf

PROMPT = [1, 17, 99, 4, 250, 31, 8]


class StandInGraph:
    """CapturedStep's interface; each replay runs the function there and then. Construction runs it
    as often as a capture does (its warm-ups, then the captured run), moving the state on as much."""

    def __init__(self, fn, pool, warmup: int = 2):
        self.fn, self.replays = fn, 0
        for _ in range(warmup):
            fn()
        self.output = fn()

    def __call__(self):
        self.replays += 1
        self.output = self.fn()
        return self.output


class StandInEvent:
    def __init__(self, enable_timing=False, external=False):
        pass

    def record(self):
        pass

    def synchronize(self):
        pass

    def elapsed_time(self, other):
        return 0.5


@pytest.fixture
def graph_mode(monkeypatch):
    monkeypatch.setattr(capture_module, "CapturedStep", StandInGraph)
    monkeypatch.setattr(torch.cuda, "Event", StandInEvent)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: None)

    def make(target, drafter, **kw):
        engine = Engine(target, drafter, **kw)
        engine.mode = "cudagraph"  # prepare() now "captures" into the stand-ins
        return engine
    return make


def _run(engine, gen):
    events = list(engine.generate(PROMPT, gen))
    return [t for e in events for t in e.token_ids], events


@pytest.mark.parametrize("tree", [None, TreeShape(2, 6)], ids=["chain", "tree"])
@pytest.mark.parametrize("rule", ["greedy", "pointmass", "q", "wor"])
def test_running_the_next_step_ahead_gives_eagers_tokens(graph_mode, tree, rule):
    target = Target(tiny_hf("llama"))
    drafter = tiny_drafter("eagle3", target)
    sampling = {} if rule == "greedy" else dict(temperature=0.9, seed=5, draft_sampling=rule)
    gen = GenerationConfig(max_new_tokens=40, num_spec_tokens=3, tree=tree, stop_token_ids=(), **sampling)
    eager, _ = _run(Engine(target, drafter, max_context=128), gen)
    engine = graph_mode(target, drafter, max_context=128)
    ahead, events = _run(engine, gen)
    assert ahead == eager
    (replicas,) = engine.prepare(gen.draft_shape(3)).replicas.values()  # one attend bucket: the context
    name = "step" if rule == "greedy" else "step_sampled"
    replays = [replica.graphs[name].replays for replica in replicas]
    assert replays[0] >= 1 and replays[1] >= 1  # the steps alternated between the replicas
    assert sum(replays) == len(events) - 1  # no stop token: no step was wasted
    if rule != "greedy":  # at T > 0 the acceptance test is captured too, and ran after each step
        assert [replica.graphs["accept_sampled"].replays for replica in replicas] == replays


@pytest.mark.parametrize("tree", [None, TreeShape(2, 6)], ids=["chain", "tree"])
def test_below_top_p_one_the_acceptance_test_runs_eagerly_after_the_captured_step(graph_mode, tree):
    target = Target(tiny_hf("llama"))
    drafter = tiny_drafter("eagle3", target)
    gen = GenerationConfig(max_new_tokens=30, num_spec_tokens=3, tree=tree, stop_token_ids=(), temperature=0.9,
                           top_p=0.8, seed=3, draft_sampling="wor" if tree else "pointmass")
    eager, _ = _run(Engine(target, drafter, max_context=128), gen)
    engine = graph_mode(target, drafter, max_context=128)
    ahead, events = _run(engine, gen)
    assert ahead == eager
    (replicas,) = engine.prepare(gen.draft_shape(3)).replicas.values()
    assert sum(replica.graphs["step_sampled"].replays for replica in replicas) == len(events) - 1
    assert all(replica.graphs["accept_sampled"].replays == 0 for replica in replicas)


@pytest.mark.parametrize("tree", [None, TreeShape(2, 6)], ids=["chain", "tree"])
def test_a_step_run_ahead_of_a_stop_is_wasted_and_one_that_could_pass_the_context_never_runs(graph_mode, tree):
    target = Target(tiny_hf("llama"))
    drafter = tiny_drafter("eagle3", target)
    k, width, context = 3, 6 if tree else 4, 64
    fill = GenerationConfig(max_new_tokens=context - len(PROMPT) - width, num_spec_tokens=k, tree=tree,
                            stop_token_ids=())
    free, _ = _run(Engine(target, drafter, max_context=context), fill)
    end = next(i for i in range(10, len(free)) if free.index(free[i]) == i)  # a token's first appearance
    stop = GenerationConfig(**{**fill.__dict__, "stop_token_ids": (free[end],)})
    engine = graph_mode(target, drafter, max_context=context)
    stopped, events = _run(engine, stop)
    assert stopped == free[:end + 1]
    (replicas,) = engine.prepare(stop.draft_shape(k)).replicas.values()
    assert sum(replica.graphs["step"].replays for replica in replicas) == len(events) - 1 + 1  # one step wasted
    assert _run(engine, fill)[0] == free  # the budget fills the context exactly: nothing ran past it


@pytest.mark.parametrize("tree", [None, TreeShape(2, 6)], ids=["chain", "tree"])
def test_each_step_runs_on_an_attend_bucket_that_holds_it_and_gives_eagers_tokens(graph_mode, monkeypatch, tree):
    # buckets 16, 32, 64 and 128: a reply of 7 + 100 tokens crosses all four. The drafter is right
    # four times in five, so steps emit several tokens: a step bounded without what the step before
    # it may emit writes a K/V slot past its bucket's cache views, which fails at once on a CPU
    monkeypatch.setattr(engine_module, "ATTEND_MIN_BUCKET", 16)
    hf = tiny_hf("llama")
    target = Target(hf)
    drafter = corrupted_oracle(PROMPT + hf_greedy(hf, PROMPT, 100), target, every=5)
    gen = GenerationConfig(max_new_tokens=100, num_spec_tokens=3, tree=tree, stop_token_ids=())
    eager, eager_events = _run(Engine(target, drafter, max_context=128), gen)
    assert len(eager) > 2 * (len(eager_events) - 1)  # more than two tokens a step
    engine = graph_mode(target, drafter, max_context=128)
    assert engine.attend_buckets() == [16, 32, 64, 128]
    ahead, events = _run(engine, gen)
    assert ahead == eager
    replicas = engine.prepare(gen.draft_shape(3)).replicas
    replays = {a: sum(replica.graphs["step"].replays for replica in pair) for a, pair in replicas.items()}
    assert sum(replays.values()) == len(events) - 1
    assert all(replays.values())


@pytest.mark.parametrize("tree", [None, TreeShape(2, 6)], ids=["chain", "tree"])
def test_every_capture_starts_from_the_state_prepare_made(graph_mode, monkeypatch, tree):
    # a capture runs its step three times (warm-ups, then the captured run), each moving the positions
    # on; run back to back, the captures of four buckets would move them dozens of slots, past the
    # smallest bucket's, so each capture starts again from the state prepare() made, and graph mode
    # leaves the state as eager's prepare() leaves it
    monkeypatch.setattr(engine_module, "ATTEND_MIN_BUCKET", 16)
    target = Target(tiny_hf("llama"))
    drafter = tiny_drafter("eagle3", target)
    shape = GenerationConfig(num_spec_tokens=3, tree=tree).draft_shape(3)
    seen = []
    verify = Engine.verify
    def recorded(self, b, attend=None):
        seen.append(int(b.verify_positions.max()))
        return verify(self, b, attend)
    monkeypatch.setattr(Engine, "verify", recorded)
    eager = Engine(target, drafter, max_context=128).prepare(shape)
    graph = graph_mode(target, drafter, max_context=128).prepare(shape)
    assert max(seen) < 16  # each capture's three runs stayed within the smallest bucket
    for mine, theirs in zip(state_tensors(graph), state_tensors(eager)):
        assert torch.equal(mine, theirs)


def test_a_generation_captures_the_attend_buckets_it_can_reach_before_it_starts(graph_mode, monkeypatch):
    # a short reply captures the small buckets only (capturing, with --compile all, compiles each);
    # a longer one captures the rest before its prefill, never in the middle of its steps
    monkeypatch.setattr(engine_module, "ATTEND_MIN_BUCKET", 16)
    target = Target(tiny_hf("llama"))
    drafter = tiny_drafter("eagle3", target)
    engine = graph_mode(target, drafter, max_context=128)
    short = GenerationConfig(max_new_tokens=4, num_spec_tokens=3, stop_token_ids=())  # 7 + 4 + 4 (+ 3) slots
    assert _run(engine, short)[0] == _run(Engine(target, drafter, max_context=128), short)[0]
    buffers = engine.prepare(short.draft_shape(3), used=1)
    assert sorted(buffers.replicas) == [16, 32]
    order = []
    for owner, name in ((engine_module, "capture_steps"), (Engine, "_prefill"), (Engine, "_launch")):
        def recorded(self, *args, name=name, real=getattr(owner, name)):  # capture_steps takes the engine first
            if self is engine:
                order.append(name)
            return real(self, *args)
        monkeypatch.setattr(owner, name, recorded)
    long = GenerationConfig(max_new_tokens=100, num_spec_tokens=3, stop_token_ids=())
    eager = _run(Engine(target, drafter, max_context=128), long)[0]
    assert _run(engine, long)[0] == eager
    assert sorted(buffers.replicas) == [16, 32, 64, 128]
    assert order[0] == "capture_steps" and order.index("_prefill") == order.count("capture_steps")  # all before the prefill


def test_no_bucket_narrower_than_a_step_is_captured_and_a_wide_tree_gives_eagers_tokens(graph_mode, monkeypatch):
    # sampled drafts verify every candidate: depth 3, top-3 is 21 nodes, 22 rows a step, wider than
    # the smallest bucket (16); its capture would write slots 16..21 past that bucket's cache views
    # (a device-side assert on the H200), and no step can ever attend over fewer than 24 slots
    monkeypatch.setattr(engine_module, "ATTEND_MIN_BUCKET", 16)
    target = Target(tiny_hf("llama"))
    drafter = tiny_drafter("eagle3", target)
    gen = GenerationConfig(max_new_tokens=40, num_spec_tokens=3, tree=TreeShape(3, 0), temperature=0.9, seed=3,
                           draft_sampling="q", stop_token_ids=())
    shape = gen.draft_shape(3)
    assert shape.width == 22
    eager, _ = _run(Engine(target, drafter, max_context=128), gen)
    engine = graph_mode(target, drafter, max_context=128)
    assert _run(engine, gen)[0] == eager
    assert sorted(engine.prepare(shape).replicas) == [32, 64, 128]


def test_a_t_above_zero_acceptance_test_that_fails_to_compile_is_captured_uncompiled(graph_mode, monkeypatch):
    compiled = []

    def compile_step(fn):  # the greedy test compiles; the sampled one (the second asked) fails as inductor can
        compiled.append(fn)
        if len(compiled) == 2:
            def failing(*args):
                raise RuntimeError("inductor: no code for this scan")
            return failing
        return fn
    monkeypatch.setattr(engine_module, "compile_step", compile_step)
    monkeypatch.setattr(Engine, "compiles", lambda self, phase: phase == "accept")
    target = Target(tiny_hf("llama"))
    drafter = tiny_drafter("eagle3", target)
    gen = GenerationConfig(max_new_tokens=30, num_spec_tokens=3, stop_token_ids=(), temperature=0.9, seed=3,
                           draft_sampling="pointmass")  # a chain of the top choices: prepare(3)'s shape
    eager, _ = _run(Engine(target, drafter, max_context=128), gen)
    engine = graph_mode(target, drafter, max_context=128)
    with pytest.warns(UserWarning, match="did not compile"):
        ahead, events = _run(engine, gen)
    assert ahead == eager and len(compiled) == 2
    b = engine.prepare(3)
    assert b.capture.sampled_uncompiled
    (replicas,) = b.replicas.values()
    assert sum(replica.graphs["accept_sampled"].replays for replica in replicas) == len(events) - 1


def test_the_t_above_zero_acceptance_test_is_captured_once_a_sampled_generation_asks_for_it(graph_mode, monkeypatch):
    monkeypatch.setattr(engine_module, "ATTEND_MIN_BUCKET", 16)  # buckets 16 .. 128: a reply crosses several
    target = Target(tiny_hf("llama"))
    drafter = tiny_drafter("eagle3", target)
    engine = graph_mode(target, drafter, max_context=128)
    greedy = GenerationConfig(max_new_tokens=30, num_spec_tokens=3, stop_token_ids=())
    _run(engine, greedy)
    b = engine.prepare(3)
    assert b.replicas and not any("accept_sampled" in r.graphs for pair in b.replicas.values() for r in pair)
    sampled = GenerationConfig(**{**greedy.__dict__, "temperature": 0.9, "seed": 2, "max_new_tokens": 90,
                                  "draft_sampling": "pointmass"})
    eager, _ = _run(Engine(target, drafter, max_context=128), sampled)
    tokens, _ = _run(engine, sampled)
    assert tokens == eager  # the buckets captured before and after it asked all test at T > 0 in their graph
    replicas = [replica for pair in engine.prepare(3).replicas.values() for replica in pair]
    assert len(replicas) == 2 * len(engine.attend_buckets()) and all("accept_sampled" in r.graphs for r in replicas)
    assert sum(replica.graphs["accept_sampled"].replays for replica in replicas) == sum(
        replica.graphs["step_sampled"].replays for replica in replicas) > 0
