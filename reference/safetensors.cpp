#include "tspemu/reference/safetensors.hpp"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <set>
#include <sstream>
#include <system_error>
#include <type_traits>
#include <utility>

#include <nlohmann/json.hpp>

#include "strict_json.hpp"
#include "tspemu/core/atomic_file.hpp"
#include "tspemu/core/regular_file.hpp"
#include "tspemu/core/sanitized.hpp"

namespace tspemu::ref {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; this reader copies it as is");

namespace {

constexpr std::uint64_t kMaxHeader = 100u << 20;  // as the reference implementation

// Containers the format nests: the header object, a tensor's entry object, its shape or
// data_offsets array. Anything deeper is malformed; refusing it while parsing keeps both the
// parse and every later walk of the JSON (dump, destruction) shallow.
constexpr int kMaxHeaderDepth = 3;

[[noreturn]] void fail(const std::string& what) {
  throw SafetensorsError("safetensors: " + what);
}

std::string quote(std::string_view s) {
  return "'" + sanitized(s) + "'";
}

// A JSON value as it appeared, cut short and sanitized like any other quoted text.
std::string excerpt(const nlohmann::json& v) {
  return sanitized(v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
}

// " (file 'path')" for a reader made by from_file; nothing for one made from bytes.
std::string in_file(const std::string& source) {
  return source.empty() ? "" : " (file '" + sanitized(source, 256) + "')";
}

// nlohmann::json rejects invalid UTF-8 only when dumping; check names and metadata up front so
// the writer fails on add() with the name, not later in to_bytes() with a json exception.
bool is_utf8(const std::string& s) {
  try {
    (void)nlohmann::json(s).dump();
    return true;
  } catch (const nlohmann::json::type_error&) {
    return false;
  }
}

std::size_t dtype_size(const std::string& dtype) {
  static const std::map<std::string, std::size_t> sizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E4M3", 1}, {"F8_E5M2", 1},
      {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},
      {"U32", 4},  {"F32", 4}, {"I64", 8}, {"U64", 8},     {"F64", 8}};
  const auto it = sizes.find(dtype);
  return it == sizes.end() ? 0 : it->second;
}

std::string shape_str(const std::vector<std::int64_t>& s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// Bytes of a tensor of this element size and shape, the one rule reader and writer share:
// every dimension non-negative, the product representable (a zero dimension makes the tensor
// empty whatever the others are).
std::size_t byte_count(const std::string& where, std::size_t esize,
                       const std::vector<std::int64_t>& shape) {
  for (std::int64_t dim : shape) {
    if (dim < 0) fail(where + "shape " + shape_str(shape) + " has a negative dimension");
  }
  if (std::find(shape.begin(), shape.end(), 0) != shape.end()) return 0;
  std::size_t nbytes = esize;
  for (std::int64_t dim : shape) {
    if (std::size_t(dim) > std::numeric_limits<std::size_t>::max() / nbytes) {
      fail(where + "shape " + shape_str(shape) + " overflows the byte count");
    }
    nbytes *= std::size_t(dim);
  }
  return nbytes;
}

template <class U>
U load_le(const unsigned char* p) {
  U u;
  std::memcpy(&u, p, sizeof u);  // data offsets need not be aligned
  return u;
}

}  // namespace

float bf16_to_float(std::uint16_t bits) {
  return std::bit_cast<float>(std::uint32_t(bits) << 16);
}

float f16_to_float(std::uint16_t h) {
  const std::uint32_t sign = std::uint32_t(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  const std::uint32_t man = h & 0x3ffu;
  if (exp == 0) {  // zero or subnormal: man * 2^-24, exact in float
    const float mag = std::ldexp(float(man), -24);
    return sign ? -mag : mag;
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7f800000u | (man << 13));  // inf / nan
  return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (man << 13));
}

std::size_t TensorInfo::numel() const {
  std::size_t n = 1;
  for (std::int64_t d : shape) n *= std::size_t(d);
  return n;
}

SafetensorsReader SafetensorsReader::from_file(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    fail("cannot read '" + sanitized(path, 256) + "': it is a directory");
  }
  // A regular file only (a FIFO would block the read, /dev/zero never end it), read to its size.
  std::vector<unsigned char> bytes;
  try {
    bytes = read_regular_file<std::vector<unsigned char>>(path, UINT64_MAX);
  } catch (const FileReadError& e) {
    fail(e.what());
  }
  try {
    SafetensorsReader r = from_bytes(std::move(bytes));
    r.source_ = path;
    return r;
  } catch (const SafetensorsError& e) {
    throw SafetensorsError(std::string(e.what()) + in_file(path));
  }
}

SafetensorsReader SafetensorsReader::from_bytes(std::vector<unsigned char> bytes) {
  try {
    return parse(std::move(bytes));
  } catch (const nlohmann::json::exception& e) {
    // Belt and braces: every JSON access above is type-checked first, so this is unexpected.
    fail(std::string("malformed header: ") + e.what());
  }
}

namespace {

// The header's JSON, refused when malformed, nested deeper than kMaxHeaderDepth or holding a key
// twice in one object: checked by a SAX pass that builds nothing (so a 100,000-deep header is
// refused at its fourth bracket), then parsed; both linear in the header's size.
nlohmann::json parse_header(const char* begin, const char* end) {
  const detail::StrictJsonCheck* at = nullptr;
  const auto refuse = [&](const std::string& reason) {
    if (reason == "not valid JSON") fail("header is not valid JSON");
    std::string where;  // the entry being parsed, once inside one
    if (at != nullptr && at->root_is_object() && at->depth() >= 2) {
      where =
          at->entry() == "__metadata__" ? "__metadata__: " : "tensor " + quote(at->entry()) + ": ";
    }
    if (reason.starts_with("nests deeper")) {
      fail(where + "header nests deeper than " + std::to_string(kMaxHeaderDepth) +
           " levels (the header object, an entry object, a flat array)");
    }
    fail(where + reason);
  };
  detail::StrictJsonCheck check(kMaxHeaderDepth, refuse);
  at = &check;
  nlohmann::json header =
      detail::parse_checked_json(std::string_view(begin, std::size_t(end - begin)), check, refuse);
  if (!header.is_object()) fail("header JSON is not an object");
  return header;
}

// A non-negative integer of a shape or data_offsets array, or a failure naming `field`.
std::uint64_t natural(const std::string& where, const char* field, const nlohmann::json& v) {
  if (!v.is_number_integer() || (!v.is_number_unsigned() && v.get<std::int64_t>() < 0)) {
    fail(where + field + " entry " + excerpt(v) + " is not a non-negative integer");
  }
  return v.get<std::uint64_t>();
}

// The tensor header entry `name`, checked: its dtype known, its shape's bytes exactly its
// data_offsets' span, inside the data buffer of `data_size` bytes.
TensorInfo tensor_info(const std::string& name, const nlohmann::json& entry,
                       std::size_t data_size) {
  const std::string where = "tensor " + quote(name) + ": ";
  if (!entry.is_object()) fail(where + "entry is not an object");
  const auto dt = entry.find("dtype");
  const auto sh = entry.find("shape");
  const auto off = entry.find("data_offsets");
  if (dt == entry.end() || !dt->is_string()) fail(where + "missing or non-string dtype");
  if (sh == entry.end() || !sh->is_array()) fail(where + "missing or non-array shape");
  if (off == entry.end() || !off->is_array() || off->size() != 2) {
    fail(where + "data_offsets must be an array of two integers");
  }
  TensorInfo info;
  info.dtype = dt->get<std::string>();
  const std::size_t esize = dtype_size(info.dtype);
  if (esize == 0) fail(where + "unknown dtype " + quote(info.dtype));
  for (const auto& d : *sh) {
    const std::uint64_t dim = natural(where, "shape", d);
    if (dim > std::uint64_t(std::numeric_limits<std::int64_t>::max())) {
      fail(where + "shape entry " + excerpt(d) + " is too large");
    }
    info.shape.push_back(std::int64_t(dim));
  }
  const std::size_t nbytes = byte_count(where, esize, info.shape);
  for (const auto& o : *off) natural(where, "data_offsets", o);
  const std::uint64_t begin = (*off)[0].get<std::uint64_t>(), end = (*off)[1].get<std::uint64_t>();
  if (begin > end) {
    fail(where + "data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
         "] has begin > end");
  }
  if (end > data_size) {
    fail(where + "data_offsets end " + std::to_string(end) + " is past the data buffer of " +
         std::to_string(data_size) + " bytes");
  }
  if (end - begin != nbytes) {
    fail(where + "data_offsets span " + std::to_string(end - begin) + " bytes but dtype " +
         info.dtype + " x shape " + shape_str(info.shape) + " needs " + std::to_string(nbytes));
  }
  info.begin = std::size_t(begin);
  info.end = std::size_t(end);
  return info;
}

// Fails naming the first two tensors whose data ranges overlap.
void check_disjoint(const std::map<std::string, TensorInfo>& tensors) {
  std::vector<std::pair<std::string, const TensorInfo*>> order;
  order.reserve(tensors.size());
  for (const auto& [name, info] : tensors) order.emplace_back(name, &info);
  std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    return std::pair(a.second->begin, a.second->end) < std::pair(b.second->begin, b.second->end);
  });
  for (std::size_t i = 1; i < order.size(); ++i) {
    const TensorInfo& prev = *order[i - 1].second;
    const TensorInfo& cur = *order[i].second;
    if (cur.begin < prev.end) {
      fail("tensors " + quote(order[i - 1].first) + " [" + std::to_string(prev.begin) + ", " +
           std::to_string(prev.end) + ") and " + quote(order[i].first) + " [" +
           std::to_string(cur.begin) + ", " + std::to_string(cur.end) + ") overlap");
    }
  }
}

}  // namespace

