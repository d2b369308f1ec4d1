// The fp64 oracle's parallelism. The double instantiation of a kernel may split its work into
// tasks with fixed boundaries (rows of a GEMM, (batch, KV head) groups of attention) that oneTBB
// runs on any thread in any order. A task owns every output element it writes and computes it in
// the same order as a one-thread run, so the oracle is bitwise identical whatever the number of
// threads (tests/reference/oracle_tasks_test.cpp). The float instantiation, the single-thread fp32
// reference that parallel schedules are timed and judged against, runs the same tasks in order on
// the calling thread.
#pragma once

#include <tbb/parallel_for.h>

#include <type_traits>

namespace tspemu::ref::detail {

// ThreadSanitizer cannot see oneTBB's synchronization (Debian's library is not instrumented) and
// reports its task pool as racing. The tasks' results do not depend on the threads, so a
// ThreadSanitizer build runs them in order, bitwise the same; the ranks it checks are unaffected.
#if defined(__SANITIZE_THREAD__)
inline constexpr bool kOracleThreads = false;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
inline constexpr bool kOracleThreads = false;
#else
inline constexpr bool kOracleThreads = true;
#endif
#else
inline constexpr bool kOracleThreads = true;
#endif

template <class T, class Task>
void for_each_task(int tasks, const Task& task) {
  if constexpr (std::is_same_v<T, double> && kOracleThreads) {
    tbb::parallel_for(0, tasks, [&](int i) { task(i); });
  } else {
    for (int i = 0; i < tasks; ++i) task(i);
  }
}

}  // namespace tspemu::ref::detail
