#include "tspemu/reference/safetensors.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <sstream>
#include <type_traits>
#include <utility>

#include <nlohmann/json.hpp>

namespace tspemu::ref {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; this reader copies it as is");

namespace {

constexpr std::uint64_t kMaxHeader = 100u << 20;  // as the reference implementation

[[noreturn]] void fail(const std::string& what) {
  throw SafetensorsError("safetensors: " + what);
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
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot open '" + path + "'");
  std::vector<unsigned char> bytes((std::istreambuf_iterator<char>(in)),
                                   std::istreambuf_iterator<char>());
  try {
    return from_bytes(std::move(bytes));
  } catch (const SafetensorsError& e) {
    throw SafetensorsError(std::string(e.what()) + " (file '" + path + "')");
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
  const nlohmann::json header =
      nlohmann::json::parse(hb, hb + n, nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded()) fail("header is not valid JSON");
  if (!header.is_object()) fail("header JSON is not an object");

  std::vector<std::pair<std::string, const TensorInfo*>> order;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) fail("__metadata__ is not an object");
      for (const auto& [k, v] : entry.items()) {
        if (!v.is_string()) fail("__metadata__['" + k + "'] is not a string");
        r.metadata_[k] = v.get<std::string>();
      }
      continue;
    }
    const std::string where = "tensor '" + name + "': ";
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
    if (esize == 0) fail(where + "unknown dtype '" + info.dtype + "'");
    for (const auto& d : *sh) {
      if (!d.is_number_integer() || (!d.is_number_unsigned() && d.get<std::int64_t>() < 0)) {
        fail(where + "shape entry " + d.dump() + " is not a non-negative integer");
      }
      const std::uint64_t dim = d.get<std::uint64_t>();
      if (dim > std::uint64_t(std::numeric_limits<std::int64_t>::max())) {
        fail(where + "shape entry " + d.dump() + " is too large");
      }
      info.shape.push_back(std::int64_t(dim));
    }
    // Byte count, rejecting overflow (a zero dimension makes the tensor empty whatever the rest).
    std::size_t nbytes = esize;
    if (std::find(info.shape.begin(), info.shape.end(), 0) != info.shape.end()) nbytes = 0;
    for (std::int64_t dim : info.shape) {
      if (nbytes == 0) break;
      if (std::size_t(dim) > std::numeric_limits<std::size_t>::max() / nbytes) {
        fail(where + "shape " + shape_str(info.shape) + " overflows the byte count");
      }
      nbytes *= std::size_t(dim);
    }
    for (const auto& o : *off) {
      if (!o.is_number_integer() || (!o.is_number_unsigned() && o.get<std::int64_t>() < 0)) {
        fail(where + "data_offsets entry " + o.dump() + " is not a non-negative integer");
      }
    }
    const std::uint64_t begin = (*off)[0].get<std::uint64_t>(),
                        end = (*off)[1].get<std::uint64_t>();
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
    r.tensors_[name] = std::move(info);
  }
  for (const auto& [name, info] : r.tensors_) order.emplace_back(name, &info);
  std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    return std::pair(a.second->begin, a.second->end) < std::pair(b.second->begin, b.second->end);
  });
  for (std::size_t i = 1; i < order.size(); ++i) {
    const TensorInfo& prev = *order[i - 1].second;
    const TensorInfo& cur = *order[i].second;
    if (cur.begin < prev.end) {
      fail("tensors '" + order[i - 1].first + "' [" + std::to_string(prev.begin) + ", " +
           std::to_string(prev.end) + ") and '" + order[i].first + "' [" +
           std::to_string(cur.begin) + ", " + std::to_string(cur.end) + ") overlap");
    }
  }
  return r;
}

const TensorInfo& SafetensorsReader::info(const std::string& name) const {
  const auto it = tensors_.find(name);
  if (it == tensors_.end()) fail("missing tensor '" + name + "'");
  return it->second;
}

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
    fail("tensor '" + name + "': wrong dtype " + ti.dtype +
         " for a float tensor (expected F32, F64, F16 or BF16)");
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
    fail("tensor '" + name + "': wrong dtype " + ti.dtype +
         " for an integer tensor (expected I64 or I32)");
  }
  return out;
}