SafetensorsReader SafetensorsReader::parse(std::vector<unsigned char> bytes) {
  SafetensorsReader r;
  r.bytes_ = std::move(bytes);
  const std::size_t size = r.bytes_.size();
  if (size < 8)
    fail("file of " + std::to_string(size) + " bytes is shorter than the 8-byte header length");
  const std::uint64_t n = load_le<std::uint64_t>(r.bytes_.data());
  if (n > size - 8) {
    fail("header length " + std::to_string(n) + " runs past the end of the file (" +
         std::to_string(size - 8) + " bytes after the length)");
  }
  if (n > kMaxHeader) fail("header length " + std::to_string(n) + " exceeds 100 MB");
  r.data_start_ = 8 + std::size_t(n);
  const std::size_t data_size = size - r.data_start_;
  const auto* hb = reinterpret_cast<const char*>(r.bytes_.data() + 8);
  const nlohmann::json header = parse_header(hb, hb + n);
  for (const auto& [name, entry] : header.items()) {
    if (name != "__metadata__") {
      r.tensors_[name] = tensor_info(name, entry, data_size);
      continue;
    }
    if (!entry.is_object()) fail("__metadata__ is not an object");
    for (const auto& [k, v] : entry.items()) {
      if (!v.is_string()) fail("__metadata__[" + quote(k) + "] is not a string");
      r.metadata_[k] = v.get<std::string>();
    }
  }
  check_disjoint(r.tensors_);
  return r;
}

