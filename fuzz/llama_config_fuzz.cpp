// libFuzzer harness: a Hugging Face Llama config.json (hf_llama_config.hpp), the input as the
// file's text. Property: llama_config_from_json either throws HfConfigError or returns a config
// that validate() accepts and that llama_config_to_json and back returns unchanged, bit for bit
// in its floats; any other exception, a crash or a sanitizer report is a finding.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "tspemu/reference/hf_llama_config.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace tspemu::ref;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  ModelConfig cfg;
  try {
    cfg = llama_config_from_json(text, "fuzz/config.json");
  } catch (const HfConfigError&) {
    return 0;
  }
  cfg.validate();  // a throw escapes: the reader returned an invalid config
  const ModelConfig again = llama_config_from_json(llama_config_to_json(cfg));
  if (again.to_string() != cfg.to_string() || again.rope_base != cfg.rope_base ||
      again.norm_eps != cfg.norm_eps || again.tie_embeddings != cfg.tie_embeddings)
    __builtin_trap();  // the config does not round-trip
  return 0;
}