// ---------------------------------------------------------------- writer

void SafetensorsWriter::add_raw(const std::string& name, const char* dtype, const void* data,
                                std::size_t nbytes, std::size_t numel,
                                std::vector<std::int64_t> shape) {
  std::size_t expect = 1;
  for (std::int64_t d : shape) expect *= std::size_t(d);
  if (expect != numel) {
    fail("writer: tensor '" + name + "' has " + std::to_string(numel) + " elements but shape " +
         shape_str(shape));
  }
  Entry e{name, dtype, std::move(shape), std::vector<unsigned char>(nbytes)};
  if (nbytes) std::memcpy(e.bytes.data(), data, nbytes);
  entries_.push_back(std::move(e));
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
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
  if (!out) fail("cannot write '" + path + "'");
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

ModelConfig config_from_metadata(const std::map<std::string, std::string>& md) {
  auto get = [&](const char* key) -> const std::string& {
    const auto it = md.find(key);
    if (it == md.end()) fail(std::string("metadata lacks config field '") + key + "'");
    return it->second;
  };
  auto to_int = [&](const char* key) {
    try {
      return std::stoi(get(key));
    } catch (const std::logic_error&) {
      fail(std::string("metadata field '") + key + "'='" + get(key) + "' is not an integer");
    }
  };
  auto to_double = [&](const char* key) {
    try {
      return std::stod(get(key));
    } catch (const std::logic_error&) {
      fail(std::string("metadata field '") + key + "'='" + get(key) + "' is not a number");
    }
  };
  ModelConfig c;
  c.vocab = to_int("vocab");
  c.hidden = to_int("hidden");
  c.n_layers = to_int("n_layers");
  c.n_heads = to_int("n_heads");
  c.n_kv_heads = to_int("n_kv_heads");
  c.ffn = to_int("ffn");
  c.rope_base = to_double("rope_base");
  c.norm_eps = to_double("norm_eps");
  c.tie_embeddings = to_int("tie_embeddings") != 0;
  return c;
}

template <class T>
ModelWeights<T> load_model(const SafetensorsReader& file, const ModelConfig& cfg) {
  ModelWeights<T> w = ModelWeights<T>::zeros(cfg);
  std::map<std::string, bool> expected;
  for (auto& p : parameters(w)) {
    expected[p.name] = true;
    const TensorInfo& ti = file.info(p.name);  // throws "missing tensor"
    if (ti.shape != p.shape) {
      fail("tensor '" + p.name + "': shape " + shape_str(ti.shape) +
           " disagrees with the config's " + shape_str(p.shape) + " (" + cfg.to_string() + ")");
    }
    *p.data = file.read<T>(p.name);
  }
  for (const auto& [name, ti] : file.tensors()) {
    if (expected.count(name)) continue;
    const bool inv_freq = name.size() >= 19 && name.ends_with("rotary_emb.inv_freq");
    const bool tied_head = cfg.tie_embeddings && name == "lm_head.weight" &&
                           ti.shape == std::vector<std::int64_t>{cfg.vocab, cfg.hidden};
    if (!inv_freq && !tied_head) {
      fail("unexpected tensor '" + name + "' " + shape_str(ti.shape) + " for config " +
           cfg.to_string());
    }
  }
  return w;
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
template ModelWeights<float> load_model<float>(const SafetensorsReader&, const ModelConfig&);
template ModelWeights<double> load_model<double>(const SafetensorsReader&, const ModelConfig&);
template ModelWeights<float> load_model<float>(const std::string&, const ModelConfig&);
template ModelWeights<double> load_model<double>(const std::string&, const ModelConfig&);
template void save_model<float>(const std::string&, const ModelWeights<float>&);
template void save_model<double>(const std::string&, const ModelWeights<double>&);
template std::vector<unsigned char> save_model_bytes<float>(const ModelWeights<float>&);
template std::vector<unsigned char> save_model_bytes<double>(const ModelWeights<double>&);

}  // namespace tspemu::ref
