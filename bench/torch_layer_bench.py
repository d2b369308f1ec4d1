#!/usr/bin/python3
"""PyTorch baseline for bench/reference_bench.cpp: one Llama layer, fp32, 1 thread.

Usage: /usr/bin/python3 bench/torch_layer_bench.py [--reps N]

Same shape as the C++ benchmark (C=1024, NH=NKV=16, F=2816, T=2048, B=1) and the same layer as
tests/reference/torch_reference.py (whose helpers it imports). Runs PyTorch in its best
single-thread configuration (one BLAS/OpenMP thread, MALLOC_MMAP_MAX_=0: torch_one_thread.py)
with torch.set_num_threads(1).
Attention is the standard eager formulation (masked softmax over the full T x T scores; this
torch has no scaled_dot_product_attention). Prints median milliseconds of forward (no_grad) and
forward+backward.
"""
import math
import statistics
import sys
import time

import torch_one_thread  # noqa: F401  (first: sets the environment, may re-execute)
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch_reference import rms_norm, rope_cos_sin, rotate_half  # noqa: E402

C, NH, NKV, FFN, T, B = 1024, 16, 16, 2816, 2048, 1
HS = C // NH


def layer(x, p, cos, sin, visible):
    h = rms_norm(x, p["ln1"], 1e-5)
    q = (h @ p["wq"].T).view(B, T, NH, HS).transpose(1, 2)
    k = (h @ p["wk"].T).view(B, T, NKV, HS).transpose(1, 2)
    v = (h @ p["wv"].T).view(B, T, NKV, HS).transpose(1, 2)
    q = q * cos + rotate_half(q) * sin
    k = k * cos + rotate_half(k) * sin
    s = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(HS))
    s = s.masked_fill(~visible, float("-inf"))
    a = (torch.softmax(s, dim=-1) @ v).transpose(1, 2).reshape(B, T, C)
    x = x + a @ p["wo"].T
    h = rms_norm(x, p["ln2"], 1e-5)
    return x + (F.silu(h @ p["wg"].T) * (h @ p["wu"].T)) @ p["wd"].T


def median_ms(fn, reps):
    """Median wall and CPU milliseconds (CPU time is the fairer number on a shared machine)."""
    fn()  # warm-up
    wall, cpu = [], []
    for _ in range(reps):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall.append((time.perf_counter() - t0) * 1e3)
        cpu.append((time.process_time() - c0) * 1e3)
    return statistics.median(wall), statistics.median(cpu), wall


def main():
    reps = int(sys.argv[sys.argv.index("--reps") + 1]) if "--reps" in sys.argv else 5
    torch.set_num_threads(1)
    torch.manual_seed(0)
    shapes = {"ln1": (C,), "ln2": (C,), "wq": (C, C), "wk": (NKV * HS, C), "wv": (NKV * HS, C),
              "wo": (C, C), "wg": (FFN, C), "wu": (FFN, C), "wd": (C, FFN)}
    p = {n: (torch.randn(s) / math.sqrt(s[-1]) if len(s) == 2 else torch.ones(s))
         .requires_grad_() for n, s in shapes.items()}
    x = torch.randn(B, T, C, requires_grad=True)
    pos = torch.arange(T)
    cos, sin = rope_cos_sin(pos, HS, 10000.0, torch.float32)
    visible = pos[None, :] <= pos[:, None]
    dy = torch.randn(B, T, C)

    def fwd():
        with torch.no_grad():
            layer(x, p, cos, sin, visible)

    def fwd_bwd():
        y = layer(x, p, cos, sin, visible)
        y.backward(dy)

    f_ms, f_cpu, f_all = median_ms(fwd, reps)
    fb_ms, fb_cpu, fb_all = median_ms(fwd_bwd, reps)
    print(f"torch {torch.__version__}, threads={torch.get_num_threads()}, "
          f"shape C={C} NH={NH} NKV={NKV} F={FFN} T={T} B={B} fp32")
    for name, ms, cpu, every in (("forward", f_ms, f_cpu, f_all),
                                 ("forward+backward", fb_ms, fb_cpu, fb_all)):
        print(f"{name:17s} median {ms:8.1f} ms wall, {cpu:8.1f} ms CPU"
              f"  (wall of each: {', '.join(f'{t:.0f}' for t in every)})")


if __name__ == "__main__":
    main()
