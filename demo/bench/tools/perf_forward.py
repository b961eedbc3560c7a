"""The verification forward alone, on random weights of a named shape.

    python -m demo.perf forward --shape smollm2-135m --widths 1,8,64,97 --kernels torch,fused
    python -m demo.perf forward --shape llama-3.1-8b --widths 8 --floor
    python -m demo.perf forward --widths 8,97 --kernels fused --tiles default,block_m=64,steps=3
    python -m demo.perf forward --widths 1,8,64 --kernels fused,persistent --grid default,per_sm=0,prefetch=0

For each kernels choice (``demo.kernels.runtime.KERNELS``) and width: the kernels one forward launches and their
summed time, and the time of the forward itself (on a GPU the replay of the forward captured
alone, median of repeats, without and with ``--compile``; on a CPU wall time, eager). The cache
holds ``--context`` tokens and the forward attends over ``--attend`` slots, as a decoding step's
would. ``rows alike``: how many of a wide forward's rows give the logits that row gives alone (its
earlier rows already in the cache), bit for bit: what a 1-row target-only step and a verification
must share for bf16 speculation to be exact. ``--floor``: the weights' bytes over the device's copy
bandwidth, measured in the same run (what reading the weights once costs), and each time over it.
``--tiles``: the fused kernels' tiles to compare (``demo.kernels.fused.Tiles``), one row each.
``--tiles`` apply to the persistent launch too, whose tasks are the fused kernels' programs;
``--grid``: the persistent launch's grids to compare (``demo.kernels.persistent.Grid``: programs a
multiprocessor, 0 as many as it holds; what it prefetches of each next layer; the widest
forward it takes), one row each; ``trace=1`` also times each stage of one launch on the GPU's clock: the slowest
program's work, the mean program's and the barrier, per stage kind.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field, fields

import torch

from demo.bench.tools.timing import capture_alone, kernel_count, replay_ms

SHAPES = {  # transformers LlamaConfig fields
    "smollm2-135m": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                         num_key_value_heads=3, vocab_size=49152, rope_theta=100000.0, tie_word_embeddings=True),
    "llama-3.1-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                         num_key_value_heads=8, vocab_size=128256, rope_theta=500000.0, tie_word_embeddings=False),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                 num_key_value_heads=1, vocab_size=512, rope_theta=10000.0, tie_word_embeddings=True),
}


@dataclass
class ForwardConfig:
    shape: str = "smollm2-135m"
    widths: tuple[int, ...] = (1, 8, 64, 97)
    kernels: tuple[str, ...] = ("torch",)
    tiles: tuple[str, ...] = ()  # the fused kernels' grids (demo.kernels.fused.Tiles), each its own rows; () the default
    grids: tuple[str, ...] = ()  # the persistent launch's grids (demo.kernels.persistent.Grid), each its own rows
    compile: bool = False  # also each width compiled (GPU)
    floor: bool = False
    context: int = 200  # tokens in the cache before the forward
    attend: int = 512  # cache slots the forward attends over
    repeats: int = 50
    top: int = 0  # list each row's costliest kernels
    device: str = "cuda"
    dtype: str = "bfloat16"


@dataclass
class ForwardRow:
    kernels: str  # the kernels choice, and the fused kernels' tiles where several are compared
    width: int
    how: str  # "graph", "compiled" (GPU) or "eager" (CPU)
    launched: int  # device kernels and copies (CPU: top-level operators)
    kernel_ms: float  # their summed device time (CPU: wall time of one call)
    ms: float  # the forward: graph replay (GPU) or wall time (CPU), median of repeats
    rows_alike: int | None = None  # of `width` rows, how many a 1-row forward gives bit for bit
    top: list[tuple[str, int, float]] = field(default_factory=list)  # (kernel, count, ms), the costliest first
    stages: list["StageCost"] = field(default_factory=list)  # per stage kind, where the grid traces (Grid.trace)


def random_target(shape: str, device: str, dtype: torch.dtype, capacity: int):
    """A demo.target.Target over a random-weight Llama of `shape`, its cache allocated."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from demo.target import Target

    torch.manual_seed(0)
    config = LlamaConfig(max_position_embeddings=8192, rms_norm_eps=1e-5, **SHAPES[shape])
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # initialise in the target dtype on the device: an 8B model in fp32 is 32 GB
    try:
        with torch.device(device):
            hf = LlamaForCausalLM(config).eval()
    finally:
        torch.set_default_dtype(default)
    target = Target(hf)
    target.setup_cache(capacity)
    target.stack_weights()
    return target