const TensorInfo& SafetensorsReader::info(const std::string& name) const {
  const auto it = tensors_.find(name);
  if (it == tensors_.end()) fail("missing tensor " + quote(name) + in_file(source_));
  return it->second;
}

namespace {

// read<T>() converts these; load_model checks every weight against them before reading any.
void check_float_dtype(const std::string& name, const std::string& dtype,
                       const std::string& source) {
  if (dtype != "F32" && dtype != "F64" && dtype != "BF16" && dtype != "F16") {
    fail("tensor " + quote(name) + ": wrong dtype " + dtype +
         " for a float tensor (expected F32, F64, F16 or BF16)" + in_file(source));
  }
}

}  // namespace

template <class T>
std::vector<T> SafetensorsReader::read(const std::string& name) const {
  const TensorInfo& ti = info(name);
  const std::size_t n = ti.numel();
  const unsigned char* p = bytes_.data() + data_start_ + ti.begin;
  std::vector<T> out(n);
  if (ti.dtype == "F32") {
    for (std::size_t i = 0; i < n; ++i) out[i] = T(load_le<float>(p + 4 * i));
  } else if (ti.dtype == "F64") {
    for (std::size_t i = 0; i < n; ++i) out[i] = T(load_le<double>(p + 8 * i));
  } else if (ti.dtype == "BF16") {
    for (std::size_t i = 0; i < n; ++i)
      out[i] = T(bf16_to_float(load_le<std::uint16_t>(p + 2 * i)));
  } else if (ti.dtype == "F16") {
    for (std::size_t i = 0; i < n; ++i) out[i] = T(f16_to_float(load_le<std::uint16_t>(p + 2 * i)));
  } else {
    check_float_dtype(name, ti.dtype, source_);
  }
  return out;
}

