// ShardMap: which elements of a master tensor a rank's shard holds, so a user schedule's gradient
// shards can be put back together and judged against the reference.
//
// What: every parameter is viewed as a matrix [rows, cols] (a Linear weight is [out, in] as in
// PyTorch; a norm weight is [1, C]). A shard is a list of rectangles of that matrix; the shard's
// elements are the rectangles' elements one rectangle after the other, row-major inside each.
// The helpers cover the usual cuts:
//   replicated()            the whole tensor (e.g. Ulysses and ring attention weights)
//   column_parallel(r, n)   rows [r·R/n, (r+1)·R/n): Megatron column-parallel (q/k/v, gate, up)
//   row_parallel(r, n)      columns [r·C/n, (r+1)·C/n): Megatron row-parallel (o_proj, down)
//   head_sharded(r, n)      heads [r·H/n, (r+1)·H/n) of the tensor's head axis: rows of q/k/v,
//                           columns of o_proj (TSP's attention shard)
//   vocab_sharded(r, n)     rows of an embedding or LM head [V, C]
//   rows(b, c), columns(b, c), rectangles({...})   anything else
// Activations are sharded along the sequence: token_shards.hpp says which tokens a rank holds.
// Requirements: a map resolves against the tensor it is declared for; rectangles must lie inside
// it and divisions must be exact, else resolve() throws std::invalid_argument naming the tensor,
// its shape and the map.
// Guarantees: resolve() is pure; size() of the resolved map is the shard's element count.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace tspemu::check {

struct Rect {
  std::int64_t row0 = 0, rows = 0, col0 = 0, cols = 0;
};

// The master tensor a map is resolved against. heads > 0 names the head axis (0: rows, 1: cols)
// and its number of heads.
struct TensorShape {
  std::string name;
  std::int64_t rows = 1, cols = 1;
  std::int64_t heads = 0;
  int head_axis = 0;
};

class ShardMap {
 public:
  using Resolve = std::function<std::vector<Rect>(const TensorShape&)>;
  ShardMap(std::string description, Resolve resolve)
      : description_(std::move(description)), resolve_(std::move(resolve)) {}

  const std::string& description() const { return description_; }
  // The rectangles for `t`, checked to lie inside it.
  std::vector<Rect> resolve(const TensorShape& t) const;

 private:
  std::string description_;
  Resolve resolve_;
};

std::int64_t element_count(const std::vector<Rect>& rects);

ShardMap replicated();
ShardMap column_parallel(int rank, int n);
ShardMap row_parallel(int rank, int n);
ShardMap head_sharded(int rank, int n);
ShardMap vocab_sharded(int rank, int n);
ShardMap rows(std::int64_t begin, std::int64_t count);
ShardMap columns(std::int64_t begin, std::int64_t count);
ShardMap rectangles(std::vector<Rect> rects);

// Copies the shard `rects` of `master` ([t.rows, t.cols], row-major) into `shard`, or back.
void cut(const float* master, const TensorShape& t, const std::vector<Rect>& rects, float* shard);
void cut(const double* master, const TensorShape& t, const std::vector<Rect>& rects, double* shard);
void paste(const float* shard, const TensorShape& t, const std::vector<Rect>& rects, float* master);

}  // namespace tspemu::check
