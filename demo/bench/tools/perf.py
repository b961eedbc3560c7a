"""Speed side by side, and where a decoding step's time goes.

    python -m demo.perf table --prompts assets/prompts/categories.jsonl --num-prompts 20 [--drafters eagle3]
    python -m demo.perf --method eagle3 -k 8 --tree-topk 8 --num-draft-tokens 96 --mode cudagraph [--launches draft]
    python -m demo.perf forward --shape llama-3.1-8b --widths 8 --kernels torch,fused --floor

``table``: one process, one loaded target, the same prompts (first turns, greedy): transformers'
``generate()`` (dynamic cache; on a GPU also a static cache, with which ``generate()`` compiles its
decoding forward itself), then SpecLens target-only and each bundled drafter as a chain and as the
device's default tree, in every mode the device has (eager; on a GPU cudagraph, the drafter
compiled, and everything compiled). Each row: tokens/s, tokens per target forward, propose and
verify ms per step, and its speed over transformers' best and over SpecLens' best target-only.

``forward``: the verification forward alone on random weights of a named shape, per kernels
choice and width (demo/bench/tools/perf_forward.py).

Without either: one step taken apart (``--launches PHASE[,PHASE]``: those phases' every kernel too,
in launch order, with its time).

Runs one short generation (so every buffer holds a real step's state), then calls each phase of a
step on its own: ``project`` (the drafter's feature projection), ``catch_up``, ``draft`` (the chain
or tree), ``verify`` (the target forward) and ``accept`` (the acceptance test, compaction and the
packed result), each compiled where the engine's ``--compile`` scope compiles it in graph mode
(``accept`` as the engine does: compiled only at T = 0; it moves the state on, so where it is
compiled its warm-up call moves it one step further). For each it reports the kernels
launched (torch.profiler's device events) and the time: on a GPU the summed kernel time of one
call and, but for ``accept``, the replay of the phase captured alone (CUDA events, median of
repeats: kernel time plus the gaps between kernels); on a CPU wall time. In cudagraph mode it also
times the replay of the whole step's graph and of the prompt's prefill graph. Phases run in step
order on the state the generation left, so each computes a real step's work; ``accept`` runs last.

The model flags are the bench's (``python -m demo.bench --help``).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field

import torch

from demo.bench.tools.timing import capture_alone, launch_summary, launches, replay_ms
from demo.capture import compile_step
from demo.methods import DRAFT_METHODS


@dataclass
class PhaseProfile:
    name: str
    kernels: int  # device kernels and copies launched (CPU: top-level operators)
    kernel_ms: float  # their summed device time (CPU: wall time of one call)
    top: list[tuple[str, int, float]] = field(default_factory=list)  # (kernel, count, ms), the costliest first
    graph_ms: float | None = None  # the phase captured alone, replayed (GPU; not accept, which moves the state on)
    launches: list[tuple[str, float]] | None = None  # every (kernel, ms) in launch order, where asked (--launches)


@dataclass
class StepProfile:
    phases: list[PhaseProfile]
    step_graph_ms: float | None = None  # replay of the whole step's graph (greedy) at its attend bucket, cudagraph mode
    attend: int = 0  # that bucket: the cache slots the step attends over
    whole_context_step_ms: float | None = None  # the same step attending over the whole context
    context: int = 0
    prefill_graph_ms: float | None = None  # replay of the prompt's prefill graph
    prompt_tokens: int = 0
    prefill_rows: int = 0  # the prompt's bucket


STEP_PHASE = {"project": "propose", "catch_up": "propose", "draft": "propose", "verify": "verify", "accept": "accept"}


def compiled_phase(engine, phase: str) -> bool:
    """Whether the engine runs `phase` (one of PHASES) compiled: only graph mode compiles, its
    captured steps, within its --compile scope (Engine.compiles)."""
    return engine.mode == "cudagraph" and engine.compiles(STEP_PHASE[phase])


def _phase_graph_ms(fn, repeats: int) -> float:
    """Capture fn alone and time its replay."""
    return replay_ms(capture_alone(fn), repeats)


@torch.inference_mode()
def profile_step(engine, prompt_ids: list[int], gen, repeats: int = 10, listed: tuple[str, ...] = ()) -> StepProfile:
    """Profile each phase of one decoding step of ``gen``'s shape, after a generation of ``gen``;
    the phases named in `listed` keep every kernel they launch, in order."""
    for _ in engine.generate(prompt_ids, gen):
        pass
    b = engine.prepare(gen.draft_shape(gen.num_spec_tokens if engine.drafter is not None else 0))
    cuda = engine.device.type == "cuda"
    generator = None if gen.sampling.greedy else torch.Generator(device=engine.device).manual_seed(gen.seed)
    phases = []
    for name, fn in engine.step_phases(b, gen.sampling, generator).items():
        if compiled_phase(engine, name) and (name != "accept" or gen.sampling.greedy):
            fn = compile_step(fn)  # the engine compiles the acceptance test at T = 0 only
            fn()  # warm: the first call compiles
        elif name != "accept":
            fn()  # warm: a first call may pick kernels or allocate
        events, wall_ms = launches(fn, cuda)
        kernels, ms, top = launch_summary(events, wall_ms, cuda)
        graph_ms = _phase_graph_ms(fn, repeats) if cuda and name != "accept" else None
        phases.append(PhaseProfile(name, kernels, ms, top, graph_ms, events if name in listed else None))
    out = StepProfile(phases, prompt_tokens=len(prompt_ids), prefill_rows=engine.prefill_bucket(len(prompt_ids)))
    if "step" in b.graphs:  # each replay moves the state on by one step: few repeats, after the phases
        out.attend = engine.attended(engine.last_slot(b) + 1 + repeats * (b.k + 1))  # a bucket that holds every repeat
        out.context = engine.max_context
        out.step_graph_ms = replay_ms(b.replicas[out.attend][0].graphs["step"], repeats)
        if out.attend != out.context:
            out.whole_context_step_ms = replay_ms(b.graphs["step"], repeats)
    prefill = b.graphs.get(f"prefill{out.prefill_rows}")
    if prefill is not None:
        out.prefill_graph_ms = replay_ms(prefill, repeats)
    return out


def format_profile(profile: StepProfile, title: str) -> str:
    lines = [title, f"{'phase':<10}{'kernels':>9}{'kernel ms':>11}{'graph ms':>10}  costliest kernels (count, ms)"]
    for p in profile.phases:
        top = "; ".join(f"{n[:48]} ({c}, {ms:.3f})" for n, c, ms in p.top[:3])
        graph = f"{p.graph_ms:>10.3f}" if p.graph_ms is not None else f"{'':>10}"
        lines.append(f"{p.name:<10}{p.kernels:>9}{p.kernel_ms:>11.3f}{graph}  {top}")
    lines.append(f"{'step':<10}{sum(p.kernels for p in profile.phases):>9}"
                 f"{sum(p.kernel_ms for p in profile.phases):>11.3f}")
    if profile.step_graph_ms is not None:
        lines.append(f"step graph replay: {profile.step_graph_ms:.3f} ms (attending over {profile.attend} slots)"
                     + (f"; {profile.whole_context_step_ms:.3f} ms over the whole context ({profile.context})"
                        if profile.whole_context_step_ms is not None else ""))
    if profile.prefill_graph_ms is not None:
        lines.append(f"prefill graph replay ({profile.prompt_tokens} prompt tokens, run at {profile.prefill_rows} "
                     f"rows): {profile.prefill_graph_ms:.3f} ms")
    for p in profile.phases:
        if p.launches is not None:
            lines += ["", f"{p.name}: {len(p.launches)} launches in order (ms, kernel)"]
            lines += [f"{ms:9.4f}  {name[:110]}" for name, ms in p.launches]
    return "\n".join(lines)


# ---------------------------------------------------------------------- the side-by-side table
@dataclass(frozen=True)
class PerfRow:
    name: str
    tokens_per_s: float
    mean_acceptance_length: float = 1.0
    propose_ms: float = 0.0
    verify_ms: float = 0.0
    kind: str = "speclens"  # "transformers", "target" (SpecLens target-only) or "speclens" (with a drafter)


TABLE_DRAFTERS = tuple(reversed(DRAFT_METHODS))  # the table's drafter rows, the default method's first


def table_plan(device_type: str, methods: tuple[str, ...] = TABLE_DRAFTERS) -> list[tuple[str, list[str]]]:
    """(row name, bench flags) of every SpecLens row a device measures, target-only first."""
    from demo.methods import default_draft, default_tree

    gpu = device_type == "cuda"
    modes = [("eager", [])] + ([("cudagraph", ["--mode", "cudagraph"]),
                                ("cudagraph + compiled drafter", ["--mode", "cudagraph", "--compile", "drafter"]),
                                ("cudagraph + compile all", ["--mode", "cudagraph", "--compile", "all"])] if gpu else [])
    rows = [(f"SpecLens target only, {name}", ["--method", "none", *flags]) for name, flags in modes
            if "drafter" not in name]
    # the fastest tree measured on the device (on a CPU, where the default draft is a chain, the best tree)
    k_tree, tree = default_draft("cuda") if gpu else (4, default_tree(device_type))
    chain_k = 7 if gpu else 3
    shapes = [(f"chain k = {chain_k}", ["-k", str(chain_k)]),
              (f"tree {k_tree} x {tree.topk}, {tree.size}",
               ["-k", str(k_tree), "--tree-topk", str(tree.topk), "--num-draft-tokens", str(tree.size)])]
    for method in methods:
        for shape, shape_flags in shapes:
            for name, flags in modes:
                rows.append((f"{method} {shape}, {name}", ["--method", method, *shape_flags, *flags]))
    return rows


def format_table(rows: list[PerfRow]) -> str:
    """The table, with each row's speed over transformers' best and over SpecLens' best target-only."""
    hf = max((r.tokens_per_s for r in rows if r.kind == "transformers"), default=0.0)
    target = max((r.tokens_per_s for r in rows if r.kind == "target"), default=0.0)
    lines = ["| run | tokens/s | tokens per target forward | propose ms | verify ms | x transformers | x target only |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        over = lambda base: f"{r.tokens_per_s / base:.2f}" if base else "-"  # noqa: E731
        step = (f"{r.propose_ms:.2f} | {r.verify_ms:.2f}" if r.kind != "transformers" else " | ")
        lines.append(f"| {r.name} | {r.tokens_per_s:.1f} | {r.mean_acceptance_length:.2f} | {step} | {over(hf)} | "
                     f"{over(target)} |")
    return "\n".join(lines)


@torch.inference_mode()
def transformers_row(hf, prompts: list[list[int]], max_new_tokens: int, static_compiled: bool = False,
                     clock=time.perf_counter) -> PerfRow:
    """transformers' own greedy ``generate()`` over the prompts (one warm-up on the longest), timed by `clock`."""
    config = hf.generation_config
    saved = config.cache_implementation
    try:
        if static_compiled:
            # generate() compiles the decoding forward itself (CompileConfig, "reduce-overhead") once
            # a static cache is set, on a GPU. Compiling hf.forward by hand as well (the older recipe)
            # fails in transformers 5.17: the static cache is made lazily inside the first
            # forward, so under a compiled forward its tensors are CUDA-graph outputs the next replay
            # overwrites ("accessing tensor output of CUDAGraphs that has been overwritten")
            config.cache_implementation = "static"
        kwargs = dict(max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=config.eos_token_id)
        device = hf.device
        run = lambda ids: hf.generate(torch.tensor([ids], device=device), **kwargs)  # noqa: E731
        # warm up on the longest prompt: a static cache is sized by the first call that needs it, and
        # a later, longer prompt makes a larger one, which the compiled forward recompiles for
        # inside the timed loop (warmed up on a short prompt, the static row runs no faster than the
        # dynamic one)
        run(max(prompts, key=len))
        tokens, seconds = 0, 0.0
        for ids in prompts:
            _sync(device)
            start = clock()
            out = run(ids)
            _sync(device)
            seconds += clock() - start
            tokens += out.shape[1] - len(ids)
    finally:
        config.cache_implementation = saved
    name = "transformers generate(), " + ("static cache, compiled" if static_compiled else "dynamic cache")
    return PerfRow(name, tokens / seconds if seconds else 0.0, kind="transformers")


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def speclens_row(name: str, target, drafters: dict, tokenizer, questions: list[dict], flags: list[str]) -> PerfRow:
    """One bench run (demo/bench/measure.py) on an engine over the loaded target; `flags`: the bench's."""
    from demo.bench.tools.cli import parse_args
    from demo.bench.measure import chosen_drafter_dtype, chosen_drafter_int8, measure
    from demo.engine import Engine

    config = parse_args(flags)
    engine = Engine(target, drafters.get(config.method), mode=config.mode, compile=config.compile,
                    max_context=config.max_context, drafter_dtype=chosen_drafter_dtype(config.drafter_dtype, target),
                    drafter_int8=chosen_drafter_int8(config.drafter_dtype, target))
    s = measure(engine, tokenizer, questions, config)["totals"]["summary"]
    return PerfRow(name, s["tokens_per_s"], s["mean_acceptance_length"], s["mean_draft_ms"], s["mean_verify_ms"],
                   "target" if config.method == "none" else "speclens")


def run_table(argv: list[str]) -> str:
    """Load once, measure every row of the device's plan on the same prompts; returns the table."""
    from demo.bench.tools.cli import parse_args
    from demo.bench.measure import load_questions
    from demo.models.checkpoints import load_drafter
    from demo.models.loading import load_target
    from demo.models.presets import bundled_drafter_dir
    from demo.models.prompts import chat_ids
    from demo.target import Target

    argv, methods = _drafters_flag(argv)
    base = parse_args([*argv, "--method", "none"])
    questions = load_questions(base)
    hf, tokenizer = load_target(base.target, device=base.device, dtype=base.dtype)
    target = Target(hf, kernels=base.kernels)
    drafters = {m: load_drafter(str(bundled_drafter_dir(m)), target, method=m) for m in methods}
    prompts = [chat_ids(tokenizer, [{"role": "user", "content": q["turns"][0]}]) for q in questions]
    rows = []

    def measured(row: PerfRow) -> None:  # each row on stderr as it comes: a run cut short keeps them
        rows.append(row)
        print(format_table(rows[-1:]).splitlines()[-1], file=sys.stderr, flush=True)

    measured(transformers_row(hf, prompts, base.max_new_tokens))
    if target.device.type == "cuda":
        measured(transformers_row(hf, prompts, base.max_new_tokens, static_compiled=True))
    for name, flags in table_plan(target.device.type, methods):
        measured(speclens_row(name, target, drafters, tokenizer, questions, [*argv, *flags]))
    import transformers
    head = (f"{len(questions)} prompts, {base.max_new_tokens} new tokens, greedy, {target.device} "
            f"({torch.cuda.get_device_name() if target.device.type == 'cuda' else 'CPU'}), {target.dtype}, "
            f"torch {torch.__version__}, transformers {transformers.__version__}")
    return head + "\n\n" + format_table(rows)


def _list_flag(argv: list[str], flag: str, allowed: tuple[str, ...], what: str) -> tuple[list[str], tuple[str, ...] | None]:
    """``FLAG a[,b,...]`` taken out of argv: (the other flags, the names; None without the flag).
    Each name must be one of `allowed` (`what` names them in the refusal)."""
    if flag not in argv:
        return argv, None
    i = argv.index(flag)
    given = argv[i + 1] if i + 1 < len(argv) else ""
    names = tuple(n for n in given.split(",") if n)
    if not names or any(n not in allowed for n in names):
        raise SystemExit(f"{flag} takes {what}, comma-separated, not {given!r}")
    return argv[:i] + argv[i + 2:], names


def _drafters_flag(argv: list[str]) -> tuple[list[str], tuple[str, ...]]:
    """``--drafters eagle3[,eagle]``: the table's drafters (default all); the other flags are the bench's."""
    argv, methods = _list_flag(argv, "--drafters", TABLE_DRAFTERS, " and/or ".join(TABLE_DRAFTERS))
    return argv, methods or TABLE_DRAFTERS


def _launches_flag(argv: list[str]) -> tuple[list[str], tuple[str, ...]]:
    """``--launches draft[,catch_up,...]``: the step phases whose every kernel is listed, in launch
    order; the other flags are the bench's."""
    from demo.engine import PHASES

    argv, phases = _list_flag(argv, "--launches", tuple(PHASES), f"step phases ({', '.join(PHASES)})")
    return argv, phases or ()


def main(argv: list[str] | None = None) -> int:
    from demo.bench.tools.cli import parse_args
    from demo.bench.measure import build_engine, load_questions
    from demo.bench.report import shape_label
    from demo.models.prompts import chat_ids

    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["table"]:
        print(run_table(argv[1:]))
        return 0
    if argv[:1] == ["forward"]:
        from demo.bench.tools.perf_forward import main as forward_main

        print(forward_main(argv[1:]))
        return 0
    argv, listed = _launches_flag(argv)
    config = parse_args(argv)
    engine, tokenizer = build_engine(config)
    question = load_questions(config)[0]
    ids = chat_ids(tokenizer, [{"role": "user", "content": question["turns"][0]}])
    gen = config.generation(max_new_tokens=min(config.max_new_tokens, 64))
    profile = profile_step(engine, ids, gen, listed=listed)
    from dataclasses import asdict

    shape = config.shape
    drafts = shape_label({"k": shape.depth, "shape": asdict(shape)}) if shape.depth else "target only"
    print(format_profile(profile, f"{config.method}, {drafts}, {engine.describe()['mode']}, {engine.device}"))
    return 0
