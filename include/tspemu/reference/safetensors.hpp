// safetensors I/O and Llama-named model checkpoints.
//
// Format (https://github.com/huggingface/safetensors): 8-byte little-endian header length n;
//   n bytes of JSON {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__":
//   {str: str}}; then the data buffer, offsets relative to its start, little-endian, row-major.
// Requirements: a little-endian host (static_assert in the .cpp). The reader holds the whole file
//   in memory (fine for test-sized models; not meant for multi-GB checkpoints).
// Guarantees (reader): the whole file is validated before any tensor is read, and every malformed
//   input throws SafetensorsError naming the problem, the tensor or key, and the file (from_file);
//   it never reads out of bounds. Names, keys and values are quoted as at most 64 bytes of
//   printable ASCII (anything else as \xNN), never as raw JSON. Rejected: a path that is a
//   directory or cannot be read; file shorter than 8 bytes; header length past the end of the
//   file (or > 100 MB); bad or non-object JSON; JSON nested deeper than the format's 3 levels
//   (header, entry, shape or data_offsets array), refused while parsing, so depth costs neither
//   stack nor time; a key twice in one object (a tensor, a field of an entry, __metadata__ or one
//   of its keys); an entry without a string dtype, an array shape of non-negative integers, or two
//   data_offsets; an unknown dtype; begin > end; end past the data buffer; a byte size that
//   disagrees with dtype x shape (including overflow); overlapping tensors. Holes between tensors
//   are allowed.
//   read<T>() converts F32, F64, F16 and BF16 (exactly, then rounds to T); any other dtype is
//   "wrong dtype" for a float tensor. read_int64() takes I64 or I32.
// Guarantees (writer): it writes only what the reader accepts: add() and set_metadata() throw
//   SafetensorsError on a name used twice, the name "__metadata__", a negative dimension, a shape
//   whose byte count overflows or disagrees with the data, or text that is not UTF-8; to_bytes()
//   on a header over 100 MB. save() replaces the file atomically (a temporary file in the same
//   directory, written, fsync'ed and closed with every result checked, then renamed over it): on
//   failure it throws naming the path and the OS error, and the old file is left as it was. A
//   path that is not a regular file (/dev/null, /dev/full) is written in place, still checked.
// Guarantees (model): config_from_metadata parses each field whole (integers in decimal within
//   int, rope_base and norm_eps finite and positive, tie_embeddings "0" or "1") and validates the
//   config. load_model checks the whole file (or set of files) against the config before
//   allocating anything: every tensor the config implies present with exactly that shape and a
//   float dtype; unknown tensors are rejected (they mean a config mismatch), except
//   "*.rotary_emb.inv_freq" buffers (old HF checkpoints; RoPE is recomputed) and, for a tied
//   config, an "lm_head.weight" bitwise equal to the embedding once converted (the same tensor
//   stored twice); one that differs is refused, since the tied model would silently not use it.
//   So a small file claiming a huge config fails on what it lacks, and the model it allocates is at
//   most 4x the file's data. After conversion every weight must be finite: the first NaN or
//   infinity is refused (NonFiniteWeightError) unless opts.allow_nonfinite.
// Cost: the reader holds the file and parses the header once; load_model converts each tensor
//   once; save() holds the file's bytes once more and pays one fsync.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "tspemu/reference/model.hpp"

namespace tspemu::ref {

struct SafetensorsError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// A weight holding NaN or an infinity (after conversion to the model's type): the message names the
// tensor, the file, the first bad element's flat index and coordinates and its value.
struct NonFiniteWeightError : SafetensorsError {
  using SafetensorsError::SafetensorsError;
};

// What load_model accepts beyond the format's rules.
struct LoadOptions {
  bool allow_nonfinite = false;  // load NaN / Inf weights instead of refusing them
};

struct TensorInfo {
  std::string dtype;  // "F32", "F64", "F16", "BF16", "I64", ...
  std::vector<std::int64_t> shape;
  std::size_t begin = 0, end = 0;  // byte offsets into the data buffer
  std::size_t numel() const;
};

class SafetensorsReader {
 public:
  static SafetensorsReader from_file(const std::string& path);
  static SafetensorsReader from_bytes(std::vector<unsigned char> bytes);

  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool contains(const std::string& name) const { return tensors_.count(name) != 0; }
  const TensorInfo& info(const std::string& name) const;  // throws if absent
  // The path from_file read, named in every later error; empty for from_bytes.
  const std::string& source() const { return source_; }

  template <class T>  // float or double
  std::vector<T> read(const std::string& name) const;
  std::vector<std::int64_t> read_int64(const std::string& name) const;

 private:
  static SafetensorsReader parse(std::vector<unsigned char> bytes);
  std::vector<unsigned char> bytes_;
  std::string source_;
  std::size_t data_start_ = 0;
  std::map<std::string, TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

class SafetensorsWriter {
 public:
  void add(const std::string& name, std::span<const float> data, std::vector<std::int64_t> shape);
  void add(const std::string& name, std::span<const double> data, std::vector<std::int64_t> shape);
  void add(const std::string& name, std::span<const std::int64_t> data,
           std::vector<std::int64_t> shape);
  void set_metadata(const std::string& key, const std::string& value);
  std::vector<unsigned char> to_bytes() const;
  void save(const std::string& path) const;

 private:
  struct Entry {
    std::string name, dtype;
    std::vector<std::int64_t> shape;
    std::vector<unsigned char> bytes;
  };
  void add_raw(const std::string& name, const char* dtype, const void* data, std::size_t nbytes,
               std::size_t numel, std::vector<std::int64_t> shape);
  std::vector<Entry> entries_;
  std::set<std::string> names_;  // of entries_, to refuse a second tensor of the same name
  std::map<std::string, std::string> metadata_;
};

// The config as "__metadata__" strings (keys = ModelConfig field names) and back. save_model
// writes it; config_from_metadata throws SafetensorsError if a field is missing or unparsable or
// the config is invalid, naming the key, the value and (given the reader) the file.
std::map<std::string, std::string> config_to_metadata(const ModelConfig& cfg);
ModelConfig config_from_metadata(const std::map<std::string, std::string>& md);
ModelConfig config_from_metadata(const SafetensorsReader& file);

template <class T>
ModelWeights<T> load_model(const SafetensorsReader& file, const ModelConfig& cfg,
                           LoadOptions opts = {});
// Tensor name -> the file holding it: the tensors of a checkpoint spread over several files.
using TensorFiles = std::map<std::string, const SafetensorsReader*>;
// load_model over several files, with the same checks; each tensor's errors name its file, a
// missing one names `source` (what the caller read, e.g. the index file).
template <class T>
ModelWeights<T> load_model(const TensorFiles& files, const ModelConfig& cfg,
                           const std::string& source, LoadOptions opts = {});
template <class T>
ModelWeights<T> load_model(const std::string& path, const ModelConfig& cfg);
// Writes every parameter in T's dtype (F32 or F64) under its Llama name, config in metadata.
template <class T>
void save_model(const std::string& path, const ModelWeights<T>& w);
template <class T>
std::vector<unsigned char> save_model_bytes(const ModelWeights<T>& w);

// Half-precision conversions used on load (exact: every F16/BF16 value is a float).
float bf16_to_float(std::uint16_t bits);
float f16_to_float(std::uint16_t bits);

}  // namespace tspemu::ref
