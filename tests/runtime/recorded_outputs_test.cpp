// Every collective's output, bit for bit, against outputs recorded from the runtime as it was
// before the transport was separated from the algorithms (recorded_outputs.inc). The inputs are
// non-integer floats and doubles of mixed magnitudes, so any change in the order of a reduction's
// terms changes a checksum; both the eager (small) and the single-copy (large) paths are covered.
// Re-record (only when an output is meant to change): TSPEMU_RECORD_OUTPUTS=1 runtime_tests
// --gtest_filter='RecordedOutputs*' prints the table to paste into recorded_outputs.inc.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "test_util.hpp"

namespace tspemu::test {
namespace {

const std::map<std::string, std::uint64_t>& recorded() {
  static const std::map<std::string, std::uint64_t> table = {
#include "recorded_outputs.inc"
  };
  return table;
}

std::uint64_t mix(std::uint64_t x) {
  // splitmix64 finaliser: a fixed, platform-independent stream of input values.
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Non-integer values spread over seven decades: sums round, so their order shows in the bits.
template <class T>
std::vector<T> noisy(int rank, std::size_t count, int salt) {
  std::vector<T> v(count);
  for (std::size_t i = 0; i < count; ++i) {
    const std::uint64_t h = mix((static_cast<std::uint64_t>(rank) << 40) ^
                                (static_cast<std::uint64_t>(salt) << 32) ^ i);
    const double unit = static_cast<double>(h >> 11) * 0x1.0p-53 * 2.0 - 1.0;
    v[i] = static_cast<T>(unit * std::ldexp(1.0, static_cast<int>(h % 21) - 10));
  }
  return v;
}

template <class T>
std::vector<std::byte> bytes_of(const std::vector<T>& v) {
  const auto* p = reinterpret_cast<const std::byte*>(v.data());
  return {p, p + v.size() * sizeof(T)};
}

std::uint64_t fnv1a(std::uint64_t h, const std::vector<std::byte>& data) {
  for (std::byte b : data) h = (h ^ static_cast<std::uint64_t>(b)) * 0x100000001B3ull;
  return h;
}

// What one rank of an n-rank world outputs for one call (its result buffers, concatenated).
using Case = std::function<std::vector<std::byte>(Comm& c)>;

template <class T>
std::map<std::string, Case> cases(const char* tn, int n, bool large) {
  const std::size_t nn = static_cast<std::size_t>(n);
  const std::size_t count = large ? 1003 : 5;  // 1003 floats: the single-copy path
  const std::string suffix = std::string("/") + tn + (large ? "/large" : "/small");
  std::map<std::string, Case> m;
  m["broadcast" + suffix] = [=](Comm& c) {
    auto buf = noisy<T>(c.rank(), count, 1);
    broadcast<T>(c, buf, n - 1);
    return bytes_of(buf);
  };
  m["all_gather" + suffix] = [=](Comm& c) {
    auto send = noisy<T>(c.rank(), count, 2);
    std::vector<T> recv(count * nn);
    all_gather<T>(c, send, recv);
    return bytes_of(recv);
  };
  m["all_gatherv" + suffix] = [=](Comm& c) {
    auto send = noisy<T>(c.rank(), count + static_cast<std::size_t>(c.rank()), 3);
    std::vector<T> recv(count * nn + nn * (nn - 1) / 2);
    all_gatherv<T>(c, send, recv);
    return bytes_of(recv);
  };
  m["reduce_scatter" + suffix] = [=](Comm& c) {
    auto send = noisy<T>(c.rank(), count * nn, 4);
    std::vector<T> recv(count);
    reduce_scatter<T>(c, send, recv);
    return bytes_of(recv);
  };
  m["all_reduce" + suffix] = [=](Comm& c) {
    auto send = noisy<T>(c.rank(), count, 5);
    std::vector<T> recv(count);
    all_reduce<T>(c, send, recv);
    all_reduce<T>(c, std::span<T>(send));  // in place
    auto out = bytes_of(recv);
    auto in_place = bytes_of(send);
    out.insert(out.end(), in_place.begin(), in_place.end());
    return out;
  };
  m["reduce" + suffix] = [=](Comm& c) {
    auto send = noisy<T>(c.rank(), count, 6);
    std::vector<T> recv(count);
    reduce<T>(c, send, recv, n / 2);
    return c.rank() == n / 2 ? bytes_of(recv) : std::vector<std::byte>{};
  };
  m["all_to_all" + suffix] = [=](Comm& c) {
    auto send = noisy<T>(c.rank(), count * nn, 7);
    std::vector<T> recv(count * nn);
    all_to_all<T>(c, send, recv);
    return bytes_of(recv);
  };
  m["sendrecv" + suffix] = [=](Comm& c) {
    auto out = noisy<T>(c.rank(), count, 8);
    std::vector<T> in(count);
    sendrecv<T>(c, out, (c.rank() + 1) % n, in, (c.rank() + n - 1) % n);
    return bytes_of(in);
  };
  const std::vector<std::size_t> sizes = {count, 3, count / 2 + 1, 0, 2 * count};
  m["all_reduce_buffers" + suffix] = [=](Comm& c) {
    std::vector<std::vector<T>> set;
    for (std::size_t i = 0; i < sizes.size(); ++i)
      set.push_back(noisy<T>(c.rank(), sizes[i], 10 + static_cast<int>(i)));
    std::vector<std::span<T>> spans(set.begin(), set.end());
    all_reduce_buffers<T>(c, spans);
    std::vector<std::byte> out;
    for (auto& b : set) {
      auto bb = bytes_of(b);
      out.insert(out.end(), bb.begin(), bb.end());
    }
    return out;
  };
  m["reduce_scatter_buffers" + suffix] = [=](Comm& c) {
    std::vector<std::vector<T>> set;
    for (std::size_t i = 0; i < sizes.size(); ++i)
      set.push_back(noisy<T>(c.rank(), sizes[i] * nn, 20 + static_cast<int>(i)));
    std::vector<std::span<T>> spans(set.begin(), set.end());
    reduce_scatter_buffers<T>(c, spans);
    std::vector<std::byte> out;
    for (std::size_t i = 0; i < set.size(); ++i) {
      const auto* p = reinterpret_cast<const std::byte*>(set[i].data() + sizes[i] * c.rank());
      out.insert(out.end(), p, p + sizes[i] * sizeof(T));
    }
    return out;
  };
  const SequenceHeadsShape shape{2, large ? 17u : 3u, 2 * nn, large ? 9u : 2u};
  const std::size_t exchanged = shape.B * shape.S_local * shape.H * shape.hs;
  m["sequence_heads_exchange" + suffix] = [=](Comm& c) {
    auto in = noisy<T>(c.rank(), exchanged, 30);
    std::vector<T> heads(exchanged), back(exchanged);
    all_to_all_sequence_to_heads<T>(c, in, heads, shape);
    all_to_all_heads_to_sequence<T>(c, heads, back, shape);
    auto out = bytes_of(heads);
    auto b = bytes_of(back);
    out.insert(out.end(), b.begin(), b.end());
    return out;
  };
  return m;
}

// Runs every case on an n-rank world; returns name -> checksum of every rank's output in order.
std::map<std::string, std::uint64_t> checksums(int n) {
  std::map<std::string, Case> all;
  for (bool large : {false, true}) {
    all.merge(cases<float>("f32", n, large));
    all.merge(cases<double>("f64", n, large));
  }
  std::map<std::string, std::uint64_t> sums;
  for (auto& [name, one_case] : all) {
    const Case& fn = one_case;  // a lambda may not capture a structured binding in clang 14
    std::vector<std::vector<std::byte>> outputs(static_cast<std::size_t>(n));
    shared_world(n).run([&](Rank& r) { outputs[static_cast<std::size_t>(r.id())] = fn(r.comm()); });
    std::uint64_t h = 0xCBF29CE484222325ull;
    for (const auto& o : outputs) h = fnv1a(h, o);
    sums[name + "/n" + std::to_string(n)] = h;
  }
  return sums;
}

class RecordedOutputsTest : public ::testing::TestWithParam<int> {};

TEST_P(RecordedOutputsTest, EveryCollectiveIsBitwiseTheRecordedOutput) {
  const auto sums = checksums(GetParam());
  if (std::getenv("TSPEMU_RECORD_OUTPUTS") != nullptr) {
    for (const auto& [name, h] : sums)
      std::printf("{\"%s\", 0x%016llxull},\n", name.c_str(), static_cast<unsigned long long>(h));
    GTEST_SKIP() << "recording";
  }
  for (const auto& [name, h] : sums) {
    const auto it = recorded().find(name);
    ASSERT_NE(it, recorded().end()) << name << " has no recorded output";
    EXPECT_EQ(h, it->second) << name << " differs from the recorded output";
  }
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, RecordedOutputsTest, ::testing::Values(2, 3, 4, 8),
                         [](const auto& info) { return "n" + std::to_string(info.param); });

}  // namespace
}  // namespace tspemu::test
