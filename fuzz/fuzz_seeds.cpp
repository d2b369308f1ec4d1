// Writes the valid seeds of fuzz/corpus/ with the library's own writer, so the fuzzers start from
// inputs that get past every check: `fuzz_seeds DIR` creates DIR/safetensors/ and
// DIR/model_config/ files (the hand-made edge cases beside them are committed as they are).
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "tspemu/reference/init.hpp"
#include "tspemu/reference/safetensors.hpp"

namespace {

using namespace tspemu::ref;

// The smallest shapes every check accepts: GQA (2 query heads per K/V head), head size 4.
ModelConfig seed_config(int layers, bool tied) {
  ModelConfig c;
  c.vocab = 8;
  c.hidden = 8;
  c.n_layers = layers;
  c.n_heads = 2;
  c.n_kv_heads = 1;
  c.ffn = 12;
  c.tie_embeddings = tied;
  c.validate();
  return c;
}

void write(const std::filesystem::path& path, const std::vector<unsigned char>& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
  if (!f) throw std::runtime_error("cannot write " + path.string());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: fuzz_seeds DIR\n";
    return 2;
  }
  const std::filesystem::path dir = argv[1];
  std::filesystem::create_directories(dir / "safetensors");
  std::filesystem::create_directories(dir / "model_config");
  write(dir / "safetensors" / "model_f32.safetensors",
        save_model_bytes(init_weights<float>(seed_config(1, false), 1)));
  write(dir / "safetensors" / "model_f64_tied.safetensors",
        save_model_bytes(init_weights<double>(seed_config(1, true), 2)));
  SafetensorsWriter ints;  // an integer tensor and free-form metadata, no model config
  const std::vector<std::int64_t> ids = {0, 1, -1, 7};
  ints.add("ids", ids, {2, 2});
  ints.set_metadata("format", "pt");
  write(dir / "safetensors" / "int64_no_config.safetensors", ints.to_bytes());
  std::ofstream md(dir / "model_config" / "valid_tied.txt");
  for (const auto& [k, v] : config_to_metadata(seed_config(2, true))) md << k << "=" << v << "\n";
  return md ? 0 : 1;
}
