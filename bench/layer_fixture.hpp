// One transformer layer's weights, input and output gradient, shared by the layer benchmarks
// (tsp_bench, trace_bench): Llama-like shape with 1:1 heads, seeded so every program times the
// same numbers.
#pragma once

#include <cstddef>
#include <vector>

#include "tspemu/reference/init.hpp"
#include "tspemu/reference/model.hpp"
#include "tspemu/runtime/world.hpp"
#include "tspemu/tsp/tsp_shape.hpp"

namespace tspemu::bench {

struct LayerFixture {
  ref::ModelConfig cfg;
  ref::LayerWeights<float> w;
  std::vector<float> x, dy;  // [B, S, hidden]
  LayerFixture(int hidden, int heads, int ffn, int B, int S) {
    cfg.vocab = 32;
    cfg.hidden = hidden;
    cfg.n_layers = 1;
    cfg.n_heads = heads;
    cfg.n_kv_heads = heads;
    cfg.ffn = ffn;
    w = ref::init_weights<float>(cfg, 1).layers[0];
    const std::size_t n = static_cast<std::size_t>(B) * S * hidden;
    const auto xd = ref::normal_stream(2, "x", n), dyd = ref::normal_stream(3, "dy", n);
    x.assign(xd.begin(), xd.end());
    dy.assign(dyd.begin(), dyd.end());
  }
};

// One rank's share of the fixture, from its arena: x and dy scattered by the shape's sequence
// layout, y and dx for the layer to write.
struct RankLayerTensors {
  Buffer<float> x, y, dy, dx;
  RankLayerTensors(Rank& r, const LayerFixture& f, const tsp::TspShape& s) {
    const std::size_t local = static_cast<std::size_t>(s.B) * s.Tl() * f.cfg.hidden;
    Arena& a = r.arena();
    x = a.allocate<float>(local, Category::activations);
    y = a.allocate<float>(local, Category::activations);
    dy = a.allocate<float>(local, Category::workspace);
    dx = a.allocate<float>(local, Category::workspace);
    const tsp::SequenceLayout layout = s.layout();
    layout.scatter(f.x.data(), x.data(), r.id(), s.B, f.cfg.hidden);
    layout.scatter(f.dy.data(), dy.data(), r.id(), s.B, f.cfg.hidden);
  }
};

}  // namespace tspemu::bench
