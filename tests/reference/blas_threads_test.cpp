// OpenBLAS thread safety as the parallel schedules use it: many rank threads, each calling
// one-threaded sgemm at once, must get bitwise the results of the same calls made serially.
#include <cblas.h>
#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "test_util.hpp"
#include "tspemu/reference/matmul.hpp"

namespace tspemu::ref {
namespace {

TEST(OpenBlas, ConcurrentSgemmFromEightThreadsIsBitwiseEqualToSerial) {
  ensure_blas_single_threaded();
  constexpr int kThreads = 8, M = 96, N = 80, K = 112, kRepeats = 20;
  std::vector<std::vector<float>> A(kThreads), B(kThreads), serial(kThreads), parallel(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    const auto a = testing::random_vector(M * K, 100 + t),
               b = testing::random_vector(N * K, 200 + t);
    A[t].assign(a.begin(), a.end());
    B[t].assign(b.begin(), b.end());
    serial[t].resize(M * N);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, A[t].data(), K, B[t].data(),
                K, 0.0f, serial[t].data(), N);
  }
  std::vector<int> mismatches(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<float> c(M * N);
      for (int r = 0; r < kRepeats; ++r) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, A[t].data(), K,
                    B[t].data(), K, 0.0f, c.data(), N);
        if (c != serial[t]) ++mismatches[t];
      }
      parallel[t] = c;
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(mismatches[t], 0) << "thread " << t;
    EXPECT_EQ(parallel[t], serial[t]) << "thread " << t;
  }
}

TEST(OpenBlas, WrappersFromEightThreadsAreBitwiseEqualToSerial) {
  constexpr int kThreads = 8, M = 64, N = 48, K = 72;
  const auto a = testing::random_vector(M * K, 300), b = testing::random_vector(N * K, 301);
  const std::vector<float> A(a.begin(), a.end()), B(b.begin(), b.end());
  std::vector<float> serial(M * N);
  matmul_nt(serial.data(), A.data(), B.data(), M, N, K);
  std::vector<std::vector<float>> out(kThreads, std::vector<float>(M * N));
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] { matmul_nt(out[t].data(), A.data(), B.data(), M, N, K); });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(out[t], serial) << "thread " << t;
}

}  // namespace
}  // namespace tspemu::ref