def count_rows_alike(forward, tokens: torch.Tensor, positions: torch.Tensor) -> int:
    """How many rows of forward(tokens, positions) ([1, W] each -> logits [1, W, V]) equal, bit for
    bit, the logits of that row run alone after the wide pass (which wrote the earlier rows' K/V)."""
    wide = forward(tokens, positions)
    return sum(bool(torch.equal(forward(tokens[:, i:i + 1], positions[:, i:i + 1])[0, 0], wide[0, i]))
               for i in range(tokens.shape[1]))


def weight_bytes(target) -> int:
    """Bytes a forward reads from the weights: the layers', the final norm's and the head's (the
    input embedding is a gather of a few rows)."""
    params = [*target.layers.parameters(), *target.norm.parameters(), target.lm_head.weight]
    return sum(p.numel() * p.element_size() for p in params)


def copy_floor_ms(nbytes: int, repeats: int = 20) -> float:
    """nbytes over the device-to-device copy bandwidth (bytes read plus written, a 4 GiB copy
    captured and replayed), in ms."""
    src = torch.empty(4 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    bandwidth = 2 * src.numel() / (replay_ms(capture_alone(lambda: dst.copy_(src)), repeats) * 1e-3)
    return nbytes / bandwidth * 1e3


def measure(config: ForwardConfig, target) -> list[ForwardRow]:
    """Every (kernels, width[, compiled]) row over `target` (random_target of config.shape)."""
    from demo.capture import compile_step

    cuda = config.device.startswith("cuda")
    vocab = SHAPES[config.shape]["vocab_size"]
    P = config.context
    rows = []
    with torch.inference_mode():
        target.forward(torch.randint(0, vocab, (1, P), device=config.device),
                       torch.arange(P, device=config.device).view(1, -1), attend=config.attend)
        chosen = target.kernels
        try:
            for kernels, tiles, grid in variants(config):
                target.kernels = kernels
                label = f"{kernels} {tiles}" if tiles else kernels
                label += f" grid {grid}" if grid else ""
                with tiles_of(parse_tiles(tiles) if tiles else None), grid_of(parse_grid(grid) if grid else None):
                    for W in config.widths:
                        tokens = torch.randint(0, vocab, (1, W), device=config.device)
                        positions = torch.arange(P, P + W, device=config.device).view(1, -1)

                        def forward(t=tokens, p=positions):
                            return target.forward(t, p, attend=config.attend).logits

                        alike = count_rows_alike(lambda t, p: target.forward(t, p, attend=config.attend).logits,
                                           tokens, positions)
                        runs = [("graph" if cuda else "eager", forward)]
                        if cuda and config.compile:
                            runs.append(("compiled", compile_step(forward)))
                        for how, fn in runs:
                            launched, kernel_ms, top = kernel_count(fn, cuda)
                            if cuda:
                                ms = replay_ms(capture_alone(fn), config.repeats)
                            else:
                                ms = statistics.median(_wall_ms(fn) for _ in range(max(3, config.repeats // 10)))
                            rows.append(ForwardRow(label, W, how, launched, kernel_ms, ms, alike, top,
                                                   traced_stages(forward, target) if grid and how == "graph"
                                                   and parse_grid(grid).trace else []))
                            print(format_rows(rows[-1:]).splitlines()[-1], file=sys.stderr, flush=True)
        finally:
            target.kernels = chosen
    return rows


def _fields_of(cls, what: str, text: str):
    """'default', or the fields that differ from it, 'a=1:b=2' -> cls(a=1, b=2) (whole numbers)."""
    names = [f.name for f in fields(cls)]
    values = {}
    for item in text.split(":") if text != "default" else ():
        key, _, value = item.partition("=")
        if key not in names or not value.isdigit():
            raise ValueError(f"{what} are 'default' or FIELD=N[:FIELD=N...], FIELD one of {', '.join(names)}, "
                             f"not {text!r}")
        values[key] = int(value)
    return cls(**values)


def parse_grid(text: str):
    """'default', or the fields that differ from it: 'per_sm=0:prefetch=0' -> demo.kernels.persistent.Grid."""
    from demo.kernels.persistent import Grid

    g = _fields_of(Grid, "grids", text)
    if g.prefetch not in (0, 1, 2) or g.trace not in (0, 1) or g.max_rows < 1:
        raise ValueError(f"prefetch is 0, 1 or 2, trace 0 or 1, max_rows at least 1; not {text!r}")
    return g


def parse_tiles(text: str):
    """'default', or the fields that differ from it: 'block_m=64:steps=3' -> demo.kernels.fused.Tiles."""
    from demo.kernels.fused import MIN_PART, Tiles

    t = _fields_of(Tiles, "tiles", text)
    powers = (t.block_m, t.block_n, t.head_split, t.block_k, t.wide_block_n)
    if min(t.block_m, t.block_n, t.block_k, t.wide_block_n) < MIN_PART or any(v < 1 or v & (v - 1) for v in powers) \
            or t.num_warps not in (1, 2, 4, 8) or not 1 <= t.num_stages <= 6 or t.unroll_norm not in (0, 1):
        raise ValueError(f"block_m, block_n, block_k and wide_block_n powers of two of at least {MIN_PART}, "
                         f"head_split a power of two, num_warps 1, 2, 4 or 8, num_stages 1 to 6, unroll_norm 0 or 1; "
                         f"not {text!r}")
    return t


@contextmanager
def tiles_of(tiles):
    """Every fused launch inside runs `tiles` (None: the default's); graphs captured inside keep them."""
    from demo.kernels import fused

    saved = fused.TILES
    fused.TILES = tiles or saved
    try:
        yield
    finally:
        fused.TILES = saved


@contextmanager
def grid_of(grid):
    """Every persistent launch inside runs `grid` (a demo.kernels.persistent.Grid; None: the default's)."""
    from demo.kernels import persistent

    saved = persistent.GRID
    persistent.GRID = grid or saved
    try:
        yield
    finally:
        persistent.GRID = saved


def variants(config: ForwardConfig) -> list[tuple[str, str | None, str | None]]:
    """(kernels, tiles or None, grid or None) per measured choice: the fused kernels and the persistent
    launch once per --tiles entry, the persistent once per --grid entry."""
    return [(k, t, g) for k in config.kernels
            for t in (config.tiles if k != "torch" and config.tiles else (None,))
            for g in (config.grids if k == "persistent" and config.grids else (None,))]


@dataclass
class StageCost:
    """One kind of stage of a persistent launch (demo.kernels.persistent.stage_names), over a forward."""

    name: str
    count: int  # stages of this kind in the forward
    span_us: float  # a stage's mean time, from the barrier before it opening to the one after it opening
    slowest_us: float  # the slowest program's work in it (from leaving one barrier to arriving at the next)
    mean_us: float  # a program's work, mean over programs
    barrier_us: float  # from the last program's arrival to the first one's leaving


def stage_profile(trace: torch.Tensor, names: list[str]) -> list[StageCost]:
    """trace [G, N + 1, 2], nanoseconds (Grid.trace): each program's start (twice), then for each of
    the N stages its arrival at the barrier after it and its leaving it (the last stage's both its end)
    -> a StageCost per name, in the order names first appear."""
    t = trace.double() / 1e3
    arrive, leave = t[:, 1:, 0], t[:, :, 1]
    work = arrive - leave[:, :-1]  # [G, N]
    opened = leave.min(0).values  # [N + 1]: the earliest leaving, the first program's start for index 0
    span = opened[1:] - opened[:-1]
    barrier = opened[1:] - arrive.max(0).values
    costs = []
    for name in dict.fromkeys(names):
        at = torch.tensor([i for i, n in enumerate(names) if n == name])
        costs.append(StageCost(name, len(at), span[at].mean().item(), work[:, at].max(0).values.mean().item(),
                               work[:, at].mean().item(), barrier[at].mean().item()))
    return costs


def format_stages(label: str, width: int, costs: list[StageCost]) -> str:
    total = sum(c.count * c.span_us for c in costs) / 1e3
    lines = [f"{label}, {width} rows: stages of one launch ({total:.3f} ms from the first program's start)",
             "| stage | a forward | mean us | slowest program's work us | mean program's work us | barrier us | ms |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {c.name} | {c.count} | {c.span_us:.2f} | {c.slowest_us:.2f} | {c.mean_us:.2f} | {c.barrier_us:.2f} "
              f"| {c.count * c.span_us / 1e3:.3f} |" for c in costs]
    return "\n".join(lines)


def traced_stages(forward, target) -> list[StageCost]:
    """The stage profile of one eager call of `forward` (a persistent launch under a tracing grid)."""
    from demo.kernels import persistent

    persistent.TRACES.clear()
    forward()
    torch.cuda.synchronize()
    if not persistent.TRACES:
        return []  # the forward did not take the persistent launch (Grid.max_rows)
    trace = persistent.TRACES.pop().cpu()
    return stage_profile(trace, persistent.stage_names(len(target.layers), trace.shape[1] - 1))


def _wall_ms(fn) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def format_rows(rows: list[ForwardRow], floor_ms: float | None = None) -> str:
    lines = ["| kernels | width | how | kernels launched | kernel ms | forward ms | rows alike |"
             + (" x the floor |" if floor_ms else ""),
             "|---|---|---|---|---|---|---|" + ("---|" if floor_ms else "")]
    for r in rows:
        alike = "-" if r.rows_alike is None else f"{r.rows_alike}/{r.width}"
        lines.append(f"| {r.kernels} | {r.width} | {r.how} | {r.launched} | {r.kernel_ms:.3f} | {r.ms:.3f} | {alike} |"
                     + (f" {r.ms / floor_ms:.2f} |" if floor_ms else ""))
    return "\n".join(lines)


def format_top(rows: list[ForwardRow], n: int) -> str:
    """Each row's n costliest kernels (summed time over their launches in one forward)."""
    lines = []
    for r in rows:
        lines.append(f"{r.kernels}, {r.width} rows, {r.how}:")
        lines += [f"    {ms:7.3f} ms {count:5d} x {name[:90]}" for name, count, ms in r.top[:n]]
    return "\n".join(lines)


def parse_args(argv: list[str]) -> ForwardConfig:
    from demo.kernels.runtime import KERNELS

    p = argparse.ArgumentParser(prog="python -m demo.perf forward", description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default=ForwardConfig.shape)
    p.add_argument("--widths", default="1,8,64,97", help="rows per forward, comma-separated")
    p.add_argument("--kernels", default="torch", help=f"comma-separated, of {', '.join(KERNELS)}")
    p.add_argument("--tiles", default="", help="the fused kernels' tiles to compare, comma-separated "
                                                  "'default' or FIELD=N[:FIELD=N] of demo.kernels.fused.Tiles")
    p.add_argument("--grid", default="", help="the persistent launch's grids to compare, comma-separated "
                                                 "'default' or FIELD=N[:FIELD=N] of demo.kernels.persistent.Grid")
    p.add_argument("--compile", action="store_true", help="each width compiled too (GPU)")
    p.add_argument("--floor", action="store_true", help="the weights' bytes over the copy bandwidth (GPU)")
    p.add_argument("--context", type=int, default=ForwardConfig.context)
    p.add_argument("--attend", type=int, default=ForwardConfig.attend)
    p.add_argument("--repeats", type=int, default=ForwardConfig.repeats)
    p.add_argument("--top", type=int, default=ForwardConfig.top, help="list each row's N costliest kernels (up to 6)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default=None,
                   help="default: bfloat16 on a GPU, float32 on a CPU")
    a = p.parse_args(argv)
    kernels = tuple(k for k in a.kernels.split(",") if k)
    if not kernels or any(k not in KERNELS for k in kernels):
        p.error(f"--kernels takes {', '.join(KERNELS)}, comma-separated, not {a.kernels!r}")
    tiles = tuple(t for t in a.tiles.split(",") if t)
    grids = tuple(g for g in a.grid.split(",") if g)
    try:
        for t in tiles:
            parse_tiles(t)
        for g in grids:
            parse_grid(g)
    except ValueError as e:
        p.error(str(e))
    widths = tuple(int(w) for w in a.widths.split(",") if w)
    if not widths or min(widths) < 1:
        p.error(f"--widths takes positive integers, comma-separated, not {a.widths!r}")
    if a.context + max(widths) > a.attend:
        p.error("--attend must cover the context and the widest forward")
    return ForwardConfig(shape=a.shape, widths=widths, kernels=kernels, tiles=tiles, grids=grids,
                         compile=a.compile, floor=a.floor,
                         context=a.context, attend=a.attend, repeats=a.repeats, top=a.top, device=a.device,
                         dtype=a.dtype or ("bfloat16" if a.device.startswith("cuda") else "float32"))


def main(argv: list[str]) -> str:
    config = parse_args(argv)
    if config.floor and not config.device.startswith("cuda"):
        raise SystemExit("--floor measures a GPU's copy bandwidth")
    target = random_target(config.shape, config.device, getattr(torch, config.dtype), config.attend)
    rows = measure(config, target)
    floor_ms = None
    head = f"{config.shape}, random weights, {config.dtype}, {config.device}"
    if config.floor:
        floor_ms = copy_floor_ms(weight_bytes(target))
        head += f"; reading the weights once: {floor_ms:.3f} ms at the measured copy bandwidth"
    head += f"; {config.context} tokens in the cache, attending over {config.attend} slots"
    out = head + "\n\n" + format_rows(rows, floor_ms)
    out += "".join("\n\n" + format_stages(r.kernels, r.width, r.stages) for r in rows if r.stages)
    return out + ("\n\n" + format_top(rows, config.top) if config.top else "")
