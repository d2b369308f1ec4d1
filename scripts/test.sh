#!/usr/bin/env bash
# Installs dependencies, builds tspemu with warnings as errors and runs every test:
#   1. the whole suite (ctest) in a RelWithDebInfo build, then `cmake --install` of it and the
#      out-of-tree consumer tests/package built against the install, by find_package and by
#      pkg-config;
#   2. clang-tidy with the curated checks of .clang-tidy over apps/ runtime/ plan/ pipeline/ tsp/
#      reference/ check/ (findings listed and counted by check; any finding fails), then the
#      runtime tests, the TSP, baseline and sequence-attention block tests, the decoders and the
#      pipeline executor's tests under ThreadSanitizer;
#   3. the whole suite under AddressSanitizer + UndefinedBehaviorSanitizer (the decoders' long greedy
#      runs at one shape each);
#   4. the libFuzzer harnesses of fuzz/ (clang), 50 s each, failing on any crash (fuzz/run.sh).
# `--quick` stops after step 1. Run from anywhere, as root on Debian 12.
#
# Cost (the CI machine has 2 cores, so compile time is most of the run; figures in
# docs/building.md): the sanitizer builds (steps 2 and 3) compile at -O1 with line tables only
# (-g1) instead of RelWithDebInfo's -O2 -g. Neither drops a check: the sanitizers instrument every
# memory access the optimizer leaves, and -O1 leaves at least as many as -O2 (the sanitizers'
# documentation asks for -O1 or higher for speed); a report needs function, file and line for every
# frame, inlined frames included, which the line tables keep, while the types and locals of full
# debug info are read by a debugger only. The ctest runs and the tests they select are unchanged.
# The normal build stays RelWithDebInfo (-O2 -g), as a user builds it; the fuzz build stays -O2,
# since its harnesses run for a fixed time and a faster harness tries more inputs.
# The sanitizer builds use clang (which the fuzz stage needs anyway): it compiles this code base
# about 40 % faster than GCC under the sanitizers, and it puts the whole tree, tests included,
# through a second compiler's warnings with -Werror, where GCC builds the normal tree. GCC's
# sanitizer runtimes are LLVM's compiler-rt imported, so the reports are the same; clang's
# -fsanitize=undefined checks more (float-to-integer overflow, calls through a mistyped function
# pointer), nothing less.
# Every build compiles the opted-in test programs as unity builds (TSPEMU_UNITY_TESTS, in batches
# of 8 files; tests/CMakeLists.txt says why): the same tests, compiled in fewer translation units.
# ctest runs two tests at a time (one per core): a test's ranks block in collectives, its process
# starts, and MPI tests wait for their peers, which leaves a core idle when tests run one by one;
# each test has its own temporary files and its own timeout.
set -euo pipefail
cd "$(dirname "$0")/.."
quick=0
[ "${1:-}" = "--quick" ] && quick=1
jobs=$(nproc)
# The sanitizer builds' compiler, optimization and debug-info level (the header says why).
sanitizer_flags=(-DCMAKE_CXX_COMPILER=clang++ -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG")

bash scripts/install-deps.sh

build() {  # build DIR [cmake args...]
  local dir=$1
  shift
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTSPEMU_WERROR=ON \
    -DTSPEMU_UNITY_TESTS=ON "$@" >/dev/null
  cmake --build "$dir" -j"$jobs"
}

echo "== build and test (RelWithDebInfo)"
started=$SECONDS
build build
ctest -j"$jobs" --test-dir build --output-on-failure --timeout 600
echo "build and test step: $((SECONDS - started)) s"

echo "== install, then build tests/package against it (find_package, then pkg-config)"
started=$SECONDS
prefix="$PWD/build/install"
rm -rf "$prefix" build/package
cmake --install build --prefix "$prefix" >/dev/null
cmake -S tests/package -B build/package -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build build/package -j"$jobs"
ctest -j"$jobs" --test-dir build/package --output-on-failure --timeout 120
command -v pkg-config >/dev/null ||
  { echo "test.sh: pkg-config not found; scripts/install-deps.sh must install pkg-config" >&2; exit 1; }
pc_flags=$(PKG_CONFIG_PATH="$prefix/lib/pkgconfig" pkg-config --cflags --libs tspemu)
# shellcheck disable=SC2086  # the flags are meant to split into words
g++ -O1 -Wall -Wextra -Werror tests/package/consumer.cpp $pc_flags -o build/package/consumer_pkg_config
build/package/consumer_pkg_config
echo "package step: $((SECONDS - started)) s"

[ "$quick" = 1 ] && exit 0

echo "== clang-tidy: .clang-tidy's curated checks over the first-party sources"
started=$SECONDS
tidy_status=0
run-clang-tidy -quiet -p build -j "$jobs" "^$PWD/(apps|runtime|plan|pipeline|tsp|reference|check)/.*\.cpp\$" \
  >build/clang-tidy.log 2>&1 || tidy_status=$?
# A finding in a header is reported once per file that includes it: counted once.
findings=$(grep -E "(warning|error): " build/clang-tidy.log | sed 's/\x1b\[[0-9;]*m//g' | sort -u || true)
count=$(printf '%s' "$findings" | grep -c . || true)
echo "clang-tidy findings: $count (log: build/clang-tidy.log)"
printf '%s\n' "$findings" | grep -oE "\[[a-z0-9.,-]+\]$" | sed 's/,-warnings-as-errors//' |
  sort | uniq -c | sort -rn || true
printf '%s\n' "$findings" | grep . || true
echo "clang-tidy step: $((SECONDS - started)) s"
if [ "$count" -gt 0 ] || [ "$tidy_status" -ne 0 ]; then
  echo "test.sh: clang-tidy failed ($count findings, run-clang-tidy exit $tidy_status): fix them," \
    "or NOLINT(check) with the reason for a deliberate one" >&2
  exit 1
fi

echo "== runtime tests, the TSP, baseline and sequence-attention block tests, the whole models, the decoders and the pipeline executor under ThreadSanitizer"
# Ranks write disjoint parts of shared tensors in the block tests too, not only in runtime/; the
# pipeline executor's stages hand activations to each other by non-blocking sends.
# Every decoder (TSP-W, TSP-M, TP, Megatron-SP, Helix, SP with its pass-Q, ring and Ulysses
# prefills, the TP+SP mesh) runs under it too, except the 256-step
# greedy runs (*Greedy): each of their steps is the same code, on the same ranks, sub-groups and
# collectives, as the teacher-forced steps (*Float) and the prefill + decode steps of the decoder
# and traffic tests, which do run here; under ThreadSanitizer TSP-W's long runs alone cost ~440 s
# and exercise no interleaving the short ones do not.
started=$SECONDS
cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTSPEMU_WERROR=ON \
  -DTSPEMU_UNITY_TESTS=ON -DTSPEMU_SANITIZE=thread -DTSPEMU_RUNTIME_ONLY=OFF -DTSPEMU_BUILD_BENCH=OFF \
  "${sanitizer_flags[@]}" \
  >/dev/null
cmake --build build-tsan -j"$jobs" --target runtime_tests tsp_tests pipeline_tests
export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1"
ctest -j"$jobs" --test-dir build-tsan/tests/runtime --output-on-failure --timeout 900
ctest -j"$jobs" --test-dir build-tsan/tests/tsp --output-on-failure --timeout 900 \
  -R 'TspBlockVsReference|TspBlocks\.|TspBf16Layer|SubGroupCores|BaselineVsReference|BaselineBlocks\.|SequenceAttention|MeshModel\.|Tspw|Tspm|Tp(Float|Decode|Traffic)|Helix|Sp(Float|Decode|Traffic)|Mesh(Float|Decode|Traffic)|KvOwnership|RankKvCache|MegatronSpDecode|SpPrefill' \
  -E '(Tspw|Tspm|Tp|Helix|Sp|Mesh|MegatronSpDecode|SpPrefill)Greedy'
ctest -j"$jobs" --test-dir build-tsan/tests/pipeline --output-on-failure --timeout 900
unset TSAN_OPTIONS
echo "ThreadSanitizer step: $((SECONDS - started)) s"

echo "== whole suite under AddressSanitizer + UndefinedBehaviorSanitizer"
started=$SECONDS
build build-asan -DTSPEMU_SANITIZE=address -DTSPEMU_BUILD_BENCH=OFF "${sanitizer_flags[@]}"
# Every test, except that the decoders' 256-step greedy runs (46 of them) run at
# one shape per decoder: the most ranks, with KV heads duplicated where the schedule duplicates
# them (Megatron-SP shares TP's T8_NH8_NKV2; the SP ring and Ulysses prefills at Σ = 8 each). The
# other shapes' runs are the same code over other layouts, which the teacher-forced tests run here
# at every shape; a greedy run adds the long context, which one shape per decoder reaches.
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1" UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
ctest -j"$jobs" --test-dir build-asan --output-on-failure --timeout 900 -E 'Greedy\.DoubleRunOf256Steps'
ctest -j"$jobs" --test-dir build-asan --output-on-failure --timeout 900 \
  -R 'Greedy\.DoubleRunOf256Steps.*/(8|T8_NH8_NKV2|KVP2_TPA4_NKV2|T2xS4|Ring_S8_NH8_NKV4|Ulysses_S8_NH16_NKV8)( |$)'
unset ASAN_OPTIONS UBSAN_OPTIONS
echo "AddressSanitizer step: $((SECONDS - started)) s"

echo "== fuzzing: each libFuzzer harness for 50 s"
bash fuzz/run.sh 50
