#include "tspemu/tsp/sp_decoder.hpp"

namespace tspemu::tsp {

// SP's rules are the mesh's at T = 1 (where its T | NH, NKV, F, V hold for every model).
void validate_sp(const DecodeShape& shape) {
  (void)sp_mesh_shape(shape);
}

void validate_sp_prefill(const DecodeShape& shape, SpPrefill prefill) {
  (void)sp_mesh_shape(shape, prefill);
}

MeshDecodeShape sp_mesh_shape(const DecodeShape& shape, SpPrefill prefill) {
  MeshDecodeShape m{.model = shape.model,
                    .T = 1,
                    .Sp = shape.D,
                    .batch = shape.batch,
                    .max_context = shape.max_context,
                    .interleave = shape.interleave,
                    .prefill = prefill};
  m.validate();
  return m;
}

}  // namespace tspemu::tsp
