// TspLayer: one rank's part of a TSP transformer layer = TspAttention then TspMlp, each with its
// own RMSNorm and residual on this rank's tokens only (norms and residuals need no communication
// because every rank holds whole tokens).
// Kept for backward: the attention block's output (the MLP block's input), [B·Tl, C]
// (activations), besides what each block keeps.
#pragma once

#include <vector>

#include "tspemu/tsp/tsp_attention.hpp"
#include "tspemu/tsp/tsp_mlp.hpp"

namespace tspemu::tsp {

template <class T>
class BasicTspLayer {
 public:
  BasicTspLayer(Rank& rank, const TspShape& shape, const ref::LayerWeights<T>& master)
      : rank_(rank), attention_(rank, shape, master), mlp_(rank, shape, master) {}

  void forward(const T* x, T* y) {  // [B, Tl, C]
    mid_.reset();
    mid_ = rank_.arena().template allocate<T>(mlp_rows(), Category::activations);
    attention_.forward(x, mid_.data());
    mlp_.forward(mid_.data(), y);
  }
  // x: forward's input; dx overwritten; the blocks' gradients overwritten.
  void backward(const T* x, const T* dy, T* dx) {
    auto dmid = rank_.arena().template allocate<T>(mlp_rows(), Category::workspace);
    mlp_.backward(mid_.data(), dy, dmid.data());
    attention_.backward(x, dmid.data(), dx);
  }

  // Both blocks round at the bf16 reference's points (BasicTspAttention::set_storage); the
  // attention output (the MLP input) is stored by the attention block.
  void set_storage(ref::StorageRounding storage) {
    attention_.set_storage(storage);
    mlp_.set_storage(storage);
  }

  // Attention shard, input norm, MLP shard, post norm (valid after the first backward, which
  // allocates the gradients).
  std::vector<BasicParameterShard<T>> parameters() {
    const auto a = attention_.parameters();
    const auto m = mlp_.parameters();
    return {a[0], a[1], m[0], m[1]};
  }

  const BasicTspAttention<T>& attention() const { return attention_; }
  const BasicTspMlp<T>& mlp() const { return mlp_; }

 private:
  std::size_t mlp_rows() const { return mlp_.local_elements(); }
  Rank& rank_;
  BasicTspAttention<T> attention_;
  BasicTspMlp<T> mlp_;
  Buffer<T> mid_;  // attention output = MLP input (activations)
};

using TspLayer = BasicTspLayer<float>;

}  // namespace tspemu::tsp
