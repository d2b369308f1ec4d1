#include "tspemu/tsp/tsp_shape.hpp"

#include <stdexcept>
#include <string>

namespace tspemu::tsp {

namespace {
[[noreturn]] void reject(const std::string& why) {
  throw std::invalid_argument("TSP config: " + why);
}
std::string s(int v) {
  return std::to_string(v);
}
}  // namespace

void TspShape::validate() const {
  model.validate();
  if (D < 1) reject("D=" + s(D) + " must be >= 1");
  if (B < 1) reject("B=" + s(B) + " must be >= 1");
  if (S < 1) reject("S=" + s(S) + " must be >= 1");
  if (model.n_heads % D != 0)
    reject("D=" + s(D) + " does not divide n_heads=" + s(model.n_heads) +
           " (each rank owns whole query heads)");
  if (model.n_kv_heads % D != 0)
    reject("D=" + s(D) + " does not divide n_kv_heads=" + s(model.n_kv_heads) +
           " (each rank owns whole KV heads)");
  if (model.ffn % D != 0)
    reject("D=" + s(D) + " does not divide the MLP width ffn=" + s(model.ffn));
  if (options.layout == LayoutKind::zigzag && S % (2 * D) != 0)
    reject("zigzag layout needs S=" + s(S) + " divisible by 2D=" + s(2 * D));
  if (S % D != 0) reject("S=" + s(S) + " is not divisible by D=" + s(D));
  if (options.head_buckets < 1 || NKVl() % options.head_buckets != 0)
    reject("head_buckets=" + s(options.head_buckets) + " must divide the " + s(NKVl()) +
           " KV heads of a shard (n_kv_heads/D)");
}

}  // namespace tspemu::tsp
