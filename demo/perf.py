"""Where a decoding step's time goes: kernels launched and device time per phase of one step.

    python -m demo.perf --method eagle3 -k 8 --tree-topk 8 --num-draft-tokens 96 --mode cudagraph

Runs one short generation (so every buffer holds a real step's state), then calls each phase of a
step on its own: ``project`` (the drafter's feature projection), ``catch_up``, ``draft`` (the chain
or tree), ``verify`` (the target forward) and ``accept`` (the acceptance test, compaction and the
packed result). For each it reports the kernels launched (torch.profiler's device events) and the
time: on a GPU the summed kernel time of an eager call, on a CPU wall time. In cudagraph mode it
also times the replay of the whole step's graph and of the prompt's prefill graph (CUDA events,
median of repeats). Phases are run in step order on the state the generation left, so each
computes a real step's work; ``accept`` moves the engine's state on, so it runs last.

The model flags are the bench's (``python -m demo.bench --help``).
"""

from __future__ import annotations

import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass, field

import torch

PHASES = ("project", "catch_up", "draft", "verify", "accept")


@dataclass
class PhaseProfile:
    name: str
    kernels: int  # device kernels and copies launched (CPU: top-level operators)
    kernel_ms: float  # their summed device time (CPU: wall time of one call)
    top: list[tuple[str, int, float]] = field(default_factory=list)  # (kernel, count, ms), the costliest first


@dataclass
class StepProfile:
    phases: list[PhaseProfile]
    step_graph_ms: float | None = None  # replay of the whole step's graph (greedy), cudagraph mode
    prefill_graph_ms: float | None = None  # replay of the prompt's prefill graph
    prompt_tokens: int = 0
    prefill_rows: int = 0  # the prompt's bucket


def phase_functions(engine, b, params, generator=None) -> dict:
    """The step's phases over the buffers ``b`` (demo.engine.StepBuffers), in step order."""
    fns = {}
    if b.k:
        fns["project"] = lambda: b.catch_hidden.copy_(engine.drafter.project(b.catch_features))
        fns["catch_up"] = lambda: engine._catch_up(b)
        fns["draft"] = (lambda: engine._draft_tree(b)) if b.tree is not None else (lambda: engine._chain(b))
    verified = []  # the last verification's (logits, features), which the acceptance test reads

    def verify():
        verified[:] = [engine._verify_forward(b)]
    fns["verify"] = verify
    accept = engine._accept_tree if b.tree is not None else engine._accept
    fns["accept"] = lambda: accept(b, *verified[-1], params, generator)
    return fns


def _count(fn, cuda: bool) -> tuple[int, float, list[tuple[str, int, float]]]:
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]
    start = time.perf_counter()
    with profile(activities=activities) as prof:
        fn()
        if cuda:
            torch.cuda.synchronize()
    wall_ms = (time.perf_counter() - start) * 1e3
    if cuda:
        events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    else:
        events = [e for e in prof.events() if e.cpu_parent is None and e.name.startswith("aten::")]
    per = Counter()
    count = Counter()
    for e in events:
        per[e.name] += e.time_range.elapsed_us() / 1e3
        count[e.name] += 1
    top = [(name, count[name], ms) for name, ms in per.most_common(6)]
    return len(events), (sum(per.values()) if cuda else wall_ms), top


def _replay_ms(graph, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


@torch.inference_mode()
def profile_step(engine, prompt_ids: list[int], gen, repeats: int = 10) -> StepProfile:
    """Profile each phase of one decoding step of ``gen``'s shape, after a generation of ``gen``."""
    for _ in engine.generate(prompt_ids, gen):
        pass
    b = engine.prepare(gen.draft_shape(gen.num_spec_tokens if engine.drafter is not None else 0))
    cuda = engine.device.type == "cuda"
    generator = None if gen.sampling.greedy else torch.Generator(device=engine.device).manual_seed(gen.seed)
    phases = []
    for name, fn in phase_functions(engine, b, gen.sampling, generator).items():
        if name != "accept":
            fn()  # warm: a first eager call may pick kernels or allocate
        kernels, ms, top = _count(fn, cuda)
        phases.append(PhaseProfile(name, kernels, ms, top))
    out = StepProfile(phases, prompt_tokens=len(prompt_ids), prefill_rows=engine.prefill_bucket(len(prompt_ids)))
    if "step" in b.graphs:  # each replay moves the state on by one step: few repeats, after the phases
        out.step_graph_ms = _replay_ms(b.graphs["step"], repeats)
    prefill = b.graphs.get(f"prefill{out.prefill_rows}")
    if prefill is not None:
        out.prefill_graph_ms = _replay_ms(prefill, repeats)
    return out


def format_profile(profile: StepProfile, title: str) -> str:
    lines = [title, f"{'phase':<10}{'kernels':>9}{'kernel ms':>11}  costliest kernels (count, ms)"]
    for p in profile.phases:
        top = "; ".join(f"{n[:48]} ({c}, {ms:.3f})" for n, c, ms in p.top[:3])
        lines.append(f"{p.name:<10}{p.kernels:>9}{p.kernel_ms:>11.3f}  {top}")
    lines.append(f"{'step':<10}{sum(p.kernels for p in profile.phases):>9}"
                 f"{sum(p.kernel_ms for p in profile.phases):>11.3f}")
    if profile.step_graph_ms is not None:
        lines.append(f"step graph replay: {profile.step_graph_ms:.3f} ms")
    if profile.prefill_graph_ms is not None:
        lines.append(f"prefill graph replay ({profile.prompt_tokens} prompt tokens, run at {profile.prefill_rows} "
                     f"rows): {profile.prefill_graph_ms:.3f} ms")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from demo.bench import build_engine, generation_config, load_questions, parse_args, shape_label, tree_shape
    from demo.prompts import chat_ids

    args = parse_args(argv)
    engine, tokenizer = build_engine(args)
    question = load_questions(args)[0]
    ids = chat_ids(tokenizer, [{"role": "user", "content": question["turns"][0]}])
    gen = generation_config(args, max_new_tokens=min(args.max_new_tokens, 64))
    profile = profile_step(engine, ids, gen)
    from dataclasses import asdict

    shape = tree_shape(args)
    drafts = shape_label({"k": shape.depth, "shape": asdict(shape)}) if shape.depth else "target only"
    print(format_profile(profile, f"{args.method}, {drafts}, {engine.describe()['mode']}, {engine.device}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
