#include "tspemu/reference/cross_entropy.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <stdexcept>
#include <string>

#include "tspemu/core/dry_run.hpp"

namespace tspemu::ref {

namespace {

void check_target(std::int32_t t, int n, int V) {
  if (t < 0 || t >= V) {
    throw std::invalid_argument("cross_entropy: targets[" + std::to_string(n) + "]=" +
                                std::to_string(t) + " outside [0, " + std::to_string(V) + ")");
  }
}

template <class T>
T row_logsumexp(const T* row, int V) {
  const T m = *std::max_element(row, row + V);
  T sum = 0;
  for (int v = 0; v < V; ++v) sum += std::exp(row[v] - m);
  return m + std::log(sum);
}

}  // namespace

template <class T>
double cross_entropy_forward(const T* logits, const std::int32_t* targets, int N, int V) {
  if (N <= 0) throw std::invalid_argument("cross_entropy: N=" + std::to_string(N));
  if (dry_run()) return 0;  // a dry run's buffers are unbacked (core/dry_run.hpp)
  double total = 0;
  for (int n = 0; n < N; ++n) {
    check_target(targets[n], n, V);
    const T* row = logits + std::size_t(n) * V;
    total += double(row_logsumexp(row, V) - row[targets[n]]);
  }
  return total / N;
}

template <class T>
void cross_entropy_backward(T* dlogits, const T* logits, const std::int32_t* targets, int N,
                            int V) {
  if (dry_run()) return;  // a dry run's buffers are unbacked (core/dry_run.hpp)
  for (int n = 0; n < N; ++n) {
    check_target(targets[n], n, V);
    const T* row = logits + std::size_t(n) * V;
    T* drow = dlogits + std::size_t(n) * V;
    const T lse = row_logsumexp(row, V);
    for (int v = 0; v < V; ++v) drow[v] = std::exp(row[v] - lse) / T(N);
    drow[targets[n]] -= T(1) / T(N);
  }
}

template double cross_entropy_forward<float>(const float*, const std::int32_t*, int, int);
template double cross_entropy_forward<double>(const double*, const std::int32_t*, int, int);
template void cross_entropy_backward<float>(float*, const float*, const std::int32_t*, int, int);
template void cross_entropy_backward<double>(double*, const double*, const std::int32_t*, int, int);

}  // namespace tspemu::ref
