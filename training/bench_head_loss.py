"""Times the EAGLE-3 head loss (training.losses.head_cross_entropy, forward + backward) with the
PyTorch reference and with the Triton kernel at a training step's shape: one TTT step's rows
against the target's full vocabulary, bf16 autocast. CUDA only.

    python -m training.bench_head_loss [--rows 10240] [--vocab 49152] [--hidden 576]
"""
import argparse
import os

import torch

from training.head_loss_kernel import BACKEND_ENV
from training.losses import head_cross_entropy


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=10240)
    ap.add_argument("--vocab", type=int, default=49152)
    ap.add_argument("--hidden", type=int, default=576)
    ap.add_argument("--top1-weight", type=float, default=1.0)
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args()
    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(0)
    B, S = 16, 1024
    x = torch.randn(args.rows, args.hidden, device=dev, generator=g, requires_grad=True)
    w = (0.05 * torch.randn(args.vocab, args.hidden, device=dev, generator=g)).requires_grad_()
    source = (3 * torch.randn(B, S, args.vocab, device=dev, generator=g)).to(torch.bfloat16)
    rb = torch.randint(0, B, (args.rows,), device=dev, generator=g)
    rs = torch.randint(0, S, (args.rows,), device=dev, generator=g)
    top = torch.randint(0, args.vocab, (args.rows,), device=dev, generator=g)
    results = {}
    for backend in ("torch", "triton"):
        os.environ[BACKEND_ENV] = backend if backend == "torch" else "auto"

        def step():
            with torch.autocast(dev, dtype=torch.bfloat16):
                loss, _ = head_cross_entropy(x, w, source, rb, rs, top, args.top1_weight)
            loss.backward()
            return loss

        for _ in range(3):
            step()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(args.iters):
            x.grad = w.grad = None
            start.record()
            loss = step()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        results[backend] = (sorted(times)[len(times) // 2], float(loss), x.grad.clone(), w.grad.clone())
    (t0, l0, gx0, gw0), (t1, l1, gx1, gw1) = results["torch"], results["triton"]
    rel = lambda a, b: float((a - b).norm() / b.norm())
    print(f"rows {args.rows}  vocab {args.vocab}  hidden {args.hidden}  bf16 autocast, forward + backward, median of {args.iters}")
    print(f"torch  {t0:8.2f} ms   loss {l0:.6f}")
    print(f"triton {t1:8.2f} ms   loss {l1:.6f}   grad x rel diff {rel(gx1, gx0):.2e}  grad W rel diff {rel(gw1, gw0):.2e}")
    print(f"speed-up {t0 / t1:.2f}x")


if __name__ == "__main__":
    main()
