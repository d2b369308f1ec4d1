// libFuzzer harness: the model config a safetensors file's "__metadata__" claims.
// Input: lines "key=value" (the first '=' splits; a later line with the same key replaces it), so
// the seed corpus is readable and the fuzzer reaches every field. Property: config_from_metadata
// either returns a config that validate() accepts and that survives config_to_metadata and back
// unchanged, or throws SafetensorsError; anything else is a finding.
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "tspemu/reference/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace tspemu::ref;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  std::map<std::string, std::string> md;
  for (std::size_t at = 0; at < text.size();) {
    const std::size_t end = std::min(text.find('\n', at), text.size());
    const std::string_view line = text.substr(at, end - at);
    const std::size_t eq = line.find('=');
    if (eq != std::string_view::npos) md[std::string(line.substr(0, eq))] = line.substr(eq + 1);
    at = end + 1;
  }
  ModelConfig cfg;
  try {
    cfg = config_from_metadata(md);
  } catch (const SafetensorsError&) {
    return 0;
  }
  cfg.validate();  // a throw escapes: config_from_metadata returned an invalid config
  const ModelConfig again = config_from_metadata(config_to_metadata(cfg));
  if (again.to_string() != cfg.to_string() || again.rope_base != cfg.rope_base ||
      again.norm_eps != cfg.norm_eps)
    __builtin_trap();  // the metadata does not round-trip
  return 0;
}