std::vector<std::int64_t> SafetensorsReader::read_int64(const std::string& name) const {
  const TensorInfo& ti = info(name);
  const std::size_t n = ti.numel();
  const unsigned char* p = bytes_.data() + data_start_ + ti.begin;
  std::vector<std::int64_t> out(n);
  if (ti.dtype == "I64") {
    for (std::size_t i = 0; i < n; ++i) out[i] = load_le<std::int64_t>(p + 8 * i);
  } else if (ti.dtype == "I32") {
    for (std::size_t i = 0; i < n; ++i) out[i] = load_le<std::int32_t>(p + 4 * i);
  } else {
    fail("tensor " + quote(name) + ": wrong dtype " + ti.dtype +
         " for an integer tensor (expected I64 or I32)" + in_file(source_));
  }
  return out;
}

// ---------------------------------------------------------------- writer

void SafetensorsWriter::add_raw(const std::string& name, const char* dtype, const void* data,
                                std::size_t nbytes, std::size_t numel,
                                std::vector<std::int64_t> shape) {
  const std::string where = "writer: tensor " + quote(name) + ": ";
  if (name == "__metadata__") {
    fail("writer: tensor name '__metadata__' is reserved for the metadata");
  }
  if (!is_utf8(name)) fail("writer: tensor name " + quote(name) + " is not valid UTF-8");
  if (names_.count(name)) fail("writer: tensor " + quote(name) + " is already in the file");
  const std::size_t expect = byte_count(where, 1, shape);  // elements, by the reader's rule
  if (expect != numel) {
    fail(where + std::to_string(numel) + " elements but shape " + shape_str(shape));
  }
  Entry e{name, dtype, std::move(shape), std::vector<unsigned char>(nbytes)};
  if (nbytes) std::memcpy(e.bytes.data(), data, nbytes);
  entries_.push_back(std::move(e));
  names_.insert(name);
}

void SafetensorsWriter::set_metadata(const std::string& key, const std::string& value) {
  if (!is_utf8(key) || !is_utf8(value)) {
    fail("writer: metadata " + quote(key) + "=" + quote(value) + " is not valid UTF-8");
  }
  metadata_[key] = value;
}

void SafetensorsWriter::add(const std::string& name, std::span<const float> d,
                            std::vector<std::int64_t> shape) {
  add_raw(name, "F32", d.data(), d.size_bytes(), d.size(), std::move(shape));
}
void SafetensorsWriter::add(const std::string& name, std::span<const double> d,
                            std::vector<std::int64_t> shape) {
  add_raw(name, "F64", d.data(), d.size_bytes(), d.size(), std::move(shape));
}
void SafetensorsWriter::add(const std::string& name, std::span<const std::int64_t> d,
                            std::vector<std::int64_t> shape) {
  add_raw(name, "I64", d.data(), d.size_bytes(), d.size(), std::move(shape));
}

