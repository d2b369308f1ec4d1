#!/usr/bin/python3
"""PyTorch reads a Hugging Face Llama checkpoint directory written by tspemu, for the C++ tests.

Usage: torch_hf_checkpoint.py CKPT_DIR INPUTS.safetensors OUT.safetensors

Reads CKPT_DIR as transformers' from_pretrained would, written independently of the C++:
config.json (LlamaConfig keys), then model.safetensors or model.safetensors.index.json and the
shards its weight_map names (the safetensors format parsed by hand: Debian has no python3-
safetensors). Checks that the tensor names are exactly HF LlamaForCausalLM's for the config
(lm_head.weight only when not tie_word_embeddings), each with the Linear [out, in] shape, every
index entry pointing to the shard holding the tensor. Then runs the Llama forward of
torch_reference.py (rotate-half RoPE, as HF) in float64 on INPUTS (I64 tokens [B, T], targets
[B, T], positions [T]) and writes OUT with "weight/<name>" (as stored), "logits" [B, T, V] and
"loss" [1] (F64). Exits non-zero, naming the problem, on any mismatch.
"""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_reference  # noqa: E402  (the Llama forward and the safetensors format)


def fail(msg):
    sys.exit("torch_hf_checkpoint: " + msg)


def expected_shapes(c):
    C, V, F = c["hidden_size"], c["vocab_size"], c["intermediate_size"]
    hs = C // c["num_attention_heads"]
    kv = c.get("num_key_value_heads") or c["num_attention_heads"]
    shapes = {"model.embed_tokens.weight": [V, C], "model.norm.weight": [C]}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes.update({
            p + "input_layernorm.weight": [C],
            p + "self_attn.q_proj.weight": [c["num_attention_heads"] * hs, C],
            p + "self_attn.k_proj.weight": [kv * hs, C],
            p + "self_attn.v_proj.weight": [kv * hs, C],
            p + "self_attn.o_proj.weight": [C, c["num_attention_heads"] * hs],
            p + "post_attention_layernorm.weight": [C],
            p + "mlp.gate_proj.weight": [F, C],
            p + "mlp.up_proj.weight": [F, C],
            p + "mlp.down_proj.weight": [C, F],
        })
    if not c.get("tie_word_embeddings", False):
        shapes["lm_head.weight"] = [V, C]
    return shapes


def read_checkpoint(d):
    index = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            weight_map = json.load(f)["weight_map"]
        tensors = {}
        for shard in sorted(set(weight_map.values())):
            got, meta = torch_reference.read_safetensors(os.path.join(d, shard))
            if meta.get("format") != "pt":
                fail(f"{shard}: metadata format {meta.get('format')!r}, transformers wants 'pt'")
            for name, t in got.items():
                if weight_map.get(name) != shard:
                    fail(f"{shard} holds {name}, which the index maps to {weight_map.get(name)}")
                tensors[name] = t
        if set(tensors) != set(weight_map):
            fail(f"index lists tensors no shard holds: {sorted(set(weight_map) - set(tensors))}")
        return tensors
    tensors, meta = torch_reference.read_safetensors(os.path.join(d, "model.safetensors"))
    if meta.get("format") != "pt":
        fail(f"model.safetensors: metadata format {meta.get('format')!r}, transformers wants 'pt'")
    return tensors


def main():
    ckpt, inputs_path, out_path = sys.argv[1:4]
    torch.set_num_threads(1)
    with open(os.path.join(ckpt, "config.json")) as f:
        c = json.load(f)
    if c.get("model_type") != "llama" or c.get("architectures") != ["LlamaForCausalLM"]:
        fail(f"not a LlamaForCausalLM config: {c.get('model_type')}, {c.get('architectures')}")
    for off in ("attention_bias", "mlp_bias"):
        if c.get(off, False):
            fail(f"{off} set")
    if c.get("rope_scaling") is not None or c.get("hidden_act", "silu") != "silu":
        fail("rope_scaling or hidden_act not the plain Llama")
    tensors = read_checkpoint(ckpt)
    shapes = expected_shapes(c)
    if set(tensors) != set(shapes):
        fail(f"names differ from HF Llama's: extra {sorted(set(tensors) - set(shapes))}, "
             f"missing {sorted(set(shapes) - set(tensors))}")
    for name, shape in shapes.items():
        if list(tensors[name].shape) != shape:
            fail(f"{name}: shape {list(tensors[name].shape)}, HF Llama's is {shape}")
    cfg = {"hidden": c["hidden_size"], "n_heads": c["num_attention_heads"],
           "n_kv_heads": c.get("num_key_value_heads") or c["num_attention_heads"],
           "n_layers": c["num_hidden_layers"], "norm_eps": c.get("rms_norm_eps", 1e-6),
           "rope_base": c.get("rope_theta", 10000.0),
           "tie_embeddings": c.get("tie_word_embeddings", False)}
    inputs, _ = torch_reference.read_safetensors(inputs_path)
    p = {n: t.to(torch.float64) for n, t in tensors.items()}
    with torch.no_grad():
        logits, loss = torch_reference.forward(p, cfg, inputs["tokens"], inputs["targets"],
                                               inputs["positions"], torch.float64)
    out = {"weight/" + n: t for n, t in tensors.items()}
    out["logits"] = logits
    out["loss"] = loss.reshape(1)
    torch_reference.write_safetensors(out_path, out)


if __name__ == "__main__":
    main()
