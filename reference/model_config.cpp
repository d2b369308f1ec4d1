#include "tspemu/reference/model_config.hpp"

#include <cmath>
#include <sstream>
#include <stdexcept>

namespace tspemu::ref {

namespace {

[[noreturn]] void fail(const std::string& what) {
  throw std::invalid_argument("ModelConfig: " + what);
}

void require_positive(const char* field, int value) {
  if (value <= 0) fail(std::string(field) + "=" + std::to_string(value) + " must be positive");
}

// RoPE divides by powers of rope_base and RMSNorm adds norm_eps under a square root: an infinite
// or NaN value turns every activation into NaN or zero, which no later check would name.
void require_finite_positive(const char* field, double value) {
  if (!std::isfinite(value) || value <= 0) {
    std::ostringstream s;
    s << field << "=" << value << " must be positive and finite";
    fail(s.str());
  }
}

}  // namespace

void ModelConfig::validate() const {
  require_positive("vocab", vocab);
  require_positive("hidden", hidden);
  require_positive("n_layers", n_layers);
  require_positive("n_heads", n_heads);
  require_positive("n_kv_heads", n_kv_heads);
  require_positive("ffn", ffn);
  if (hidden % n_heads != 0) {
    fail("n_heads=" + std::to_string(n_heads) +
         " does not divide hidden=" + std::to_string(hidden));
  }
  if (n_heads % n_kv_heads != 0) {
    fail("n_kv_heads=" + std::to_string(n_kv_heads) +
         " does not divide n_heads=" + std::to_string(n_heads));
  }
  if (head_size() % 2 != 0) {
    fail("head size hidden/n_heads=" + std::to_string(head_size()) +
         " must be even (RoPE rotates pairs)");
  }
  require_finite_positive("rope_base", rope_base);
  require_finite_positive("norm_eps", norm_eps);
}

std::string ModelConfig::to_string() const {
  std::ostringstream s;
  s << "V=" << vocab << " C=" << hidden << " L=" << n_layers << " NH=" << n_heads
    << " NKV=" << n_kv_heads << " F=" << ffn << " rope_base=" << rope_base
    << " norm_eps=" << norm_eps << " tied=" << tie_embeddings;
  return s.str();
}

}  // namespace tspemu::ref
