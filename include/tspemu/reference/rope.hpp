// Rotary position embedding (RoPE), Hugging Face Llama "rotate-half" convention.
//
// What: rotates each head vector in place by angles pos * base^(-2i/hs), i in [0, hs/2),
//   pairing dimension i with i + hs/2 (not interleaved pairs 2i, 2i+1). This is the layout of
//   `model.layers.N.self_attn.{q,k}_proj.weight` in HF Llama checkpoints:
//     torch: inv_freq = 1 / base ** (arange(0, hs, 2) / hs);  ang = pos[:, None] * inv_freq
//            cos = cat(cos(ang), cos(ang)); sin = cat(sin(ang), sin(ang))
//            rotate_half(x) = cat(-x[..., hs/2:], x[..., :hs/2]);  out = x*cos + rotate_half(x)*sin
// Requirements: hs even; positions has T entries, the GLOBAL token positions of the T rows (so a
//   rank holding a zigzag shard passes its tokens' global positions).
// Guarantees: angles, cos and sin are computed in double and rounded to T (identical tables for
//   float and double apart from that rounding; the PyTorch conformance script does the same).
//   Backward is the inverse rotation (the rotation is orthogonal), also in place.
// Cost: 4 · T · NH · hs/2 flops; the cos/sin table (T · hs/2 pow, cos, sin in double) is kept
//   per thread and reused while positions, hs and base stay those of the thread's last call.
#pragma once

#include <cstdint>

namespace tspemu::ref {

template <class T>
void rope_forward(T* x,                           // [B, T, NH, hs], rotated in place
                  const std::int64_t* positions,  // [T]
                  int B, int T_, int NH, int hs, double base);

// dx = Rᵀ dy, in place: d[B, T, NH, hs] holds dL/d(rotated) on entry, dL/d(unrotated) on exit.
template <class T>
void rope_backward(T* d, const std::int64_t* positions, int B, int T_, int NH, int hs, double base);

}  // namespace tspemu::ref
