// One exact check per collective, run by every rank of a Comm: in-place and out-of-place forms,
// several roots, results compared bit for bit with a sequential model and the traffic counters
// compared with the formulas of counters.hpp. Used on the world Comm and on split sub-groups.
#pragma once

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "test_util.hpp"
#include "tspemu/runtime/comm.hpp"

namespace tspemu::test {

inline std::string ctx(const char* what, const Comm& c, std::size_t count, const char* dtype,
                       const char* variant = "") {
  return std::string(what) + " " + variant + " on " + c.name() + " (size " +
         std::to_string(c.size()) + ", group rank " + std::to_string(c.rank()) + ") count " +
         std::to_string(count) + " " + dtype;
}

template <class T>
std::vector<T> values(int rank, std::size_t count, int salt) {
  std::vector<T> v(count);
  for (std::size_t i = 0; i < count; ++i) v[i] = value<T>(rank, i, salt);
  return v;
}

// Sum over group ranks [0, n) of value(r, offset + i), left fold in rank order.
template <class T>
std::vector<T> sum_values(int n, std::size_t offset, std::size_t count, int salt) {
  std::vector<T> s(count);
  for (std::size_t i = 0; i < count; ++i) {
    T acc = value<T>(0, offset + i, salt);
    for (int r = 1; r < n; ++r) acc += value<T>(r, offset + i, salt);
    s[i] = acc;
  }
  return s;
}

inline std::vector<int> roots_for(int n) {
  std::vector<int> roots = {0, n - 1, n / 2};
  std::sort(roots.begin(), roots.end());
  roots.erase(std::unique(roots.begin(), roots.end()), roots.end());
  return roots;
}

template <class T>
void check_broadcast(Rank& rk, Comm& c, std::size_t count, const char* tn) {
  const int n = c.size(), me = c.rank();
  for (int root : roots_for(n)) {
    std::vector<T> buf = me == root ? values<T>(root, count, root) : std::vector<T>(count, T(99));
    CounterProbe p(rk, CollectiveKind::broadcast);
    broadcast<T>(c, buf, root);
    const auto want = values<T>(root, count, root);
    same(buf, want, ctx("broadcast", c, count, tn, ("root " + std::to_string(root)).c_str()));
    p.expect(expected_traffic(CollectiveKind::broadcast, n, me, root, count * sizeof(T), sizeof(T)),
             ctx("broadcast counters", c, count, tn));
  }
}

template <class T>
void check_all_gather(Rank& rk, Comm& c, std::size_t count, const char* tn) {
  const int n = c.size(), me = c.rank();
  std::vector<T> want;
  for (int r = 0; r < n; ++r) {
    auto v = values<T>(r, count, 1);
    want.insert(want.end(), v.begin(), v.end());
  }
  {  // out of place
    auto send = values<T>(me, count, 1);
    std::vector<T> recv(count * n, T(99));
    CounterProbe p(rk, CollectiveKind::all_gather);
    all_gather<T>(c, send, recv);
    same(recv, want, ctx("all_gather", c, count, tn, "out-of-place"));
    p.expect(expected_traffic(CollectiveKind::all_gather, n, me, -1, count * sizeof(T), sizeof(T)),
             ctx("all_gather counters", c, count, tn));
  }
  {  // in place: send is this rank's block of recv
    std::vector<T> recv(count * n, T(99));
    auto mine = values<T>(me, count, 1);
    std::copy(mine.begin(), mine.end(), recv.begin() + static_cast<std::ptrdiff_t>(me * count));
    std::span<T> all(recv);
    all_gather<T>(c, all.subspan(me * count, count), all);
    same(recv, want, ctx("all_gather", c, count, tn, "in-place"));
  }
}

inline std::size_t gatherv_count(int r, std::size_t count) {
  return count - static_cast<std::size_t>(r % 3) * count / 3;
}

template <class T>
void check_all_gatherv(Rank& rk, Comm& c, std::size_t count, const char* tn) {
  const int n = c.size(), me = c.rank();
  std::vector<T> want;
  std::size_t my_offset = 0, others = 0;
  for (int r = 0; r < n; ++r) {
    if (r == me) my_offset = want.size();
    auto v = values<T>(r, gatherv_count(r, count), 2);
    if (r != me) others += v.size();
    want.insert(want.end(), v.begin(), v.end());
  }
  const std::size_t mine = gatherv_count(me, count);
  {
    auto send = values<T>(me, mine, 2);
    std::vector<T> recv(want.size(), T(99));
    CounterProbe p(rk, CollectiveKind::all_gatherv);
    all_gatherv<T>(c, send, recv);
    same(recv, want, ctx("all_gatherv", c, count, tn, "out-of-place"));
    p.expect({(n - 1) * mine * sizeof(T), others * sizeof(T)},
             ctx("all_gatherv counters", c, count, tn));
  }
  {  // in place
    std::vector<T> recv(want.size(), T(99));
    auto v = values<T>(me, mine, 2);
    std::copy(v.begin(), v.end(), recv.begin() + static_cast<std::ptrdiff_t>(my_offset));
    std::span<T> all(recv);
    all_gatherv<T>(c, all.subspan(my_offset, mine), all);
    same(recv, want, ctx("all_gatherv", c, count, tn, "in-place"));
  }
}

template <class T>
void check_reduce_scatter(Rank& rk, Comm& c, std::size_t count, const char* tn) {
  const int n = c.size(), me = c.rank();
  const auto want = sum_values<T>(n, me * count, count, 3);
  {
    auto send = values<T>(me, count * n, 3);
    std::vector<T> recv(count, T(99));
    CounterProbe p(rk, CollectiveKind::reduce_scatter);
    reduce_scatter<T>(c, send, recv);
    same(recv, want, ctx("reduce_scatter", c, count, tn, "out-of-place"));
    p.expect(expected_traffic(CollectiveKind::reduce_scatter, n, me, -1, n * count * sizeof(T),
                              sizeof(T)),
             ctx("reduce_scatter counters", c, count, tn));
  }
  {  // in place: recv is this rank's block of send
    auto send = values<T>(me, count * n, 3);
    std::span<T> all(send);
    reduce_scatter<T>(c, all, all.subspan(me * count, count));
    std::vector<T> got(all.begin() + static_cast<std::ptrdiff_t>(me * count),
                       all.begin() + static_cast<std::ptrdiff_t>(me * count + count));
    same(got, want, ctx("reduce_scatter", c, count, tn, "in-place"));
  }
}

template <class T>
void check_all_reduce(Rank& rk, Comm& c, std::size_t count, const char* tn) {
  const int n = c.size(), me = c.rank();
  const auto want = sum_values<T>(n, 0, count, 4);
  {
    auto send = values<T>(me, count, 4);
    std::vector<T> recv(count, T(99));
    CounterProbe p(rk, CollectiveKind::all_reduce);
    all_reduce<T>(c, send, recv);
    same(recv, want, ctx("all_reduce", c, count, tn, "out-of-place"));
    p.expect(expected_traffic(CollectiveKind::all_reduce, n, me, -1, count * sizeof(T), sizeof(T)),
             ctx("all_reduce counters", c, count, tn));
  }
  {
    auto buf = values<T>(me, count, 4);
    all_reduce<T>(c, std::span<T>(buf));
    same(buf, want, ctx("all_reduce", c, count, tn, "in-place"));
  }
}

template <class T>
void check_reduce(Rank& rk, Comm& c, std::size_t count, const char* tn) {
  const int n = c.size(), me = c.rank();
  const auto want = sum_values<T>(n, 0, count, 5);
  for (int root : roots_for(n)) {
    const std::string rs = "root " + std::to_string(root);
    {
      auto send = values<T>(me, count, 5);
      std::vector<T> recv(me == root ? count : 0, T(99));
      CounterProbe p(rk, CollectiveKind::reduce);
      reduce<T>(c, send, recv, root);
      if (me == root) same(recv, want, ctx("reduce", c, count, tn, rs.c_str()));
      p.expect(expected_traffic(CollectiveKind::reduce, n, me, root, count * sizeof(T), sizeof(T)),
               ctx("reduce counters", c, count, tn, rs.c_str()));
    }
    {  // in place at the root
      auto buf = values<T>(me, count, 5);
      std::span<T> s(buf);
      reduce<T>(c, s, me == root ? s : std::span<T>(), root);
      if (me == root) same(buf, want, ctx("reduce in-place", c, count, tn, rs.c_str()));
    }
  }
}

template <class T>
void check_all_to_all(Rank& rk, Comm& c, std::size_t count, const char* tn) {
  const int n = c.size(), me = c.rank();
  // send_q[r·c + i] = value(q, r·c + i); recv_me[q·c + i] = send_q[me·c + i].
  auto send = values<T>(me, count * n, 6);
  std::vector<T> want(count * n);
  for (int q = 0; q < n; ++q)
    for (std::size_t i = 0; i < count; ++i) want[q * count + i] = value<T>(q, me * count + i, 6);
  std::vector<T> recv(count * n, T(99));
  CounterProbe p(rk, CollectiveKind::all_to_all);
  all_to_all<T>(c, send, recv);
  same(recv, want, ctx("all_to_all", c, count, tn));
  p.expect(
      expected_traffic(CollectiveKind::all_to_all, n, me, -1, n * count * sizeof(T), sizeof(T)),
      ctx("all_to_all counters", c, count, tn));
}

template <class T>
void check_p2p(Rank& rk, Comm& c, std::size_t count, const char* tn) {
  const int n = c.size(), me = c.rank();
  const int right = (me + 1) % n, left = (me + n - 1) % n;
  const std::uint64_t bytes = count * sizeof(T);
  const auto from_left = values<T>(left, count, 7);
  {  // sendrecv: one ring step
    auto out = values<T>(me, count, 7);
    std::vector<T> in(count, T(99));
    CounterProbe ps(rk, CollectiveKind::send), pr(rk, CollectiveKind::recv);
    sendrecv<T>(c, out, right, in, left);
    same(in, from_left, ctx("sendrecv", c, count, tn));
    ps.expect({right == me ? 0 : bytes, 0}, ctx("sendrecv send counters", c, count, tn));
    pr.expect({0, left == me ? 0 : bytes}, ctx("sendrecv recv counters", c, count, tn));
  }
  {  // blocking send/recv around the ring: rank 0 sends first, the others pass it on
    auto out = values<T>(me, count, 7);
    std::vector<T> in(count, T(99));
    if (n == 1) {
      auto h = isend<T>(c, out, 0);
      recv<T>(c, in, 0);
      h.wait();
    } else if (me == 0) {
      send<T>(c, out, right);
      recv<T>(c, in, left);
    } else {
      recv<T>(c, in, left);
      send<T>(c, out, right);
    }
    same(in, from_left, ctx("send/recv", c, count, tn));
  }
  {  // isend/irecv: 4 messages in flight per ordered pair when n <= 2 (the channel depth)
    std::vector<std::vector<T>> outs, ins;
    for (int k = 0; k < 2; ++k) {
      outs.push_back(values<T>(me, count, 8 + k));
      ins.emplace_back(count, T(99));
      ins.emplace_back(count, T(99));
    }
    std::vector<SendHandle> sends;
    std::vector<RecvHandle> recvs;
    for (int k = 0; k < 2; ++k) {
      sends.push_back(isend<T>(c, outs[k], right));
      sends.push_back(isend<T>(c, outs[k], left));
    }
    for (int k = 0; k < 2; ++k) {
      recvs.push_back(irecv<T>(c, ins[2 * k], left));
      recvs.push_back(irecv<T>(c, ins[2 * k + 1], right));
    }
    for (auto& h : recvs) h.wait();
    for (auto& h : sends) h.wait();
    for (int k = 0; k < 2; ++k) {
      same(ins[2 * k], values<T>(left, count, 8 + k), ctx("irecv from left", c, count, tn));
      same(ins[2 * k + 1], values<T>(right, count, 8 + k), ctx("irecv from right", c, count, tn));
    }
  }
}

inline void check_barrier(Rank& rk, Comm& c) {
  CounterProbe p(rk, CollectiveKind::barrier);
  for (int i = 0; i < 3; ++i) barrier(c);
  p.expect({0, 0}, "barrier on " + c.name(), 3);
}

// T × S mesh factorizations used for sub-group tests.
inline std::pair<int, int> mesh_of(int n) {
  for (int t = 2; t * t <= n; ++t)
    if (n % t == 0) return {t, n / t};
  return {1, n};
}

// Row and column communicators of a T × S mesh (rank = t·S + s). Columns use a reversed key so
// group rank order differs from world rank order.
struct Mesh {
  Comm row, col;
};
inline Mesh split_mesh(Rank& r, int t_count, int s_count) {
  (void)t_count;
  const int t = r.id() / s_count, s = r.id() % s_count;
  Mesh m;
  m.row = r.comm().split(t, s, "row" + std::to_string(t));
  m.col = r.comm().split(s, -t, "col" + std::to_string(s));
  return m;
}

inline std::vector<std::size_t> sweep_counts(int n) {
  std::vector<std::size_t> c = {0, 1, 7, 1000};
  const std::size_t big = std::size_t{1} << 20;
  if (quick() ? n == 2 : n <= 4) c.push_back(big);
  return c;
}

// Runs check(rank, comm, count, type name) for every count and element type on the world of
// size n, then on the rows and columns of a mesh.
#define TSPEMU_SWEEP(CHECK)                                                     \
  do {                                                                          \
    const int n = GetParam();                                                   \
    World& world = shared_world(n);                                             \
    for (std::size_t count : sweep_counts(n)) {                                 \
      const bool big = count > 1000;                                            \
      world.run([&](Rank& r) {                                                  \
        CHECK<float>(r, r.comm(), count, "float");                              \
        CHECK<std::int64_t>(r, r.comm(), count, "int64");                       \
        if (!big) {                                                             \
          CHECK<double>(r, r.comm(), count, "double");                          \
          CHECK<std::int32_t>(r, r.comm(), count, "int32");                     \
        }                                                                       \
      });                                                                       \
    }                                                                           \
    const std::pair<int, int> mesh = mesh_of(n);                                \
    const int mt = mesh.first, ms = mesh.second;                                \
    if (mt > 1) {                                                               \
      for (std::size_t count :                                                  \
           {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{1000}}) \
        world.run([&](Rank& r) {                                                \
          Mesh m = split_mesh(r, mt, ms);                                       \
          EXPECT_EQ(m.row.size(), ms);                                          \
          EXPECT_EQ(m.col.size(), mt);                                          \
          CHECK<float>(r, m.row, count, "float");                               \
          CHECK<double>(r, m.col, count, "double");                             \
          CHECK<std::int32_t>(r, m.col, count, "int32");                        \
          CHECK<std::int64_t>(r, m.row, count, "int64");                        \
        });                                                                     \
    }                                                                           \
  } while (0)

}  // namespace tspemu::test
