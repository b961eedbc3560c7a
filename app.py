"""SpecLens: watch a target LLM generate with an EAGLE or EAGLE-3 drafter.

    python app.py                       # the embedded default (SmolLM2-135M-Instruct), GPU if there is one
    python app.py --preset "Qwen3-8B"   # another preset of demo/models/presets.py
    python app.py --target DIR --eagle3-drafter DIR
    python app.py --public              # as on a Space: presets only, per-visitor limits (demo/service/hosting.py)

Public when SPACE_ID is set (a Hugging Face Space), local otherwise; --public / --local choose.
Honours GRADIO_SERVER_NAME / GRADIO_SERVER_PORT, and the SPECLENS_* variables of demo/service/settings.py
(a Space's settings: preset, what the page offers first, queue size). Launch and wiring only: the UI
is demo/views.py, the models and requests demo/service/session.py, the hosting limits demo/service/hosting.py.
"""

from __future__ import annotations

import argparse
import time

from demo.methods import DRAFT_METHODS, METHOD_LABELS


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", default=None, help="a preset name of demo/models/presets.py (default: the embedded one)")
    p.add_argument("--target", default=None, help="target: 'default', a local directory or a hub id (overrides the preset's)")
    for method in DRAFT_METHODS:  # --eagle-drafter, --eagle3-drafter
        p.add_argument(f"--{method}-drafter", default=None,
                       help=f"{METHOD_LABELS[method]} drafter: a local directory or a hub id")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:1, ...")
    p.add_argument("--dtype", default="auto", help="auto (bf16 on GPU, fp32 on CPU), float32, bfloat16, float16")
    p.add_argument("--max-context", type=int, default=2048, help="tokens of context (KV cache size)")
    p.add_argument("--no-warmup", action="store_true", help="skip the tiny warm-up generation")
    p.add_argument("--share", action="store_true", help="also serve through a public Gradio link")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--public", dest="public", action="store_true", default=None,
                      help="presets only, limits per visitor (the default when SPACE_ID is set)")
    mode.add_argument("--local", dest="public", action="store_false",
                      help="everything, your own models too (the default otherwise)")
    return p.parse_args(argv)


def build_session(args: argparse.Namespace):
    from demo.service.model_cache import preset_choice
    from demo.service.session import Session

    choice = preset_choice(args.preset)
    if args.target:
        choice.target, choice.name = args.target, args.target
        choice.drafters = {method: None for method in DRAFT_METHODS}
    for method in DRAFT_METHODS:
        if getattr(args, f"{method}_drafter"):
            choice.drafters[method] = getattr(args, f"{method}_drafter")
    session = Session.load(choice, device=args.device, dtype=args.dtype, max_context=args.max_context,
                           progress=lambda f, d: print(f"[speclens] {d}", flush=True))
    for w in session.warnings:
        print(f"[speclens] warning: {w}", flush=True)
    return session


def main(argv=None) -> None:
    args = parse_args(argv)
    start = time.perf_counter()
    from demo.models.loading import LoadError
    from demo.service import zerogpu
    from demo.service.hosting import Hosting, limit_malloc_arenas
    from demo.service.settings import AppSettings

    hosting = Hosting.choose(args.public)
    if hosting.public:  # before any thread starts: the memory its threads free stays reusable (hosting.py)
        limit_malloc_arenas()

    try:
        settings = AppSettings.from_env()
        args.preset = args.preset or settings.preset  # --preset wins over SPECLENS_PRESET
        session = build_session(args)
        settings.check(session.methods(), session.name, session.max_context)
    except (LoadError, ValueError) as e:  # a bad setting, preset, path, hub id, device or dtype: one line, no traceback
        raise SystemExit(f"speclens: {e}") from None
    if zerogpu.active():  # no GPU is attached outside a spaces.GPU call
        print(f"[speclens] ZeroGPU: {zerogpu.GRAPHS_PER_CALL}; no warm-up at start", flush=True)
    elif not args.no_warmup:
        modes = ("eager",) if session.cudagraph_unavailable() else ("eager", "cudagraph")
        print(f"[speclens] warm-up ({', '.join(modes)}): {session.warmup(modes):.1f} s", flush=True)
    from demo.ui.assets import CSS_PATH
    from demo.views import build_demo

    if hosting.public:  # what a request carries reaches the log only in bounded lines
        from demo.service.server_log import bound_log

        bound_log()
    demo = build_demo(session, hosting, defaults=settings)
    hosting.queue(demo, settings.queue_size)
    print(f"[speclens] ready after {time.perf_counter() - start:.1f} s on {session.describe()['device']}, "
          f"{'public' if hosting.public else 'local'}", flush=True)
    demo.launch(share=args.share, css_paths=[CSS_PATH], **hosting.launch_options(demo))


if __name__ == "__main__":
    main()