std::vector<unsigned char> SafetensorsWriter::to_bytes() const {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata_.empty()) header["__metadata__"] = metadata_;
  std::size_t offset = 0;
  for (const Entry& e : entries_) {
    header[e.name] = {{"dtype", e.dtype},
                      {"shape", e.shape},
                      {"data_offsets", {offset, offset + e.bytes.size()}}};
    offset += e.bytes.size();
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');  // pad so the data buffer starts 8-byte aligned
  if (h.size() > kMaxHeader) {
    fail("writer: header of " + std::to_string(h.size()) + " bytes exceeds the readers' 100 MB");
  }
  const std::uint64_t n = h.size();
  std::vector<unsigned char> out(8 + h.size() + offset);
  std::memcpy(out.data(), &n, 8);
  std::memcpy(out.data() + 8, h.data(), h.size());
  std::size_t at = 8 + h.size();
  for (const Entry& e : entries_) {
    if (!e.bytes.empty()) std::memcpy(out.data() + at, e.bytes.data(), e.bytes.size());
    at += e.bytes.size();
  }
  return out;
}

void SafetensorsWriter::save(const std::string& path) const {
  const std::vector<unsigned char> bytes = to_bytes();
  try {
    write_file_atomically(path, {reinterpret_cast<const char*>(bytes.data()), bytes.size()});
  } catch (const FileWriteError& e) {
    fail(e.what());
  }
}

// ---------------------------------------------------------------- model checkpoints

std::map<std::string, std::string> config_to_metadata(const ModelConfig& cfg) {
  auto num = [](double x) {
    std::ostringstream s;
    s.precision(17);
    s << x;
    return s.str();
  };
  return {{"vocab", std::to_string(cfg.vocab)},
          {"hidden", std::to_string(cfg.hidden)},
          {"n_layers", std::to_string(cfg.n_layers)},
          {"n_heads", std::to_string(cfg.n_heads)},
          {"n_kv_heads", std::to_string(cfg.n_kv_heads)},
          {"ffn", std::to_string(cfg.ffn)},
          {"rope_base", num(cfg.rope_base)},
          {"norm_eps", num(cfg.norm_eps)},
          {"tie_embeddings", cfg.tie_embeddings ? "1" : "0"}};
}

namespace {

// The config fields, each parsed whole and strictly: integers in decimal within int's range,
// rope_base and norm_eps finite and positive, tie_embeddings "0" or "1", the result validated.
ModelConfig parse_config(const std::map<std::string, std::string>& md, const std::string& source) {
  const auto get = [&](const char* key) -> const std::string& {
    const auto it = md.find(key);
    if (it == md.end()) {
      fail(std::string("metadata lacks config field '") + key + "'" + in_file(source));
    }
    return it->second;
  };
  const auto bad = [&](const char* key, const char* why) {
    fail(std::string("metadata field '") + key + "'=" + quote(get(key)) + " is not " + why +
         in_file(source));
  };
  // std::from_chars: no leading space or '+', no hex prefix, range errors reported; the end
  // pointer shows whether the whole string was used.
  const auto to_int = [&](const char* key) {
    const std::string& v = get(key);
    int x = 0;
    const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
    if (ec != std::errc() || end != v.data() + v.size()) bad(key, "a decimal integer in int range");
    return x;
  };
  const auto to_positive = [&](const char* key) {
    const std::string& v = get(key);
    double x = 0;
    const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
    if (ec != std::errc() || end != v.data() + v.size() || !std::isfinite(x) || !(x > 0)) {
      bad(key, "a finite positive number");
    }
    return x;
  };
  ModelConfig c;
  c.vocab = to_int("vocab");
  c.hidden = to_int("hidden");
  c.n_layers = to_int("n_layers");
  c.n_heads = to_int("n_heads");
  c.n_kv_heads = to_int("n_kv_heads");
  c.ffn = to_int("ffn");
  c.rope_base = to_positive("rope_base");
  c.norm_eps = to_positive("norm_eps");
  const std::string& tie = get("tie_embeddings");
  if (tie != "0" && tie != "1") bad("tie_embeddings", "0 or 1");
  c.tie_embeddings = tie == "1";
  try {
    c.validate();
  } catch (const std::invalid_argument& e) {
    fail(std::string("metadata describes an invalid model config: ") + e.what() + in_file(source));
  }
  return c;
}

}  // namespace

