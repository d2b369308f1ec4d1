// Observers: what the runtime does beside moving bytes — fault injection (delays at the start of
// an operation), the trace, the simulated clock and the hang watchdog's registry of pending waits
// — attached to every operation through one interface, so neither the collective algorithms nor
// the transport name any of them. Adding an observer touches only WorldShared's constructor
// (world.cpp) and the observer's own file. The flight recorder, always on, is the one built-in
// exception: notify_begin/notify_end (op_hooks.hpp) call it directly, after the begin hooks and
// before the end hooks of the listed observers.
//
// Cost: World::run lists, per hook, only the observers the run's options enable (hooks()), so a
// run with nothing on pays one empty-list branch per hook and no virtual call. The options are
// read at run start because injection may change between runs.
//
// Operations: a collective call (begin, meet, end), an isend (begin, end), a send's completion
// (send_wait; send_withdraw when an unwinding send is taken back), an irecv (recv_post: begin
// only) and a receive's completion (recv; recv_abandon when an unwinding receive is dropped).
// Requirements: hooks run on the rank's own thread and must not throw, except on_begin's
// injection delay (which does not throw either); begin and end of one OpInfo are paired by the
// runtime, observers keep per-operation state in the OpInfo.
// Order: observers run in the order WorldShared's constructor adds them: injection, simulated
// clock, trace (the trace records the simulated times the clock computed).
#pragma once

#include <cstdint>

#include "../transport/transport.hpp"

namespace tspemu::detail {

struct OpInfo {
  enum class Kind : std::uint8_t {
    collective,
    send,
    send_wait,
    send_withdraw,
    recv_post,
    recv,
    recv_abandon
  };
  static constexpr int kKinds = 7;
  static constexpr unsigned bit(Kind k) { return 1u << static_cast<unsigned>(k); }
  Kind kind = Kind::collective;
  const char* what = "";
  std::uint64_t seq = 0;  // collective number on the group, or message number on the pair
  const Group* group = nullptr;
  int peer = -1;  // world rank at the other end of a message
  int root = -1;
  std::uint64_t bytes = 0;
  CollectiveKind collective = CollectiveKind::barrier;
  int members = 0;
  // A non-blocking collective's call (nonblocking.hpp): its handle charges the simulated clock.
  bool nonblocking = false;
  // Set by the operation before end:
  bool completes_record = true;  // send: the message was copied at isend (eager)
  // Observers' state, carried from begin to end (and by a handle from isend/irecv to its wait):
  std::uint64_t record = 0;          // flight recorder id (notify_begin, op_hooks.hpp)
  std::uint64_t waits_at_begin = 0;  // RankState::waits at begin (notify_begin)
  std::int64_t trace_begin_ns = 0;
  std::int64_t sim_begin_ns = -1;
  std::int64_t sim_end_ns = -1;
  std::uint64_t flow = 0;           // trace flow id of a message
  std::int64_t sim_arrival_ns = 0;  // simulated arrival of a message at its receiver
};

// Every member's call header, after the meet.
struct MemberHeaders {
  const Transport* transport;
  const CallState* call;
  int size() const { return call->size; }
  const CallHeader& operator[](int member) const { return transport->header(*call, member); }
};

// The hooks an observer implements, as a bit set.
enum ObserverHook : unsigned {
  kHookBegin = 1u << 0,
  kHookMeet = 1u << 1,
  kHookEnd = 1u << 2,
  kHookWait = 1u << 3,  // on_wait_begin and on_wait_end
};

class Observer {
 public:
  virtual ~Observer() = default;
  // The hooks this observer needs under `opts` (0: it has nothing to do in such a run).
  virtual unsigned hooks(const WorldOptions& opts) const = 0;
  // The operations whose `hook` it acts on, as a set of bits 1 << OpInfo::Kind (every kind by
  // default). A hook no selected observer acts on for an operation's kind is not run at all
  // (WorldShared::observed), so a run with no listed observer on pays one test per hook.
  virtual unsigned kinds(ObserverHook /*hook*/) const { return ~0u; }
  virtual void on_begin(RankState&, OpInfo&) {}
  virtual void on_meet(RankState&, OpInfo&, const MemberHeaders&) {}
  virtual void on_end(RankState&, OpInfo&, bool /*ok*/) {}
  // A wait that outlasted the spin phase (published for the watchdog's scans) and its end.
  virtual void on_wait_begin(RankState&, const OpRef&, int /*waits_for*/) {}
  virtual void on_wait_end(RankState&) {}
};

// This call's header as the observers need it at the meet.
CallHeader call_header(const RankState& self);

// The world's observers (WorldShared::observers) run over one operation (inline in op_hooks.hpp:
// with nothing attached to a hook, its cost is one empty-list test).
inline void notify_begin(RankState& self, OpInfo& op);
inline void notify_meet(RankState& self, OpInfo& op, const MemberHeaders& headers);
inline void notify_end(RankState& self, OpInfo& op, bool ok);

// Each observer lives beside what it observes.
std::unique_ptr<Observer> make_injection_observer();     // observers/injection.cpp
std::unique_ptr<Observer> make_sim_clock_observer();     // observers/sim_clock.cpp
std::unique_ptr<Observer> make_trace_observer();         // observers/trace.cpp
std::unique_ptr<Observer> make_pending_wait_observer();  // watchdog.cpp

}  // namespace tspemu::detail
