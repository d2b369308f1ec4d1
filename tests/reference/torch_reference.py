#!/usr/bin/python3
"""PyTorch twin of the tspemu dense reference, for the conformance test.

Usage: torch_reference.py MODEL.safetensors INPUTS.safetensors OUT_DIR

MODEL holds Llama-named weights (F64) with the ModelConfig in __metadata__ (as written by
tspemu::ref::save_model). INPUTS holds I64 tensors tokens [B, T], targets [B, T], positions [T].
Builds the model in float64 and in float32 (weights cast from the file), runs forward and
backward, and writes OUT_DIR/torch_f64.safetensors and OUT_DIR/torch_f32.safetensors with
"logits" [B, T, V], "loss" [1] and "grad/<parameter name>" for every parameter.

Written independently of the C++ from the HF Llama definitions (LlamaRMSNorm, rotate_half RoPE,
repeat_kv GQA, LlamaMLP), in plain tensor ops. One deliberate choice: RoPE cos/sin are computed in
float64 and then cast, as the C++ does (HF computes them in float32).
"""
import json
import math
import os
import struct
import sys

import torch
import torch.nn.functional as F

DTYPES = {"F64": torch.float64, "F32": torch.float32, "I64": torch.int64,
          "BF16": torch.bfloat16, "F16": torch.float16}
NAMES = {torch.float64: "F64", torch.float32: "F32", torch.int64: "I64"}


def read_safetensors(path):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    meta = header.pop("__metadata__", {})
    data = blob[8 + n:]
    tensors = {}
    for name, e in header.items():
        b, end = e["data_offsets"]
        t = torch.frombuffer(bytearray(data[b:end]), dtype=DTYPES[e["dtype"]]) if end > b else \
            torch.empty(0, dtype=DTYPES[e["dtype"]])
        tensors[name] = t.reshape(e["shape"]).clone()
    return tensors, meta


def write_safetensors(path, tensors):
    header, chunks, offset = {}, [], 0
    for name, t in tensors.items():
        t = t.detach().contiguous().cpu()
        raw = t.numpy().tobytes()
        header[name] = {"dtype": NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for c in chunks:
            f.write(c)


def rms_norm(x, w, eps):
    # LlamaRMSNorm
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope_cos_sin(positions, hs, base, dtype):
    inv_freq = 1.0 / (base ** (torch.arange(0, hs, 2, dtype=torch.float64) / hs))
    ang = positions.to(torch.float64)[:, None] * inv_freq[None, :]  # [T, hs/2]
    emb = torch.cat((ang, ang), dim=-1)                              # [T, hs]
    return emb.cos().to(dtype), emb.sin().to(dtype)


def forward(p, cfg, tokens, targets, positions, dtype):
    B, T = tokens.shape
    C, NH, NKV = cfg["hidden"], cfg["n_heads"], cfg["n_kv_heads"]
    hs = C // NH
    eps = cfg["norm_eps"]
    cos, sin = rope_cos_sin(positions, hs, cfg["rope_base"], dtype)
    visible = positions[None, :] <= positions[:, None]  # [Tq, Tk]: key pos <= query pos
    x = p["model.embed_tokens.weight"][tokens]          # [B, T, C]
    for l in range(cfg["n_layers"]):
        pre = f"model.layers.{l}."
        h = rms_norm(x, p[pre + "input_layernorm.weight"], eps)
        q = (h @ p[pre + "self_attn.q_proj.weight"].T).view(B, T, NH, hs).transpose(1, 2)
        k = (h @ p[pre + "self_attn.k_proj.weight"].T).view(B, T, NKV, hs).transpose(1, 2)
        v = (h @ p[pre + "self_attn.v_proj.weight"].T).view(B, T, NKV, hs).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(NH // NKV, dim=1)  # repeat_kv: kv head j serves heads j*g..
        v = v.repeat_interleave(NH // NKV, dim=1)
        s = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        s = s.masked_fill(~visible, float("-inf"))
        a = torch.softmax(s, dim=-1) @ v                       # [B, NH, T, hs]
        a = a.transpose(1, 2).reshape(B, T, NH * hs)
        x = x + a @ p[pre + "self_attn.o_proj.weight"].T
        h = rms_norm(x, p[pre + "post_attention_layernorm.weight"], eps)
        m = F.silu(h @ p[pre + "mlp.gate_proj.weight"].T) * (h @ p[pre + "mlp.up_proj.weight"].T)
        x = x + m @ p[pre + "mlp.down_proj.weight"].T
    x = rms_norm(x, p["model.norm.weight"], eps)
    head = p["model.embed_tokens.weight"] if cfg["tie_embeddings"] else p["lm_head.weight"]
    logits = x @ head.T
    loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))
    return logits, loss


def main():
    model_path, inputs_path, out_dir = sys.argv[1:4]
    torch.set_num_threads(1)
    weights, meta = read_safetensors(model_path)
    cfg = {k: int(meta[k]) for k in ("vocab", "hidden", "n_layers", "n_heads", "n_kv_heads", "ffn")}
    cfg["rope_base"] = float(meta["rope_base"])
    cfg["norm_eps"] = float(meta["norm_eps"])
    cfg["tie_embeddings"] = meta["tie_embeddings"] == "1"
    inputs, _ = read_safetensors(inputs_path)
    for dtype, tag in ((torch.float64, "f64"), (torch.float32, "f32")):
        p = {n: w.detach().to(dtype).clone().requires_grad_() for n, w in weights.items()}
        logits, loss = forward(p, cfg, inputs["tokens"], inputs["targets"], inputs["positions"],
                               dtype)
        loss.backward()
        out = {"logits": logits, "loss": loss.reshape(1)}
        for n, w in p.items():
            out["grad/" + n] = w.grad
        write_safetensors(os.path.join(out_dir, f"torch_{tag}.safetensors"), out)


if __name__ == "__main__":
    main()