ModelConfig config_from_metadata(const std::map<std::string, std::string>& md) {
  return parse_config(md, "");
}

ModelConfig config_from_metadata(const SafetensorsReader& file) {
  return parse_config(file.metadata(), file.source());
}

namespace {

// "[i, j]" of flat index `flat` in a row-major tensor of this shape.
std::string coordinates(std::size_t flat, const std::vector<std::int64_t>& shape) {
  std::vector<std::int64_t> at(shape.size());
  for (std::size_t d = shape.size(); d-- > 0;) {
    at[d] = std::int64_t(flat % std::size_t(shape[d]));
    flat /= std::size_t(shape[d]);
  }
  return shape_str(at);
}

// Refuses the first element of `v` (tensor `name`, read from `source`) that is NaN or infinite.
template <class T>
void check_finite(const std::string& name, const std::vector<T>& v,
                  const std::vector<std::int64_t>& shape, const std::string& source) {
  const auto bad = std::find_if(v.begin(), v.end(), [](T x) { return !std::isfinite(x); });
  if (bad == v.end()) return;
  const auto i = std::size_t(bad - v.begin());
  std::ostringstream value;
  value << *bad;
  throw NonFiniteWeightError("safetensors: tensor " + quote(name) + ": element " +
                             std::to_string(i) + " " + coordinates(i, shape) + " of " +
                             std::to_string(v.size()) + " is " + value.str() +
                             " (a weight must be finite)" + in_file(source));
}

}  // namespace

template <class T>
ModelWeights<T> load_model(const TensorFiles& files, const ModelConfig& cfg,
                           const std::string& source, LoadOptions opts) {
  cfg.validate();
  const std::string in = in_file(source);
  // Every check against the files comes before any allocation, so a file claiming a huge config
  // fails on what it lacks instead of allocating for it; once they pass, every tensor is inside
  // a file, so the model allocated below is at most 4x their bytes (2-byte F16 or BF16 to 8-byte
  // F64). Names and shapes come from a skeleton whose layers hold no data, with no more layers than
  // the files could fill: past tensors/9 + 1 layers some expected name is missing anyway.
  constexpr std::size_t kPerLayer = std::tuple_size_v<decltype(LayerWeights<T>{}.named())>;
  ModelWeights<T> skeleton;
  skeleton.config = cfg;
  skeleton.layers.resize(std::min(std::size_t(cfg.n_layers), files.size() / kPerLayer + 1));
  std::set<std::string> expected;
  for (const auto& p : parameters(skeleton)) {
    const auto it = files.find(p.name);
    if (it == files.end()) fail("missing tensor " + quote(p.name) + in);
    const TensorInfo& ti = it->second->info(p.name);
    const std::string in_its_file = in_file(it->second->source());
    if (ti.shape != p.shape) {
      fail("tensor " + quote(p.name) + ": shape " + shape_str(ti.shape) +
           " disagrees with the config's " + shape_str(p.shape) + " (" + cfg.to_string() + ")" +
           in_its_file);
    }
    check_float_dtype(p.name, ti.dtype, it->second->source());
    expected.insert(p.name);
  }
  if (skeleton.layers.size() != std::size_t(cfg.n_layers)) {  // unreachable, by the count above
    fail("the " + std::to_string(files.size()) + " tensors cannot hold " +
         std::to_string(cfg.n_layers) + " layers" + in);
  }
  const SafetensorsReader* stored_head = nullptr;  // an lm_head.weight beside a tied config
  for (const auto& [name, file] : files) {
    if (expected.count(name)) continue;
    const TensorInfo& ti = file->info(name);
    const bool inv_freq = name.size() >= 19 && name.ends_with("rotary_emb.inv_freq");
    const bool tied_head = cfg.tie_embeddings && name == "lm_head.weight" &&
                           ti.shape == std::vector<std::int64_t>{cfg.vocab, cfg.hidden};
    if (tied_head) {
      check_float_dtype(name, ti.dtype, file->source());
      stored_head = file;
    }
    if (!inv_freq && !tied_head) {
      fail("unexpected tensor " + quote(name) + " " + shape_str(ti.shape) + " for config " +
           cfg.to_string() + in_file(file->source()));
    }
  }
  ModelWeights<T> w = std::move(skeleton);
  w.layers.resize(std::size_t(cfg.n_layers));
  for (auto& p : parameters(w)) {
    const SafetensorsReader& file = *files.at(p.name);
    *p.data = file.template read<T>(p.name);
    if (!opts.allow_nonfinite) check_finite(p.name, *p.data, p.shape, file.source());
  }
  // A tied model's head is its embedding: a stored head that differs would be silently unused.
  if (stored_head != nullptr) {
    const std::vector<T> head = stored_head->template read<T>("lm_head.weight");
    const auto diff = std::mismatch(head.begin(), head.end(), w.embed.begin(),
                                    [](T a, T b) { return std::memcmp(&a, &b, sizeof(T)) == 0; });
    if (diff.first != head.end()) {
      const auto i = std::size_t(diff.first - head.begin());
      fail(
          "unexpected tensor 'lm_head.weight': the config ties the head to "
          "'model.embed_tokens.weight', and the stored head differs from it at element " +
          std::to_string(i) + " " + coordinates(i, {cfg.vocab, cfg.hidden}) +
          " (a tied model would ignore it: remove it, or untie the config)" +
          in_file(stored_head->source()));
    }
  }
  return w;
}

