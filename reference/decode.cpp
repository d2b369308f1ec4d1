#include "tspemu/reference/decode.hpp"

#include <algorithm>
#include <cstddef>
#include <numeric>
#include <stdexcept>
#include <string>

#include "tspemu/reference/attention.hpp"
#include "tspemu/reference/matmul.hpp"
#include "tspemu/reference/rmsnorm.hpp"

namespace tspemu::ref {

namespace {

// The new tokens of one sequence: `count` tokens at global positions start, start + 1, ...
struct Segment {
  int seq = 0;
  int count = 0;
  std::int64_t start = 0;
};

void check_token(std::int32_t token, int vocab, int seq, std::int64_t pos, const char* op) {
  if (token < 0 || token >= vocab) {
    throw std::invalid_argument(
        std::string(op) + ": sequence " + std::to_string(seq) + " position " + std::to_string(pos) +
        " has token " + std::to_string(token) + " outside [0, " + std::to_string(vocab) + ")");
  }
}

void check_context(std::int64_t positions, std::int64_t max_context, int seq, const char* op) {
  if (max_context > 0 && positions > max_context) {
    throw std::length_error(std::string(op) + ": sequence " + std::to_string(seq) +
                            " would hold position " + std::to_string(positions - 1) +
                            ", beyond max_context=" + std::to_string(max_context) +
                            " (positions 0.." + std::to_string(max_context - 1) + ")");
  }
}

void check_prompts(const ModelConfig& cfg, const std::vector<std::vector<std::int32_t>>& prompts,
                   std::int64_t max_context, const char* op) {
  if (prompts.empty()) throw std::invalid_argument(std::string(op) + ": no prompts (B=0)");
  if (max_context < 0) {
    throw std::invalid_argument(std::string(op) + ": max_context=" + std::to_string(max_context) +
                                " must be >= 0 (0: unbounded)");
  }
  for (std::size_t b = 0; b < prompts.size(); ++b) {
    if (prompts[b].empty()) {
      throw std::invalid_argument(std::string(op) + ": prompt of sequence " + std::to_string(b) +
                                  " is empty (a prompt needs at least one token)");
    }
    check_context(std::int64_t(prompts[b].size()), max_context, int(b), op);
    for (std::size_t p = 0; p < prompts[b].size(); ++p)
      check_token(prompts[b][p], cfg.vocab, int(b), std::int64_t(p), op);
  }
}

template <class T>
void check_model(const ModelWeights<T>& w) {
  const std::size_t VC = std::size_t(w.config.vocab) * w.config.hidden;
  if (w.embed.size() != VC || w.head().size() != VC ||
      w.final_norm.size() != std::size_t(w.config.hidden) ||
      w.layers.size() != std::size_t(w.config.n_layers)) {
    throw std::invalid_argument("decode: weights do not match their config " +
                                w.config.to_string());
  }
}

// The attention core of layer `layer` for one pass over new tokens of one sequence: their K/V
// (already rotated by the block) are appended to the sequence's cache, then their queries attend
// to every cached key; the causal mask follows from the positions (a new query sees the cached
// keys and the new keys at or before it).
template <class T>
AttentionCore<T> caching_core(KvCache<T>& cache, int layer, int seq,
                              const std::vector<std::int64_t>& key_positions) {
  AttentionCore<T> core;
  core.forward = [&cache, layer, seq, &key_positions](T* att, T* lse, const T* q, const T* k,
                                                      const T* v, const std::int64_t* positions,
                                                      const AttentionDims& d) {
    cache.append(layer, seq, k, v, d.Tq);
    const int len = int(cache.length(layer, seq));
    // att = softmax(q · cache.keysᵀ / sqrt(hs), visible) · cache.values     [Tq, NH, hs]
    causal_attention_forward(att, lse, q, cache.keys(layer, seq), cache.values(layer, seq),
                             positions, key_positions.data(),
                             AttentionDims{1, d.Tq, len, d.NH, d.NKV, d.hs});
  };
  return core;
}

// One pass of the model over the new tokens [N] of one sequence, at positions s.start.., appending
// to its cache. Returns the logits [V] of the last token.
template <class T>
std::vector<T> forward_new_tokens(const ModelWeights<T>& w, KvCache<T>& cache, const Segment& s,
                                  const std::int32_t* tokens) {
  const ModelConfig& cfg = w.config;
  const int N = s.count, C = cfg.hidden, V = cfg.vocab;
  std::vector<std::int64_t> key_positions(s.start + N);  // the cached keys are at 0..S_b-1
  std::iota(key_positions.begin(), key_positions.end(), std::int64_t(0));
  const std::int64_t* positions = key_positions.data() + s.start;  // [N] global positions

  // x = embed_tokens(tokens)                                    [N, C]
  std::vector<T> x(std::size_t(N) * C), mid(std::size_t(N) * C);
  for (int n = 0; n < N; ++n)
    std::copy_n(w.embed.data() + std::size_t(tokens[n]) * C, C, x.data() + std::size_t(n) * C);
  AttentionCache<T> attn;
  MlpCache<T> mlp;
  for (int l = 0; l < cfg.n_layers; ++l) {
    attention_block_forward(cfg, w.layers[l], x.data(), mid.data(), positions, 1, N, attn,
                            caching_core(cache, l, s.seq, key_positions));
    mlp_block_forward(cfg, w.layers[l], mid.data(), x.data(), 1, N, mlp);
  }
  // logits = norm(x[last]) @ lm_head.T                         [V]
  std::vector<T> xn(C), logits(V);
  T rstd;
  rmsnorm_forward(xn.data(), &rstd, x.data() + std::size_t(N - 1) * C, w.final_norm.data(), 1, C,
                  cfg.norm_eps);
  matmul_nt(logits.data(), xn.data(), w.head().data(), 1, V, C);
  return logits;
}

}  // namespace

template <class T>
Prefill<T> prefill(const ModelWeights<T>& w, const std::vector<std::vector<std::int32_t>>& prompts,
                   std::int64_t max_context) {
  check_model(w);
  check_prompts(w.config, prompts, max_context, "prefill");
  Prefill<T> out{KvCache<T>(w.config, int(prompts.size()), max_context), {}};
  for (std::size_t b = 0; b < prompts.size(); ++b) {
    const std::vector<T> logits = forward_new_tokens(
        w, out.cache, Segment{int(b), int(prompts[b].size()), 0}, prompts[b].data());
    out.logits.insert(out.logits.end(), logits.begin(), logits.end());
  }
  return out;
}

template <class T>
std::vector<T> decode_step(const ModelWeights<T>& w, KvCache<T>& cache,
                           std::span<const std::int32_t> tokens) {
  check_model(w);
  const ModelConfig& cfg = w.config;
  if (cache.n_layers() != cfg.n_layers || cache.kv_heads() != cfg.n_kv_heads ||
      cache.head_size() != cfg.head_size()) {
    throw std::invalid_argument("decode_step: cache of L=" + std::to_string(cache.n_layers()) +
                                " NKV=" + std::to_string(cache.kv_heads()) +
                                " hs=" + std::to_string(cache.head_size()) + " for model " +
                                cfg.to_string());
  }
  const int B = cache.batch();
  if (tokens.size() != std::size_t(B)) {
    throw std::invalid_argument("decode_step: " + std::to_string(tokens.size()) +
                                " tokens for a cache of B=" + std::to_string(B) +
                                " sequences (one token per sequence)");
  }
  for (int b = 0; b < B; ++b) {
    check_token(tokens[b], cfg.vocab, b, cache.length(b), "decode_step");
    check_context(cache.length(b) + 1, cache.max_context(), b, "decode_step");
  }
  std::vector<T> logits;  // [B, V]
  for (int b = 0; b < B; ++b) {
    const std::vector<T> row =
        forward_new_tokens(w, cache, Segment{b, 1, cache.length(b)}, &tokens[b]);
    logits.insert(logits.end(), row.begin(), row.end());
  }
  return logits;
}

template <class T>
Generation<T> generate(const ModelWeights<T>& w,
                       const std::vector<std::vector<std::int32_t>>& prompts, int n_new,
                       Sampler& sampler, std::int64_t max_context, bool keep_logits) {
  if (n_new < 1) {
    throw std::invalid_argument("generate: n_new=" + std::to_string(n_new) +
                                " must be >= 1 (new tokens per sequence)");
  }
  check_prompts(w.config, prompts, max_context, "generate");
  // The cache ends holding each prompt and the first n_new - 1 generated tokens.
  for (std::size_t b = 0; b < prompts.size(); ++b)
    check_context(std::int64_t(prompts[b].size()) + n_new - 1, max_context, int(b), "generate");
  const int B = int(prompts.size()), V = w.config.vocab;
  Prefill<T> pre = prefill(w, prompts, max_context);
  Generation<T> g{std::vector<std::vector<std::int32_t>>(B), {}, std::move(pre.cache)};
  std::vector<T> logits = std::move(pre.logits);
  for (int i = 0; i < n_new; ++i) {
    if (i > 0) {
      std::vector<std::int32_t> fed(B);
      for (int b = 0; b < B; ++b) fed[b] = g.tokens[b].back();
      logits = decode_step(w, g.cache, std::span<const std::int32_t>(fed));
    }
    const std::vector<std::int32_t> next = sampler.sample(std::span<const T>(logits), B, V);
    for (int b = 0; b < B; ++b) g.tokens[b].push_back(next[b]);
    if (keep_logits) g.logits.push_back(logits);
  }
  return g;
}

#define TSPEMU_INSTANTIATE(T)                                                                      \
  template Prefill<T> prefill<T>(const ModelWeights<T>&,                                           \
                                 const std::vector<std::vector<std::int32_t>>&, std::int64_t);     \
  template std::vector<T> decode_step<T>(const ModelWeights<T>&, KvCache<T>&,                      \
                                         std::span<const std::int32_t>);                           \
  template Generation<T> generate<T>(const ModelWeights<T>&,                                       \
                                     const std::vector<std::vector<std::int32_t>>&, int, Sampler&, \
                                     std::int64_t, bool);
TSPEMU_INSTANTIATE(float)
TSPEMU_INSTANTIATE(double)
#undef TSPEMU_INSTANTIATE

}  // namespace tspemu::ref
