#include "tspemu/check/shard_map.hpp"

#include <cstring>
#include <stdexcept>

namespace tspemu::check {

namespace {

std::string shape_of(const TensorShape& t) {
  return t.name + " [" + std::to_string(t.rows) + ", " + std::to_string(t.cols) + "]";
}

// [rank·extent/n, (rank+1)·extent/n) of an axis, checked.
std::pair<std::int64_t, std::int64_t> split(const TensorShape& t, std::int64_t extent, int rank,
                                            int n, const char* what) {
  if (n <= 0 || rank < 0 || rank >= n)
    throw std::invalid_argument("shard map " + std::string(what) + "(" + std::to_string(rank) +
                                ", " + std::to_string(n) + ") of " + shape_of(t) +
                                ": rank must be in [0, n)");
  if (extent % n != 0)
    throw std::invalid_argument("shard map " + std::string(what) + "(" + std::to_string(rank) +
                                ", " + std::to_string(n) + ") of " + shape_of(t) + ": " +
                                std::to_string(extent) + " is not divisible by " +
                                std::to_string(n));
  const std::int64_t part = extent / n;
  return {rank * part, part};
}

}  // namespace

std::vector<Rect> ShardMap::resolve(const TensorShape& t) const {
  std::vector<Rect> rects = resolve_(t);
  for (const Rect& r : rects) {
    if (r.row0 < 0 || r.col0 < 0 || r.rows < 0 || r.cols < 0 || r.row0 + r.rows > t.rows ||
        r.col0 + r.cols > t.cols)
      throw std::invalid_argument("shard map " + description_ + " of " + shape_of(t) +
                                  ": rectangle rows [" + std::to_string(r.row0) + ", " +
                                  std::to_string(r.row0 + r.rows) + ") cols [" +
                                  std::to_string(r.col0) + ", " + std::to_string(r.col0 + r.cols) +
                                  ") lies outside the tensor");
  }
  return rects;
}

std::int64_t element_count(const std::vector<Rect>& rects) {
  std::int64_t n = 0;
  for (const Rect& r : rects) n += r.rows * r.cols;
  return n;
}

ShardMap replicated() {
  return {"replicated", [](const TensorShape& t) {
            return std::vector<Rect>{{0, t.rows, 0, t.cols}};
          }};
}

ShardMap column_parallel(int rank, int n) {
  return {"column_parallel(" + std::to_string(rank) + ", " + std::to_string(n) + ")",
          [=](const TensorShape& t) {
            const auto [r0, rs] = split(t, t.rows, rank, n, "column_parallel");
            return std::vector<Rect>{{r0, rs, 0, t.cols}};
          }};
}

ShardMap row_parallel(int rank, int n) {
  return {"row_parallel(" + std::to_string(rank) + ", " + std::to_string(n) + ")",
          [=](const TensorShape& t) {
            const auto [c0, cs] = split(t, t.cols, rank, n, "row_parallel");
            return std::vector<Rect>{{0, t.rows, c0, cs}};
          }};
}

ShardMap head_sharded(int rank, int n) {
  return {"head_sharded(" + std::to_string(rank) + ", " + std::to_string(n) + ")",
          [=](const TensorShape& t) {
            if (t.heads <= 0)
              throw std::invalid_argument("shard map head_sharded of " + shape_of(t) +
                                          ": the tensor has no head axis");
            const auto [h0, hn] = split(t, t.heads, rank, n, "head_sharded");
            const std::int64_t extent = t.head_axis == 0 ? t.rows : t.cols;
            const std::int64_t hs = extent / t.heads;
            if (t.head_axis == 0) return std::vector<Rect>{{h0 * hs, hn * hs, 0, t.cols}};
            return std::vector<Rect>{{0, t.rows, h0 * hs, hn * hs}};
          }};
}

ShardMap vocab_sharded(int rank, int n) {
  ShardMap m = column_parallel(rank, n);
  return {"vocab_sharded(" + std::to_string(rank) + ", " + std::to_string(n) + ")",
          [m](const TensorShape& t) { return m.resolve(t); }};
}

ShardMap rows(std::int64_t begin, std::int64_t count) {
  return {"rows(" + std::to_string(begin) + ", " + std::to_string(count) + ")",
          [=](const TensorShape& t) {
            return std::vector<Rect>{{begin, count, 0, t.cols}};
          }};
}

ShardMap columns(std::int64_t begin, std::int64_t count) {
  return {"columns(" + std::to_string(begin) + ", " + std::to_string(count) + ")",
          [=](const TensorShape& t) {
            return std::vector<Rect>{{0, t.rows, begin, count}};
          }};
}

ShardMap rectangles(std::vector<Rect> rects) {
  std::string name = "rectangles(" + std::to_string(rects.size()) + ")";
  return {std::move(name), [rects = std::move(rects)](const TensorShape&) { return rects; }};
}

namespace {

template <class T>
void cut_rects(const T* master, const TensorShape& t, const std::vector<Rect>& rects, T* shard) {
  for (const Rect& r : rects)
    for (std::int64_t i = 0; i < r.rows; ++i, shard += r.cols)
      std::memcpy(shard, master + (r.row0 + i) * t.cols + r.col0, r.cols * sizeof(T));
}

}  // namespace

void cut(const float* master, const TensorShape& t, const std::vector<Rect>& rects, float* shard) {
  cut_rects(master, t, rects, shard);
}

void cut(const double* master, const TensorShape& t, const std::vector<Rect>& rects,
         double* shard) {
  cut_rects(master, t, rects, shard);
}

void paste(const float* shard, const TensorShape& t, const std::vector<Rect>& rects,
           float* master) {
  for (const Rect& r : rects)
    for (std::int64_t i = 0; i < r.rows; ++i, shard += r.cols)
      std::memcpy(master + (r.row0 + i) * t.cols + r.col0, shard, r.cols * sizeof(float));
}

}  // namespace tspemu::check
