#include "tspemu/runtime/trace.hpp"

#include <cstdio>
#include <fstream>
#include <ostream>
#include <sstream>
#include <stdexcept>

#include "../world/op_hooks.hpp"
#include "../world/world_state.hpp"
#include "tspemu/core/atomic_file.hpp"

namespace tspemu {

bool Trace::enabled() const {
  return w_->opts.trace;
}

int Trace::ranks() const {
  return w_->opts.ranks;
}

std::span<const TraceEvent> Trace::events(int rank) const {
  const auto& t = w_->ranks.at(static_cast<std::size_t>(rank))->trace;
  return t ? t->events() : std::span<const TraceEvent>();
}

std::uint64_t Trace::dropped(int rank) const {
  const auto& t = w_->ranks.at(static_cast<std::size_t>(rank))->trace;
  return t ? t->dropped() : 0;
}

std::string Trace::group_name(std::uint64_t group_id) const {
  std::lock_guard lock(w_->groups_mu);
  auto it = w_->group_names.find(group_id);
  return it == w_->group_names.end() ? "group " + std::to_string(group_id) : it->second;
}

void Trace::clear() {
  for (auto& r : w_->ranks)
    if (r->trace) r->trace->clear();
}

namespace {

std::string json_string(std::string_view s) {
  std::string o = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      o += '\\';
      o += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char b[8];
      std::snprintf(b, sizeof b, "\\u%04x", c);
      o += b;
    } else {
      o += c;
    }
  }
  return o + "\"";
}

// Microseconds with nanosecond digits, as Chrome's "ts" and "dur" expect.
std::string us(std::int64_t ns) {
  char b[32];
  std::snprintf(b, sizeof b, "%.3f", static_cast<double>(ns) * 1e-3);
  return b;
}

const char* category(TraceEvent::Type t) {
  switch (t) {
    case TraceEvent::Type::collective:
      return "collective";
    case TraceEvent::Type::send:
    case TraceEvent::Type::recv:
      return "p2p";
    case TraceEvent::Type::span:
      return "compute";
    case TraceEvent::Type::counter:
      return "memory";
  }
  return "?";
}

// The slice's label: "all_gather #3", "send #2 to 1", "recv #2 from 0", or the span's name.
std::string label(const TraceEvent& e) {
  switch (e.type) {
    case TraceEvent::Type::collective:
      return std::string(e.name) + " #" + std::to_string(e.seq);
    case TraceEvent::Type::send:
      return std::string(e.name) + " #" + std::to_string(e.seq) + " to " + std::to_string(e.peer);
    case TraceEvent::Type::recv:
      return std::string(e.name) + " #" + std::to_string(e.seq) + " from " + std::to_string(e.peer);
    default:
      return e.name;
  }
}

}  // namespace

void Trace::write_chrome_json(std::ostream& out) const {
  const SimClockModel* sim = w_->opts.sim_clock ? &*w_->opts.sim_clock : nullptr;
  // Simulated tracks are processes kSimPid + r, after the measured ones.
  const int kSimPid = 1000;
  out << "{\"displayTimeUnit\":\"ns\",\"otherData\":{\"generator\":\"tspemu\"";
  if (sim) out << ",\"simulated_clock\":" << json_string(sim->describe());
  out << "},\"traceEvents\":[\n";
  bool first = true;
  auto emit = [&](const std::string& e) {
    out << (first ? "" : ",\n") << e;
    first = false;
  };
  auto meta = [&](int pid, const std::string& process, int sort) {
    emit("{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":" + std::to_string(pid) +
         ",\"args\":{\"name\":" + json_string(process) + "}}");
    emit("{\"ph\":\"M\",\"name\":\"process_sort_index\",\"pid\":" + std::to_string(pid) +
         ",\"args\":{\"sort_index\":" + std::to_string(sort) + "}}");
    emit("{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":" + std::to_string(pid) +
         ",\"tid\":0,\"args\":{\"name\":\"ops\"}}");
  };
  for (int r = 0; r < ranks(); ++r) {
    meta(r, "rank " + std::to_string(r), r);
    if (sim) {
      meta(kSimPid + r, "rank " + std::to_string(r) + " (simulated: " + sim->describe() + ")",
           ranks() + r);
      // The rank's split of its simulated clock (sim_streams.hpp), as a label on its track.
      const SimStreams& st = w_->ranks[static_cast<std::size_t>(r)]->sim;
      char label[160];
      std::snprintf(label, sizeof label,
                    "compute %.3f ms, exposed comm %.3f ms, overlapped comm %.3f ms",
                    static_cast<double>(st.compute_ns()) * 1e-6,
                    static_cast<double>(st.exposed_comm_ns()) * 1e-6,
                    static_cast<double>(st.overlapped_comm_ns()) * 1e-6);
      emit("{\"ph\":\"M\",\"name\":\"process_labels\",\"pid\":" + std::to_string(kSimPid + r) +
           ",\"args\":{\"labels\":" + json_string(label) + "}}");
    }
    const std::string pid = std::to_string(r);
    for (const TraceEvent& e : events(r)) {
      if (e.type == TraceEvent::Type::counter) {
        emit("{\"ph\":\"C\",\"name\":" + json_string(e.name) + ",\"pid\":" + pid +
             ",\"tid\":0,\"ts\":" + us(e.begin_ns) +
             ",\"args\":{\"bytes\":" + std::to_string(e.bytes) + "}}");
        continue;
      }
      std::string args = "\"args\":{";
      if (e.type == TraceEvent::Type::span) {
        args += "\"flops\":" + std::to_string(e.flops);
      } else {
        args += "\"seq\":" + std::to_string(e.seq) +
                ",\"group\":" + json_string(group_name(e.group_id)) +
                ",\"bytes\":" + std::to_string(e.bytes);
        if (e.peer >= 0) args += ",\"peer\":" + std::to_string(e.peer);
        if (e.root >= 0) args += ",\"root\":" + std::to_string(e.root);
      }
      args += "}";
      const std::string common =
          "\"name\":" + json_string(label(e)) + ",\"cat\":\"" + category(e.type) + "\",\"tid\":0,";
      emit("{\"ph\":\"X\"," + common + "\"pid\":" + pid + ",\"ts\":" + us(e.begin_ns) +
           ",\"dur\":" + us(e.end_ns - e.begin_ns) + "," + args + "}");
      // Flow arrows: from the send slice to the end of the matching receive (bound to the
      // enclosing slice, "bp":"e", so the arrow lands on the receive itself).
      if (e.flow != 0 && e.type == TraceEvent::Type::send)
        emit("{\"ph\":\"s\",\"name\":\"message\",\"cat\":\"p2p\",\"id\":" + std::to_string(e.flow) +
             ",\"pid\":" + pid + ",\"tid\":0,\"ts\":" + us(e.begin_ns) + "}");
      if (e.flow != 0 && e.type == TraceEvent::Type::recv)
        emit("{\"ph\":\"f\",\"bp\":\"e\",\"name\":\"message\",\"cat\":\"p2p\",\"id\":" +
             std::to_string(e.flow) + ",\"pid\":" + pid +
             ",\"tid\":0,\"ts\":" + us(std::max(e.begin_ns, e.end_ns - 1)) + "}");
      if (sim && e.sim_begin_ns >= 0 && e.sim_end_ns > e.sim_begin_ns)
        emit("{\"ph\":\"X\"," + common + "\"pid\":" + std::to_string(kSimPid + r) +
             ",\"ts\":" + us(e.sim_begin_ns) + ",\"dur\":" + us(e.sim_end_ns - e.sim_begin_ns) +
             "," + args + "}");
    }
    if (dropped(r) > 0)
      emit("{\"ph\":\"M\",\"name\":\"process_labels\",\"pid\":" + pid + ",\"args\":{\"labels\":" +
           json_string(std::to_string(dropped(r)) + " events dropped (trace_capacity)") + "}}");
  }
  out << "\n]}\n";
}

