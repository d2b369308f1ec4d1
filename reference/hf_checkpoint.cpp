#include "tspemu/reference/hf_checkpoint.hpp"

#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <system_error>
#include <utility>

#include <nlohmann/json.hpp>

#include "strict_json.hpp"
#include "tspemu/core/atomic_file.hpp"
#include "tspemu/core/sanitized.hpp"
#include "tspemu/reference/hf_llama_config.hpp"
#include "tspemu/reference/safetensors.hpp"

namespace tspemu::ref {

namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

constexpr const char* kConfig = "config.json";
constexpr const char* kSingle = "model.safetensors";
constexpr const char* kIndex = "model.safetensors.index.json";
// An index lists one short entry per tensor: 100 MB is the safetensors header's own bound.
constexpr std::size_t kMaxIndex = 100u << 20;
// The index object, its weight_map or metadata object, a value inside metadata.
constexpr int kMaxIndexDepth = 3;

[[noreturn]] void fail(const std::string& what) {
  throw CheckpointError("checkpoint: " + what);
}

std::string quote(const std::string& s, std::size_t limit = 64) {
  return "'" + sanitized(s, limit) + "'";
}

// A shard name from the index: a plain file name inside the directory, never a path out of it.
bool plain_file_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." &&
         name.find_first_of(std::string("/\\\0", 3)) == std::string::npos;
}

// tensor name -> shard file name, from the index at `path`.
std::map<std::string, std::string> read_weight_map(const std::string& path) {
  const auto bad = [&](const std::string& reason) {
    fail("index " + quote(path, 256) + ": " + reason);
  };
  const Json j = detail::parse_strict_json(detail::read_bounded_file(path, kMaxIndex, bad),
                                           kMaxIndexDepth, bad);
  if (!j.is_object()) bad("not a JSON object");
  const auto wm = j.find("weight_map");
  if (wm == j.end() || !wm->is_object()) bad("lacks the object 'weight_map'");
  if (const auto md = j.find("metadata"); md != j.end() && !md->is_object()) {
    bad("'metadata' is not an object");
  }
  for (const auto& [key, value] : j.items()) {
    if (key != "weight_map" && key != "metadata") bad("unknown key " + quote(key));
  }
  std::map<std::string, std::string> out;
  for (const auto& [name, file] : wm->items()) {
    if (!file.is_string()) bad("weight_map[" + quote(name) + "] is not a string");
    const std::string f = file.get<std::string>();
    if (!plain_file_name(f)) {
      bad("weight_map[" + quote(name) + "]=" + quote(f) +
          " is not a plain file name in the checkpoint's directory");
    }
    out.emplace(name, f);
  }
  if (out.empty()) bad("'weight_map' is empty");
  return out;
}

}  // namespace

template <class T>
ModelWeights<T> load_hf_checkpoint(const std::string& dir, LoadOptions opts) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    fail("checkpoint directory " + quote(dir, 256) +
         (fs::exists(dir, ec) ? " is not a directory" : " does not exist"));
  }
  const fs::path d(dir);
  const ModelConfig cfg = read_llama_config((d / kConfig).string());
  const std::string single = (d / kSingle).string(), index = (d / kIndex).string();
  const bool has_single = fs::exists(single, ec), has_index = fs::exists(index, ec);
  if (has_single && has_index) {
    fail("directory " + quote(dir, 256) + " holds both " + kSingle + " and " + kIndex +
         ": ambiguous, remove one");
  }
  if (!has_single && !has_index) {
    fail("directory " + quote(dir, 256) + " holds neither " + kSingle + " nor " + kIndex);
  }
  if (has_single) return load_model<T>(SafetensorsReader::from_file(single), cfg, opts);

  const std::map<std::string, std::string> weight_map = read_weight_map(index);
  std::map<std::string, std::unique_ptr<SafetensorsReader>> shards;  // by file name
  for (const auto& [name, file] : weight_map) {
    if (shards.count(file) == 0) {
      shards.emplace(file, std::make_unique<SafetensorsReader>(
                               SafetensorsReader::from_file((d / file).string())));
    }
  }
  TensorFiles files;
  for (const auto& [name, file] : weight_map) {
    const SafetensorsReader& r = *shards.at(file);
    if (!r.contains(name)) {
      fail("index " + quote(index, 256) + " maps tensor " + quote(name) + " to " + quote(file) +
           ", which does not hold it");
    }
    files.emplace(name, &r);
  }
  // A tensor in a shard that the index does not map there is either a stray or the second copy
  // of a name: which one a loader would take is unspecified, so refuse.
  for (const auto& [file, r] : shards) {
    for (const auto& [name, info] : r->tensors()) {
      const auto it = weight_map.find(name);
      if (it == weight_map.end() || it->second != file) {
        fail("shard " + quote((d / file).string(), 256) + " holds tensor " + quote(name) +
             (it == weight_map.end() ? ", which the index does not list"
                                     : ", which the index maps to " + quote(it->second)));
      }
    }
  }
  return load_model<T>(files, cfg, index, opts);
}

