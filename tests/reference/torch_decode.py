#!/usr/bin/python3
"""KV-cached greedy decoding in PyTorch, for the reference decode conformance test.

Usage: torch_decode.py MODEL.safetensors INPUTS.safetensors OUT.safetensors

MODEL: Llama-named F64 weights with the ModelConfig in __metadata__ (tspemu::ref::save_model).
INPUTS (I64): prompt_tokens [sum P_b] (the prompts one after the other), prompt_lengths [B],
n_new [1], forced [B, n_new] (the tokens to feed in the float32 run).
OUT:
  tokens      I64 [B, n_new]     float64 greedy tokens, free-running (torch.argmax: first maximum)
  logits_f64  F64 [n_new, B, V]  the logits each token was chosen from
  logits_f32  F32 [n_new, B, V]  float32, teacher-forced: step i > 0 is fed forced[:, i - 1]
  k.L.B, v.L.B F64 [S_b, NKV, hs] float64 cache of layer L, sequence B after the run (K after RoPE)

The cache is Hugging Face's `past_key_values` scheme: each layer keeps K (after RoPE) and V of
every position seen, [NKV, S, hs] per sequence; a step computes K/V of its new token only,
appends them (torch.cat) and attends its query to the whole cache. The layer math is the
conformance script's (torch_reference.py): LlamaRMSNorm, rotate_half RoPE with cos/sin computed in
float64 and cast, repeat_kv GQA, LlamaMLP.
"""
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_reference import read_safetensors, rms_norm, rope_cos_sin, rotate_half, \
    write_safetensors  # noqa: E402


def read_config(meta):
    cfg = {k: int(meta[k]) for k in ("vocab", "hidden", "n_layers", "n_heads", "n_kv_heads", "ffn")}
    cfg["rope_base"] = float(meta["rope_base"])
    cfg["norm_eps"] = float(meta["norm_eps"])
    cfg["tie_embeddings"] = meta["tie_embeddings"] == "1"
    return cfg


def extend(p, cfg, past, tokens, dtype):
    """Feeds tokens [T] of one sequence at the positions after its cache `past` (a list of
    (k, v) per layer, [NKV, S, hs] each, or None when empty), appends their K/V, returns the
    logits [V] of the last token."""
    C, NH, NKV, eps = cfg["hidden"], cfg["n_heads"], cfg["n_kv_heads"], cfg["norm_eps"]
    hs, T = C // NH, tokens.shape[0]
    start = 0 if past[0] is None else past[0][0].shape[1]
    positions = torch.arange(start, start + T)
    cos, sin = rope_cos_sin(positions, hs, cfg["rope_base"], dtype)  # [T, hs]
    x = p["model.embed_tokens.weight"][tokens]                      # [T, C]
    for l in range(cfg["n_layers"]):
        pre = f"model.layers.{l}."
        h = rms_norm(x, p[pre + "input_layernorm.weight"], eps)
        q = (h @ p[pre + "self_attn.q_proj.weight"].T).view(T, NH, hs).transpose(0, 1)
        k = (h @ p[pre + "self_attn.k_proj.weight"].T).view(T, NKV, hs).transpose(0, 1)
        v = (h @ p[pre + "self_attn.v_proj.weight"].T).view(T, NKV, hs).transpose(0, 1)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        if past[l] is not None:
            k = torch.cat((past[l][0], k), dim=1)
            v = torch.cat((past[l][1], v), dim=1)
        past[l] = (k, v)                                             # [NKV, S, hs]
        kr = k.repeat_interleave(NH // NKV, dim=0)                   # repeat_kv
        vr = v.repeat_interleave(NH // NKV, dim=0)
        s = (q @ kr.transpose(-2, -1)) * (1.0 / math.sqrt(hs))       # [NH, T, S]
        visible = torch.arange(k.shape[1])[None, :] <= positions[:, None]
        s = s.masked_fill(~visible, float("-inf"))
        a = (torch.softmax(s, dim=-1) @ vr).transpose(0, 1).reshape(T, NH * hs)
        x = x + a @ p[pre + "self_attn.o_proj.weight"].T
        h = rms_norm(x, p[pre + "post_attention_layernorm.weight"], eps)
        m = F.silu(h @ p[pre + "mlp.gate_proj.weight"].T) * (h @ p[pre + "mlp.up_proj.weight"].T)
        x = x + m @ p[pre + "mlp.down_proj.weight"].T
    head = p["model.embed_tokens.weight"] if cfg["tie_embeddings"] else p["lm_head.weight"]
    return rms_norm(x[-1], p["model.norm.weight"], eps) @ head.T


def decode(p, cfg, prompts, n_new, forced=None):
    """Prefill then n_new - 1 decode steps per sequence; feeds the greedy token, or forced[b].
    Returns tokens [B, n_new], logits [n_new, B, V] and the caches."""
    tokens, logits, caches = [], [], []
    for b, prompt in enumerate(prompts):
        past = [None] * cfg["n_layers"]
        out, rows = [], []
        row = extend(p, cfg, past, prompt, p["model.norm.weight"].dtype)
        for i in range(n_new):
            if i > 0:
                fed = out[-1] if forced is None else int(forced[b, i - 1])
                row = extend(p, cfg, past, torch.tensor([fed]), row.dtype)
            rows.append(row)
            out.append(int(torch.argmax(row)))
        tokens.append(out)
        logits.append(torch.stack(rows))
        caches.append(past)
    return torch.tensor(tokens, dtype=torch.int64), torch.stack(logits, dim=1), caches


def main():
    model_path, inputs_path, out_path = sys.argv[1:4]
    torch.set_num_threads(1)
    weights, meta = read_safetensors(model_path)
    cfg = read_config(meta)
    inputs, _ = read_safetensors(inputs_path)
    prompts = list(torch.split(inputs["prompt_tokens"], inputs["prompt_lengths"].tolist()))
    n_new = int(inputs["n_new"][0])
    with torch.no_grad():
        p64 = {n: w.to(torch.float64) for n, w in weights.items()}
        tokens, logits64, caches = decode(p64, cfg, prompts, n_new)
        p32 = {n: w.to(torch.float32) for n, w in weights.items()}
        _, logits32, _ = decode(p32, cfg, prompts, n_new, forced=inputs["forced"])
    out = {"tokens": tokens, "logits_f64": logits64, "logits_f32": logits32}
    for b, past in enumerate(caches):
        for l, (k, v) in enumerate(past):
            out[f"k.{l}.{b}"] = k.transpose(0, 1)  # [S, NKV, hs]
            out[f"v.{l}.{b}"] = v.transpose(0, 1)
    write_safetensors(out_path, out)


if __name__ == "__main__":
    main()
