// Run-time dispatch of the float kernels' elementwise and row loops to AVX-512 or AVX2 (private to
// reference/).
//
// What: TSPEMU_WIDE_CLONES marks a function for GCC's target_clones (avx512f, avx2, default); the
//   loader picks the widest the processor runs. f32x16 is sixteen float lanes: four SSE vectors
//   on baseline x86-64, one AVX-512 vector in the avx512f clone.
// Requirements: a file using it is compiled with -ffp-contract=off (reference/CMakeLists.txt), so
//   no clone fuses a*b+c into an FMA; its cloned functions take and return no f32x16 (a vector
//   wider than the caller's ABI vectors must not cross a call).
// Guarantees: every clone runs the same lane arithmetic in the same order, so every machine gets
//   the same bits whichever clone it runs; sanitized builds run the baseline code only (below),
//   with the same bits.
// Cost: one indirect call per cloned function call.
#pragma once

namespace tspemu::ref {

using f32x16 = float __attribute__((vector_size(64)));

// The sum of sixteen lane partial sums by a fixed pairwise tree: lanes l and l + width for width
// 8, 4, 2, 1. By reference and always inlined: an f32x16 must not cross a call.
[[gnu::always_inline]] inline float tree_sum(const f32x16& acc) {
  float lanes[16];
  __builtin_memcpy(lanes, &acc, sizeof lanes);
  for (int width = 8; width >= 1; width /= 2)
    for (int l = 0; l < width; ++l) lanes[l] += lanes[l + width];
  return lanes[0];
}

}  // namespace tspemu::ref

// target_clones dispatches through an IFUNC resolver, which the dynamic loader runs before the
// sanitizer runtimes start: an instrumented resolver crashes the program at load (ThreadSanitizer,
// AddressSanitizer). Sanitized builds therefore run the baseline loop only; the clones compute
// the same bits, so nothing the sanitizers check changes.
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define TSPEMU_SANITIZED_BUILD 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer) || __has_feature(address_sanitizer)
#define TSPEMU_SANITIZED_BUILD 1
#endif
#endif

#if defined(__x86_64__) && defined(__GNUC__) && !defined(TSPEMU_SANITIZED_BUILD)
#define TSPEMU_WIDE_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define TSPEMU_WIDE_CLONES
#endif
