// libFuzzer harness: the safetensors reader on arbitrary bytes, then the model its metadata claims.
// Property: SafetensorsReader::from_bytes, config_from_metadata and load_model<double>/<float>
// either succeed or throw SafetensorsError; any other exception, a crash, a leak, an
// out-of-bounds access or undefined behaviour is a finding. A model that loads must also survive
// a round trip through the writer: save_model_bytes, read back, load again.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "tspemu/reference/safetensors.hpp"

namespace {

using namespace tspemu::ref;

template <class T>
void load_and_round_trip(const SafetensorsReader& file, const ModelConfig& cfg) {
  ModelWeights<T> w;
  try {
    w = load_model<T>(file, cfg);
  } catch (const SafetensorsError&) {
    return;
  }
  // What the writer produces from a loaded model, the reader must take back; a throw here
  // escapes the harness and is reported as a crash.
  const SafetensorsReader again = SafetensorsReader::from_bytes(save_model_bytes(w));
  load_model<T>(again, config_from_metadata(again));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::vector<unsigned char> bytes(data, data + size);
  try {
    const SafetensorsReader file = SafetensorsReader::from_bytes(std::move(bytes));
    for (const auto& [name, info] : file.tensors()) {
      try {
        (void)file.read<float>(name);
      } catch (const SafetensorsError&) {  // an integer or unknown dtype
      }
    }
    const ModelConfig cfg = config_from_metadata(file);
    load_and_round_trip<double>(file, cfg);
    load_and_round_trip<float>(file, cfg);
  } catch (const SafetensorsError&) {
  }
  return 0;
}