void Trace::write_chrome_json(const std::string& path) const {
  std::ostringstream text;
  write_chrome_json(text);
  write_file_atomically(path, text.view());
}

namespace detail {

ComputeObserver::Token RankComputeObserver::begin_compute() noexcept {
  return {self->trace ? self->world->now_ns() : 0, sim_model(*self) ? self->sim.now_ns() : -1};
}

// A span ends no earlier than its own FLOPs allow nor than what was charged inside it (nested
// kernel spans, collectives), so a block span around its GEMMs is not charged twice.
void RankComputeObserver::end_compute(const Token& token, const char* name, double flops) noexcept {
  std::int64_t sim_end = -1;
  if (const SimClockModel* sim = sim_model(*self)) {
    sim_end =
        std::max(self->sim.now_ns(), token.sim_begin_ns + sim_ns_of(sim->compute_seconds(flops)));
    self->sim.compute_until(sim_end);
  }
  if (self->trace)
    self->trace->record(TraceEvent{TraceEvent::Type::span, name, 0, 0, -1, -1, 0, flops, 0,
                                   token.begin_ns, self->world->now_ns(), token.sim_begin_ns,
                                   sim_end});
}

}  // namespace detail

TraceSpan::TraceSpan(const Comm& comm, const char* name, double flops)
    : name_(name), flops_(flops) {
  detail::RankState& self = comm.self();
  if (!self.trace && !self.world->opts.sim_clock) return;
  self_ = &self;
  token_ = self.compute.begin_compute();
}

TraceSpan::~TraceSpan() {
  if (self_ != nullptr) self_->compute.end_compute(token_, name_, flops_);
}

}  // namespace tspemu

namespace tspemu::detail {

namespace {

// One event per completed operation (a failed one records none); a send's event carries the
// flow id its receive's event repeats, so the viewer draws an arrow between them.
class TraceObserver final : public Observer {
 public:
  unsigned hooks(const WorldOptions& opts) const override {
    return opts.trace ? kHookBegin | kHookEnd : 0u;
  }
  void on_begin(RankState& self, OpInfo& op) override {
    if (!self.trace) return;
    op.trace_begin_ns = self.world->now_ns();
    if (op.kind == OpInfo::Kind::send) op.flow = self.trace->next_flow(self.rank);
  }
  void on_end(RankState& self, OpInfo& op, bool ok) override {
    if (!self.trace || !ok) return;
    TraceEvent e{TraceEvent::Type::collective,
                 op.what,
                 op.seq,
                 op.group->id,
                 op.peer,
                 op.root,
                 op.bytes,
                 0,
                 op.flow,
                 op.trace_begin_ns,
                 self.world->now_ns(),
                 op.sim_begin_ns,
                 op.sim_end_ns};
    switch (op.kind) {
      case OpInfo::Kind::collective:
        break;
      case OpInfo::Kind::send:
        e.type = TraceEvent::Type::send;
        break;
      case OpInfo::Kind::send_wait:
        e.type = TraceEvent::Type::send;
        e.name = "send wait";
        e.bytes = 0;
        e.flow = 0;
        break;
      case OpInfo::Kind::recv:
        e.type = TraceEvent::Type::recv;
        break;
      default:
        return;
    }
    self.trace->record(e);
  }
};

}  // namespace

std::unique_ptr<Observer> make_trace_observer() {
  return std::make_unique<TraceObserver>();
}

}  // namespace tspemu::detail