template <class T>
ModelWeights<T> load_model(const SafetensorsReader& file, const ModelConfig& cfg,
                           LoadOptions opts) {
  TensorFiles files;
  for (const auto& [name, info] : file.tensors()) files.emplace(name, &file);
  return load_model<T>(files, cfg, file.source(), opts);
}

template <class T>
ModelWeights<T> load_model(const std::string& path, const ModelConfig& cfg) {
  return load_model<T>(SafetensorsReader::from_file(path), cfg);
}

namespace {
template <class T>
SafetensorsWriter model_writer(const ModelWeights<T>& w) {
  SafetensorsWriter wr;
  for (const auto& [k, v] : config_to_metadata(w.config)) wr.set_metadata(k, v);
  wr.set_metadata("format", "pt");
  for (const auto& p : parameters(w)) wr.add(p.name, std::span<const T>(*p.data), p.shape);
  return wr;
}
}  // namespace

template <class T>
void save_model(const std::string& path, const ModelWeights<T>& w) {
  model_writer(w).save(path);
}
template <class T>
std::vector<unsigned char> save_model_bytes(const ModelWeights<T>& w) {
  return model_writer(w).to_bytes();
}

template std::vector<float> SafetensorsReader::read<float>(const std::string&) const;
template std::vector<double> SafetensorsReader::read<double>(const std::string&) const;
template ModelWeights<float> load_model<float>(const TensorFiles&, const ModelConfig&,
                                               const std::string&, LoadOptions);
template ModelWeights<double> load_model<double>(const TensorFiles&, const ModelConfig&,
                                                 const std::string&, LoadOptions);
template ModelWeights<float> load_model<float>(const SafetensorsReader&, const ModelConfig&,
                                               LoadOptions);
template ModelWeights<double> load_model<double>(const SafetensorsReader&, const ModelConfig&,
                                                 LoadOptions);
template ModelWeights<float> load_model<float>(const std::string&, const ModelConfig&);
template ModelWeights<double> load_model<double>(const std::string&, const ModelConfig&);
template void save_model<float>(const std::string&, const ModelWeights<float>&);
template void save_model<double>(const std::string&, const ModelWeights<double>&);
template std::vector<unsigned char> save_model_bytes<float>(const ModelWeights<float>&);
template std::vector<unsigned char> save_model_bytes<double>(const ModelWeights<double>&);

}  // namespace tspemu::ref