template <class T>
std::vector<std::string> save_hf_checkpoint(const std::string& dir, const ModelWeights<T>& w,
                                            std::uint64_t max_shard_bytes) {
  const std::string config_text = llama_config_to_json(w.config);  // validates the config
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (!fs::is_directory(dir, ec)) fail("cannot create the directory " + quote(dir, 256));
  const fs::path d(dir);

  // transformers' sharding rule: fill shards in parameter order, a new one when the next tensor
  // would pass the limit; a tensor above the limit gets a shard of its own.
  const auto params = parameters(w);
  std::vector<std::vector<std::size_t>> shards(1);
  std::uint64_t in_shard = 0, total = 0;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const std::uint64_t bytes = params[i].data->size() * sizeof(T);
    if (max_shard_bytes != 0 && !shards.back().empty() && in_shard + bytes > max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(i);
    in_shard += bytes;
    total += bytes;
  }
  const std::size_t n = shards.size();
  const auto shard_name = [n](std::size_t i) {
    if (n == 1) return std::string(kSingle);
    char buf[64];
    std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", i + 1, n);
    return std::string(buf);
  };
  // Every file is staged whole before any is renamed into place: a failure (or a signal that the
  // caller defers, core/signal_deferral.hpp) before commit() leaves the old checkpoint as it was
  // and removes the temporaries, never a mix of old and new shards.
  std::vector<std::string> written;
  Json weight_map = Json::object();
  StagedFiles staged;
  try {
    for (std::size_t s = 0; s < n; ++s) {
      SafetensorsWriter wr;
      wr.set_metadata("format", "pt");
      for (const std::size_t i : shards[s]) {
        wr.add(params[i].name, std::span<const T>(*params[i].data), params[i].shape);
        weight_map[params[i].name] = shard_name(s);
      }
      written.push_back((d / shard_name(s)).string());
      const std::vector<unsigned char> bytes = wr.to_bytes();
      staged.stage(written.back(), {reinterpret_cast<const char*>(bytes.data()), bytes.size()});
    }
    if (n > 1) {
      const Json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
      written.push_back((d / kIndex).string());
      staged.stage(written.back(), index.dump(2) + "\n");
    }
    written.push_back((d / kConfig).string());
    staged.stage(written.back(), config_text);
    staged.commit();
  } catch (const FileWriteError& e) {
    fail(e.what());
  }
  // Weight files of an earlier save: left in place they would make the directory ambiguous or
  // leave shards no index lists.
  const std::set<std::string> now(written.begin(), written.end());
  for (const auto& entry : fs::directory_iterator(d, ec)) {
    const std::string f = entry.path().filename().string();
    const bool weights = f == kSingle || f == kIndex ||
                         (f.starts_with("model-") && f.ends_with(".safetensors") &&
                          f.find("-of-") != std::string::npos);
    if (weights && now.count(entry.path().string()) == 0) {
      std::error_code rm;
      if (!fs::remove(entry.path(), rm) && rm) {
        fail("cannot remove the stale " + quote(entry.path().string(), 256) + ": " + rm.message());
      }
    }
  }
  return written;
}

template ModelWeights<float> load_hf_checkpoint<float>(const std::string&, LoadOptions);
template ModelWeights<double> load_hf_checkpoint<double>(const std::string&, LoadOptions);
template std::vector<std::string> save_hf_checkpoint<float>(const std::string&,
                                                            const ModelWeights<float>&,
                                                            std::uint64_t);
template std::vector<std::string> save_hf_checkpoint<double>(const std::string&,
                                                             const ModelWeights<double>&,
                                                             std::uint64_t);

}  // namespace tspemu::ref
