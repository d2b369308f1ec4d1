#include "tspemu/check/block_check.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iomanip>
#include <limits>
#include <map>
#include <ostream>
#include <sstream>
#include <stdexcept>
#include <tuple>

#include "tspemu/core/bf16.hpp"
#include "tspemu/reference/init.hpp"

namespace tspemu::check {

namespace {

using Weights = ref::LayerWeights<float>;

using ref::kLayerTensors;
using ref::LayerTensor;

// The LayerWeights field of a weight name (one of kLayerTensors).
template <class T>
const std::vector<T>& field(const ref::LayerWeights<T>& w, std::string_view name) {
  for (const auto& [n, v] : w.named())
    if (name == n) return *v;
  throw std::invalid_argument("check: no weight named '" + std::string(name) + "'");
}

bool in_block(ref::LayerBlock owner, Block b) {
  return b == Block::layer || (owner == ref::LayerBlock::attention) == (b == Block::attention);
}

std::string weight_names(Block b) {
  std::string s;
  for (const LayerTensor& w : kLayerTensors)
    if (in_block(w.block, b)) s += (s.empty() ? "" : ", ") + std::string(w.name);
  return s;
}

const LayerTensor& weight_info(std::string_view name, Block b, int rank) {
  for (const LayerTensor& w : kLayerTensors)
    if (name == w.name && in_block(w.block, b)) return w;
  throw std::invalid_argument("check: rank " + std::to_string(rank) + " named weight '" +
                              std::string(name) + "', not a weight of the " + block_name(b) +
                              " block (its weights: " + weight_names(b) + ")");
}

TensorShape shape_of(const ref::ModelConfig& cfg, std::string_view name) {
  const LayerTensor* t = ref::find_layer_tensor(name);
  if (!t) throw std::invalid_argument("check: no weight named '" + std::string(name) + "'");
  const ref::LayerTensorShape s = ref::layer_tensor_shape(cfg, *t);
  return {std::string(name), s.rows, s.cols, s.heads, s.head_axis};
}

// An element of a weight in the tensor's own terms.
std::string weight_element(const TensorShape& t, std::int64_t row, std::int64_t col) {
  std::ostringstream s;
  if (t.rows == 1) {
    s << "(feature " << col << ")";
  } else if (t.heads > 0 && t.head_axis == 0) {
    const std::int64_t hs = t.rows / t.heads;
    s << "(head " << row / hs << ", feature " << row % hs << " of the head, input feature " << col
      << ")";
  } else if (t.heads > 0) {
    const std::int64_t hs = t.cols / t.heads;
    s << "(output feature " << row << ", head " << col / hs << ", feature " << col % hs
      << " of the head)";
  } else {
    s << "(row " << row << ", column " << col << ")";
  }
  return s.str();
}

std::string token_element(std::size_t idx, int S, int C) {
  const std::size_t c = idx % C, p = (idx / C) % S, b = idx / (std::size_t(C) * S);
  return "(batch " + std::to_string(b) + ", position " + std::to_string(p) + ", feature " +
         std::to_string(c) + ")";
}

ref::StorageRounding storage_of(const BlockCheck& c) {
  return {c.precision};
}

template <class T>
struct Reference {
  std::vector<T> y, dx;
  ref::LayerWeights<T> grads;
};

template <class T>
Reference<T> run_reference(const BlockCheck& c, const ref::LayerWeights<T>& w,
                           const std::vector<T>& x, const std::vector<T>& dy,
                           ref::StorageRounding storage) {
  std::vector<std::int64_t> pos(static_cast<std::size_t>(c.S));
  for (int i = 0; i < c.S; ++i) pos[static_cast<std::size_t>(i)] = i;
  Reference<T> r;
  r.y.resize(x.size());
  r.dx.resize(x.size());
  r.grads = ref::LayerWeights<T>::zeros(c.model);
  if (c.block == Block::attention) {
    ref::AttentionCache<T> cache;
    ref::attention_block_forward(c.model, w, x.data(), r.y.data(), pos.data(), c.B, c.S, cache,
                                 storage);
    ref::attention_block_backward(c.model, w, x.data(), dy.data(), r.dx.data(), pos.data(), c.B,
                                  c.S, cache, r.grads, storage);
  } else if (c.block == Block::mlp) {
    ref::MlpCache<T> cache;
    ref::mlp_block_forward(c.model, w, x.data(), r.y.data(), c.B, c.S, cache, storage);
    ref::mlp_block_backward(c.model, w, x.data(), dy.data(), r.dx.data(), c.B, c.S, cache, r.grads,
                            storage);
  } else {
    ref::LayerCache<T> cache;
    ref::layer_forward(c.model, w, x.data(), r.y.data(), pos.data(), c.B, c.S, cache, storage);
    ref::layer_backward(c.model, w, x.data(), dy.data(), r.dx.data(), pos.data(), c.B, c.S, cache,
                        r.grads, storage);
  }
  return r;
}

// What one run of the schedule produced, per rank.
struct RunResult {
  std::vector<std::vector<float>> y, dx;
  std::vector<RankBlock::Declared> declared;
};

RunResult run_schedule(World& world, const BlockCheck& c, const Weights& master,
                       const std::vector<TokenShard>& tokens, const std::vector<float>& x,
                       const std::vector<float>& dy,
                       const std::function<void(RankBlock&)>& schedule) {
  const int C = c.model.hidden;
  RunResult out;
  const auto n = static_cast<std::size_t>(c.ranks);
  out.y.resize(n);
  out.dx.resize(n);
  out.declared.resize(n);
  world.run([&](Rank& rank) {
    const auto p = static_cast<std::size_t>(rank.id());
    const TokenShard& t = tokens[p];
    const std::size_t local = std::size_t(t.batches) * t.positions.size() * C;
    Arena& a = rank.arena();
    auto xl = a.allocate<float>(local, Category::activations);
    auto dyl = a.allocate<float>(local, Category::workspace);
    auto yl = a.allocate<float>(local, Category::activations);
    auto dxl = a.allocate<float>(local, Category::workspace);
    scatter_rows(t, c.S, C, x.data(), xl.data());
    scatter_rows(t, c.S, C, dy.data(), dyl.data());
    // NaN marks what the schedule leaves unwritten.
    std::fill(yl.begin(), yl.end(), std::numeric_limits<float>::quiet_NaN());
    std::fill(dxl.begin(), dxl.end(), std::numeric_limits<float>::quiet_NaN());
    RankBlock rb(rank, c.model, master, t, xl.span(), dyl.span(), yl.span(), dxl.span(),
                 out.declared[p], storage_of(c));
    schedule(rb);
    out.y[p].assign(yl.begin(), yl.end());
    out.dx[p].assign(dxl.begin(), dxl.end());
  });
  return out;
}

// E of tensor `name`: the largest any rank recorded (0: none). A name that is not a tensor of the
// block is a usage error.
double recorded_extra_rounding(const RunResult& run, const std::string& name) {
  double E = 0;
  for (const RankBlock::Declared& d : run.declared)
    if (auto it = d.extra_rounding.find(name); it != d.extra_rounding.end())
      E = std::max(E, it->second);
  return E;
}

void require_known_extra_rounding(const BlockCheck& c, const RunResult& run) {
  for (std::size_t r = 0; r < run.declared.size(); ++r)
    for (const auto& [name, E] : run.declared[r].extra_rounding)
      if (name != "y" && name != "dx") weight_info(name, c.block, int(r));
}

// Full tensors put together from every rank, with the first rank holding each element (-1: none).
struct Assembled {
  std::map<std::string, std::vector<float>> tensors;
  std::map<std::string, std::vector<int>> first_owner;
  std::map<std::string, std::vector<std::string>> replica_mismatches;
};

// One tensor being assembled: a later copy of an element must equal the first bit for bit.
struct Target {
  std::vector<float>& values;
  std::vector<int>& first;
  std::vector<std::string>& mismatches;
  template <class Where>
  void put(std::size_t i, float v, int rank, Where where) {
    if (first[i] < 0) {
      values[i] = v;
      first[i] = rank;
    } else if (std::memcmp(&values[i], &v, sizeof(float)) != 0 && mismatches.size() < 3) {
      mismatches.push_back("rank " + std::to_string(rank) + " holds " + std::to_string(v) + " at " +
                           where() + " where rank " + std::to_string(first[i]) + " holds " +
                           std::to_string(values[i]) + " (replicas must be bitwise equal)");
    }
  }
};

Target target(Assembled& a, const std::string& name, std::size_t n) {
  auto& v = a.tensors[name];
  auto& f = a.first_owner[name];
  if (v.empty()) {
    v.assign(n, 0.0f);
    f.assign(n, -1);
  }
  return {v, f, a.replica_mismatches[name]};
}

Assembled assemble(const BlockCheck& c, const std::vector<TokenShard>& tokens,
                   const RunResult& run) {
  const int C = c.model.hidden;
  const std::size_t n = std::size_t(c.B) * c.S * C;
  Assembled a;
  Target y = target(a, "y", n), dx = target(a, "dx", n);
  for (int r = 0; r < c.ranks; ++r) {
    const auto p = static_cast<std::size_t>(r);
    for_each_row(tokens[p], c.S, C, [&](std::size_t l, std::size_t g) {
      for (int f = 0; f < C; ++f) {
        for (auto [name, local, to] :
             {std::tuple{"y", &run.y[p], &y}, std::tuple{"dx", &run.dx[p], &dx}}) {
          const float v = (*local)[l + f];
          if (std::isnan(v))
            throw std::invalid_argument("check " + c.name + ": rank " + std::to_string(r) +
                                        " left " + name + " unwritten (or NaN) at " +
                                        token_element(g + f, c.S, C));
          to->put(g + f, v, r, [&] { return token_element(g + f, c.S, C); });
        }
      }
    });
  }
  for (const LayerTensor& w : kLayerTensors) {
    if (!in_block(w.block, c.block)) continue;
    const TensorShape t = shape_of(c.model, w.name);
    target(a, w.name, std::size_t(t.rows * t.cols));
  }
  for (int r = 0; r < c.ranks; ++r) {
    for (const RankBlock::Piece& piece : run.declared[static_cast<std::size_t>(r)].pieces) {
      weight_info(piece.name, c.block, r);
      const TensorShape t = shape_of(c.model, piece.name);
      Target to = target(a, piece.name, std::size_t(t.rows * t.cols));
      std::size_t k = 0;
      for (const Rect& rect : piece.rects)
        for (std::int64_t i = rect.row0; i < rect.row0 + rect.rows; ++i)
          for (std::int64_t j = rect.col0; j < rect.col0 + rect.cols; ++j, ++k)
            to.put(std::size_t(i * t.cols + j), piece.data[k], r,
                   [&] { return weight_element(t, i, j); });
    }
  }
  for (const LayerTensor& w : kLayerTensors) {
    if (!in_block(w.block, c.block)) continue;
    const TensorShape t = shape_of(c.model, w.name);
    const auto& first = a.first_owner[w.name];
    for (std::size_t i = 0; i < first.size(); ++i)
      if (first[i] < 0)
        throw std::invalid_argument(
            "check " + c.name + ": the gradient shards of " + w.name + " [" +
            std::to_string(t.rows) + ", " + std::to_string(t.cols) +
            "] declared by the ranks do not tile it: " +
            weight_element(t, std::int64_t(i) / t.cols, std::int64_t(i) % t.cols) +
            " is held by no rank (RankBlock::gradient)");
  }
  return a;
}

// Every rank holding element i of a tensor (for reports: only the elements they name).
std::vector<int> owners_of(const BlockCheck& c, const std::vector<TokenShard>& tokens,
                           const RunResult& run, const std::string& name, std::size_t i) {
  std::vector<int> owners;
  const std::size_t C = std::size_t(c.model.hidden);
  if (name == "y" || name == "dx") {
    const std::size_t b = i / (C * c.S), pos = (i / C) % c.S;
    for (int r = 0; r < c.ranks; ++r) {
      const TokenShard& t = tokens[static_cast<std::size_t>(r)];
      if (int(b) >= t.batch_begin && int(b) < t.batch_begin + t.batches &&
          std::find(t.positions.begin(), t.positions.end(), std::int64_t(pos)) != t.positions.end())
        owners.push_back(r);
    }
    return owners;
  }
  const TensorShape t = shape_of(c.model, name);
  const std::int64_t row = std::int64_t(i) / t.cols, col = std::int64_t(i) % t.cols;
  for (int r = 0; r < c.ranks; ++r)
    for (const RankBlock::Piece& piece : run.declared[static_cast<std::size_t>(r)].pieces)
      for (const Rect& x : piece.rects)
        if (piece.name == name && row >= x.row0 && row < x.row0 + x.rows && col >= x.col0 &&
            col < x.col0 + x.cols && (owners.empty() || owners.back() != r))
          owners.push_back(r);
  return owners;
}

std::string ranks_list(const std::vector<int>& ranks) {
  std::string s;
  for (std::size_t i = 0; i < ranks.size() && i < 8; ++i)
    s += (i ? ", " : "") + std::to_string(ranks[i]);
  if (ranks.size() > 8) s += ", ... (" + std::to_string(ranks.size()) + " ranks)";
  return s;
}

std::string describe(const BlockCheck& c, const std::string& name, std::size_t i) {
  if (name == "y" || name == "dx") return token_element(i, c.S, c.model.hidden);
  const TensorShape t = shape_of(c.model, name);
  return weight_element(t, std::int64_t(i) / t.cols, std::int64_t(i) % t.cols);
}

// The report's first line: the block, its sizes and the rule it is judged by.
std::string headline(const BlockCheck& c, const ref::ModelConfig& cfg) {
  std::ostringstream h;
  h << "check " << c.name << ": " << block_name(c.block) << " block on " << c.ranks
    << " ranks, B=" << c.B << " S=" << c.S << ", C=" << cfg.hidden << " NH=" << cfg.n_heads
    << " NKV=" << cfg.n_kv_heads << " F=" << cfg.ffn << ", seed " << c.seed << "; ";
  if (c.precision == NumType::bf16)
    h << "bf16 rule err(parallel bf16) <= " << c.k
      << " * err(reference bf16) + 2^-8 * E + tiny vs the fp64 oracle";
  else
    h << "rule err(parallel fp32) <= " << c.k << " * err(reference fp32) + tiny vs the fp64 oracle";
  return h.str();
}

// The first element a run under injection `inj` changed (`again` against `base`, bitwise),
// named with its owning ranks (as `run` placed them), or "" when none changed.
std::string first_change(const BlockCheck& c, const std::vector<TokenShard>& tokens,
                         const RunResult& run, const Injection& inj, const Assembled& base,
                         const Assembled& again) {
  for (const auto& [name, want] : base.tensors) {
    const auto& other = again.tensors.at(name);
    for (std::size_t i = 0; i < want.size(); ++i) {
      if (std::memcmp(&want[i], &other[i], sizeof(float)) == 0) continue;
      std::ostringstream m;
      m << inj.describe() << " changes " << name << " at " << describe(c, name, i) << " (ranks "
        << ranks_list(owners_of(c, tokens, run, name, i)) << "): " << std::setprecision(9)
        << want[i] << " without injection, " << other[i] << " with it";
      return m.str();
    }
  }
  return "";
}

// The observers' part of the report: each rank's simulated time, and the trace file written.
void report_observers(const BlockCheck& c, World& world, Report& report) {
  if (c.sim_clock) {
    report.sim_clock = c.sim_clock->describe();
    for (int r = 0; r < c.ranks; ++r)
      report.simulated_seconds.push_back(world.simulated_seconds(r));
  }
  if (!c.trace_path.empty()) {
    world.trace().write_chrome_json(c.trace_path);
    report.trace_path = c.trace_path;
  }
}

}  // namespace

const char* block_name(Block b) {
  switch (b) {
    case Block::attention:
      return "attention";
    case Block::mlp:
      return "MLP";
    case Block::layer:
      return "layer";
  }
  return "?";
}

TensorShape RankBlock::shape(std::string_view name) const {
  return shape_of(config_, name);
}

Buffer<float> RankBlock::weight(std::string_view name, const ShardMap& map) {
  const TensorShape t = shape_of(config_, name);
  const std::vector<Rect> rects = map.resolve(t);
  auto buf =
      arena().allocate<float>(static_cast<std::size_t>(element_count(rects)), Category::weights);
  cut(field(master_, name).data(), t, rects, buf.data());
  return buf;
}

void RankBlock::gradient(std::string_view name, std::span<const float> shard, const ShardMap& map) {
  const TensorShape t = shape_of(config_, name);
  std::vector<Rect> rects = map.resolve(t);
  const std::int64_t want = element_count(rects);
  if (static_cast<std::int64_t>(shard.size()) != want)
    throw std::invalid_argument("check: rank " + std::to_string(rank_.id()) + " declared the " +
                                std::string(name) + " gradient with " +
                                std::to_string(shard.size()) + " elements; its map " +
                                map.description() + " of [" + std::to_string(t.rows) + ", " +
                                std::to_string(t.cols) + "] holds " + std::to_string(want));
  declared_.pieces.push_back({std::string(name), std::move(rects), {shard.begin(), shard.end()}});
}

void RankBlock::extra_rounding(std::string_view name, double E) {
  if (!(E >= 0) || !std::isfinite(E))
    throw std::invalid_argument("check: rank " + std::to_string(rank_.id()) +
                                " recorded an extra rounding magnitude E=" + std::to_string(E) +
                                " for " + std::string(name) + " (must be finite and >= 0)");
  auto [it, fresh] = declared_.extra_rounding.try_emplace(std::string(name), E);
  if (!fresh) it->second = std::max(it->second, E);
}

Report check_block(const BlockCheck& c, const std::function<void(RankBlock&)>& schedule) {
  ref::ModelConfig cfg = c.model;
  cfg.n_layers = 1;
  cfg.validate();
  if (c.ranks < 1 || c.B < 1 || c.S < 1)
    throw std::invalid_argument("check " + c.name + ": ranks=" + std::to_string(c.ranks) +
                                " B=" + std::to_string(c.B) + " S=" + std::to_string(c.S) +
                                " must all be positive");
  if (!(c.k > 0)) throw std::invalid_argument("check " + c.name + ": k must be positive");
  BlockCheck check = c;
  check.model = cfg;
  const std::vector<TokenShard> tokens = resolve_tokens(c.tokens, c.ranks, c.B, c.S);

  // The oracle sees exactly the float inputs and weights, so only the arithmetic differs.
  // bf16: the weights and inputs are stored in bf16 (rounded once here), for all three runs.
  const ref::StorageRounding storage = storage_of(c);
  auto w32 = ref::convert_weights<float>(ref::init_weights<double>(cfg, c.seed));
  for (const auto& [name, v] : w32.layers[0].named()) storage.store(*v);
  const auto w64 = ref::convert_weights<double>(w32);
  const std::size_t n = std::size_t(c.B) * c.S * cfg.hidden;
  auto to_float = [&](const std::vector<double>& v) {
    std::vector<float> f(v.begin(), v.end());
    storage.store(f);
    return f;
  };
  const std::vector<float> x32 = to_float(ref::normal_stream(c.seed, "check x", n));
  const std::vector<float> dy32 = to_float(ref::normal_stream(c.seed, "check dy", n));
  const std::vector<double> x64(x32.begin(), x32.end()), dy64(dy32.begin(), dy32.end());
  const Reference<double> oracle = run_reference(check, w64.layers[0], x64, dy64, {});
  const Reference<float> reference = run_reference(check, w32.layers[0], x32, dy32, storage);

  WorldOptions opts;
  opts.ranks = c.ranks;
  opts.trace = c.trace || !c.trace_path.empty();
  opts.sim_clock = c.sim_clock;
  opts.watchdog_timeout = c.watchdog_timeout;
  World world(opts);
  const RunResult run = run_schedule(world, check, w32.layers[0], tokens, x32, dy32, schedule);
  const Assembled got = assemble(check, tokens, run);
  require_known_extra_rounding(check, run);

  Report report;
  report.headline = headline(c, cfg);
  auto judge = [&](const std::string& name, const std::vector<float>& ref32,
                   const std::vector<double>& ref64) {
    const auto& cand = got.tensors.at(name);
    TensorResult t =
        judge_tensor(name, cand, ref32, ref64, c.k, recorded_extra_rounding(run, name));
    const std::size_t w = t.verdict.candidate.worst;
    if (w < cand.size()) {
      t.worst = describe(check, name, w);
      t.owners = owners_of(check, tokens, run, name, w);
      t.parallel = cand[w];
      t.reference = ref32[w];
      t.oracle = ref64[w];
    }
    if (auto it = got.replica_mismatches.find(name); it != got.replica_mismatches.end())
      t.replica_mismatches = it->second;
    report.tensors.push_back(std::move(t));
  };
  judge("y", reference.y, oracle.y);
  judge("dx", reference.dx, oracle.dx);
  for (const LayerTensor& w : kLayerTensors)
    if (in_block(w.block, c.block))
      judge(w.name, field(reference.grads, w.name), field(oracle.grads, w.name));

  report_observers(c, world, report);

  report.inject_seeds = c.inject_seeds;
  for (int s = 1; s <= c.inject_seeds && report.nondeterminism.empty(); ++s) {
    Injection inj = c.inject;
    inj.seed = c.inject.seed + static_cast<std::uint64_t>(s - 1);
    world.set_injection(inj);
    const Assembled again = assemble(
        check, tokens, run_schedule(world, check, w32.layers[0], tokens, x32, dy32, schedule));
    report.nondeterminism = first_change(check, tokens, run, inj, got, again);
  }
  world.set_injection(std::nullopt);
  return report;
}

TensorResult judge_tensor(const std::string& name, std::span<const float> parallel,
                          std::span<const float> reference, std::span<const double> oracle,
                          double k, double E) {
  TensorResult t;
  t.name = name;
  t.E = E;
  t.verdict = ref::check_close_rounded(name, parallel, reference, oracle, k, bf16_unit_roundoff, E);
  t.ratio = t.verdict.bound > 0 ? t.verdict.candidate.max_abs / t.verdict.bound
                                : (t.verdict.candidate.max_abs > 0 ? INFINITY : 0);
  return t;
}

bool Report::ok() const {
  if (!nondeterminism.empty()) return false;
  return std::all_of(tensors.begin(), tensors.end(), [](const TensorResult& t) { return t.ok(); });
}

double Report::worst_ratio() const {
  double w = 0;
  for (const TensorResult& t : tensors) w = std::max(w, t.ratio);
  return w;
}

const TensorResult* Report::find(std::string_view name) const {
  for (const TensorResult& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

void Report::print(std::ostream& out) const {
  out << headline << "\n";
  for (const TensorResult& t : tensors) {
    out << "  " << (t.ok() ? "ok  " : "FAIL") << " " << std::left << std::setw(11) << t.name
        << std::right << std::scientific << std::setprecision(3) << " parallel err "
        << t.verdict.candidate.max_abs << "  reference err " << t.verdict.reference.max_abs
        << "  bound " << t.verdict.bound << std::fixed << std::setprecision(3) << "  ratio "
        << t.ratio << "  max ulp " << t.verdict.candidate.max_ulp;
    if (t.E > 0) out << std::scientific << std::setprecision(3) << "  E " << t.E;
    out << "\n";
    if (!t.verdict.ok)
      out << "       worst " << t.worst << " on rank(s) " << ranks_list(t.owners)
          << std::setprecision(9) << std::defaultfloat << ": parallel " << t.parallel
          << ", reference " << t.reference << ", oracle " << t.oracle << "\n";
    for (const std::string& m : t.replica_mismatches) out << "       replica: " << m << "\n";
  }
  out << std::defaultfloat;
  if (!simulated_seconds.empty())
    out << "simulated step (" << sim_clock
        << "): " << *std::max_element(simulated_seconds.begin(), simulated_seconds.end()) * 1e3
        << " ms (slowest rank)\n";
  if (!trace_path.empty()) out << "trace: " << trace_path << "\n";
  if (inject_seeds > 0)
    out << "determinism: "
        << (nondeterminism.empty()
                ? std::to_string(inject_seeds) + " injection seeds, every result bitwise identical"
                : nondeterminism)
        << "\n";
  out << "verdict: " << (ok() ? "PASS" : "FAIL") << " (worst error ratio " << std::setprecision(3)
      << worst_ratio() << ")\n";
}

}  // namespace tspemu::check
