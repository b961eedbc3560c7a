"""What graph mode costs and gains on ZeroGPU, where each request captures its own CUDA graphs inside
the call that has the GPU (demo/service/zerogpu.py), measured through a stand-in on a dedicated GPU.

    python -m demo.bench.tools.zerogpu --max-new-tokens 256 --calls 3

The stand-in is a `spaces` package whose GPU decorator gives every weight new GPU memory as a call
begins (ZeroGPU moves the models onto the GPU it attaches) and empties the allocator's cache as it
ends; the handler is the page's (Session.generate inside zerogpu.on_gpu), with the app's default
draft. Each call is timed whole on the wall clock (graph mode: its capture included), eager and
graph mode in turn, over the prompts; prints one markdown table: per mode the median call's
seconds, the capture's, tokens/s over the whole call, and whether graph mode's tokens were eager's.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import types

PROMPTS = ("Explain how a bicycle gear works.", "Write a short poem about the sea.",
           "Give three tips for learning a new language.")


def stand_in(modules) -> types.ModuleType:
    """A ZeroGPU `spaces` package for one process (see the module's docstring)."""
    import torch

    spaces = types.ModuleType("spaces")
    spaces.config = types.SimpleNamespace(Config=types.SimpleNamespace(zero_gpu=True))
    spaces.calls = 0  # calls made so far

    def GPU(duration=None):
        def decorate(fn):
            def call(*args, **kwargs):
                spaces.calls += 1
                with torch.no_grad():
                    for module in modules:
                        for p in module.parameters():
                            p.data = p.data.clone()
                try:
                    yield from fn(*args, **kwargs)
                finally:
                    torch.cuda.synchronize()
                    torch.cuda.empty_cache()
            return call
        return decorate

    spaces.GPU = GPU
    return spaces


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m demo.bench.tools.zerogpu", description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default=None, help="a preset (demo/models/presets.py; default: the embedded one)")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--calls", type=int, default=3, help="calls a prompt and mode")
    a = p.parse_args(argv)

    import torch

    from demo.methods import DEFAULT_METHOD
    from demo.service import zerogpu
    from demo.service.model_cache import preset_choice
    from demo.service.request import Request
    from demo.service.session import Session

    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    session = Session.load(preset_choice(a.preset), device="cuda")
    k, tree = session.default_draft()
    modules = [session.models.target.hf, *[d for d in session.models.drafters.values() if d is not None]]
    sys.modules["spaces"] = stand_in(modules)

    def reply(request):
        yield from session.generate(request)

    on_gpu = zerogpu.on_gpu(reply)
    rows = {mode: {"wall": [], "capture": [], "tokens": 0} for mode in ("eager", "cudagraph")}
    same = True
    for prompt in PROMPTS:
        for _ in range(a.calls):
            tokens = {}
            for mode in ("eager", "cudagraph"):
                engine = session.engine(DEFAULT_METHOD, mode)
                captured = engine.capture_s
                start = time.perf_counter()
                final = list(on_gpu(Request.of(prompt, method=DEFAULT_METHOD, mode=mode, max_new_tokens=a.max_new_tokens,
                                               num_spec_tokens=k, tree=tree)))[-1]
                rows[mode]["wall"].append(time.perf_counter() - start)
                rows[mode]["capture"].append(engine.capture_s - captured)
                tokens[mode] = [t.token_id for t in final.chat.turns[-1].pieces]
                rows[mode]["tokens"] += len(tokens[mode])
            same &= tokens["eager"] == tokens["cudagraph"]
    print(f"| mode ({session.name}, {torch.cuda.get_device_name()}, draft k = {k}, {tree}) | median call s | "
          "median capture s | tokens/s over the calls |\n|---|---|---|---|")
    for mode, r in rows.items():
        print(f"| {mode} | {statistics.median(r['wall']):.3f} | {statistics.median(r['capture']):.3f} | "
              f"{r['tokens'] / sum(r['wall']):.1f} |")
    print(f"\ngraph mode's tokens eager's on every call: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
