#include "tspemu/pipeline/stage.hpp"

#include <stdexcept>
#include <string>

namespace tspemu::pipeline {

StageSpan stage_span(int layers, int stages, int stage) {
  if (stages < 1 || stages > layers || stage < 0 || stage >= stages) {
    throw std::invalid_argument("pipeline: cannot cut " + std::to_string(layers) + " layers into " +
                                std::to_string(stages) + " stages (stage " + std::to_string(stage) +
                                "): every stage needs at least one layer");
  }
  const int base = layers / stages, extra = layers % stages;
  StageSpan s;
  s.stage = stage;
  s.stages = stages;
  s.first_layer = stage * base + (stage < extra ? stage : extra);
  s.end_layer = s.first_layer + base + (stage < extra ? 1 : 0);
  return s;
}

std::vector<ref::Batch> cut_microbatches(const ref::Batch& batch, int microbatches) {
  if (microbatches < 1 || batch.B < 1 || batch.B % microbatches != 0) {
    throw std::invalid_argument(
        "pipeline: " + std::to_string(microbatches) +
        " microbatches do not divide the batch of B=" + std::to_string(batch.B) + " sequences");
  }
  const int b = batch.B / microbatches;
  const std::size_t n = std::size_t(b) * std::size_t(batch.T);
  std::vector<ref::Batch> out;
  out.reserve(std::size_t(microbatches));
  for (int j = 0; j < microbatches; ++j) {
    ref::Batch mb = batch;
    mb.B = b;
    mb.tokens = batch.tokens.subspan(std::size_t(j) * n, n);
    mb.targets = batch.targets.subspan(std::size_t(j) * n, n);
    out.push_back(mb);
  }
  return out;
}

}  // namespace tspemu::pipeline
