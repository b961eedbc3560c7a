"""Timing on the device: a function captured alone, a graph's replay time, the kernels a call
launches. Shared by demo.bench.tools.perf and demo.bench.tools.perf_forward."""

from __future__ import annotations

import statistics
import time
from collections import Counter

import torch


def kernel_count(fn, cuda: bool) -> tuple[int, float, list[tuple[str, int, float]]]:
    """fn run once under the profiler: (kernels and copies launched, their summed device ms, the six
    costliest as (name, count, ms)); on a CPU top-level operators and the wall time instead."""
    return launch_summary(*launches(fn, cuda), cuda)


def launch_summary(events: list[tuple[str, float]], wall_ms: float, cuda: bool) -> tuple[int, float, list]:
    """kernel_count's figures from launches()'s events and wall time."""
    per = Counter()
    count = Counter()
    for name, ms in events:
        per[name] += ms
        count[name] += 1
    top = [(name, count[name], ms) for name, ms in per.most_common(6)]
    return len(events), (sum(per.values()) if cuda else wall_ms), top


def launches(fn, cuda: bool) -> tuple[list[tuple[str, float]], float]:
    """fn run once under the profiler: ([(kernel, device ms)] in launch order, on a CPU its top-level
    operators and their host ms; the wall ms of the call)."""
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
        events = [e for e in prof.events() if e.cpu_parent is None and e.name.startswith(("aten::", "mkldnn::"))]
    events.sort(key=lambda e: e.time_range.start)
    return [(e.name, e.time_range.elapsed_us() / 1e3) for e in events], wall_ms


def capture_alone(fn) -> "torch.cuda.CUDAGraph":
    """fn captured as a graph of its own, after warm-ups on a side stream (as a capture needs)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def replay_ms(graph, repeats: int) -> float:
    """graph: a torch.cuda.CUDAGraph, or a captured step (its .graph)."""
    graph = getattr(graph, "graph", graph)
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)
