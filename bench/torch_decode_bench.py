#!/usr/bin/python3
"""PyTorch baseline for BM_DecodeStep (bench/reference_bench.cpp): one KV-cached decode step of one
Llama layer, fp32, B=1, 1 thread.

Usage: /usr/bin/python3 bench/torch_decode_bench.py [--reps N]

Same shape as the C++ benchmark (C=1024, NH=NKV=16, F=2816, V=32, a cache of S=2048 positions
growing by one per step) and the same step as tests/reference/torch_decode.py (whose extend() it
runs: Hugging Face's past_key_values scheme, K/V of the new token computed once and appended with
torch.cat). One thread, as bench/torch_layer_bench.py (torch_one_thread.py). Prints the median
milliseconds of reps x 10 steps.
"""
import statistics
import sys
import time

import torch_one_thread  # noqa: F401  (first: sets the environment, may re-execute)
import torch  # noqa: E402
from torch_decode import extend  # noqa: E402

CFG = {"vocab": 32, "hidden": 1024, "n_layers": 1, "n_heads": 16, "n_kv_heads": 16, "ffn": 2816,
       "rope_base": 10000.0, "norm_eps": 1e-5, "tie_embeddings": False}
S, STEPS = 2048, 10


def weights():
    C, F, V = CFG["hidden"], CFG["ffn"], CFG["vocab"]
    g = torch.Generator().manual_seed(1)
    shapes = {"model.embed_tokens.weight": (V, C), "lm_head.weight": (V, C),
              "model.norm.weight": (C,), "model.layers.0.input_layernorm.weight": (C,),
              "model.layers.0.post_attention_layernorm.weight": (C,)}
    for n in ("q", "k", "v", "o"):
        shapes[f"model.layers.0.self_attn.{n}_proj.weight"] = (C, C)
    shapes["model.layers.0.mlp.gate_proj.weight"] = (F, C)
    shapes["model.layers.0.mlp.up_proj.weight"] = (F, C)
    shapes["model.layers.0.mlp.down_proj.weight"] = (C, F)
    return {n: torch.randn(s, generator=g) / s[-1] ** 0.5 for n, s in shapes.items()}


def main():
    reps = int(sys.argv[sys.argv.index("--reps") + 1]) if "--reps" in sys.argv else 5
    torch.set_num_threads(1)
    p = weights()
    past = [None]
    token = torch.tensor([5])
    with torch.no_grad():
        extend(p, CFG, past, torch.full((S,), 3, dtype=torch.int64), torch.float32)
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            for _ in range(STEPS):
                extend(p, CFG, past, token, torch.float32)
            times.append((time.perf_counter() - t0) / STEPS * 1e3)
    print(f"torch {torch.__version__} decode step (C=1024 F=2816 S={S}, fp32, 1 thread): "
          f"median {statistics.median(times):.3f} ms over {reps} x {STEPS} steps")


if __name__ == "__main__":
    main()
