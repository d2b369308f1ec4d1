#!/usr/bin/env bash
# Builds the libFuzzer harnesses (clang++, -DTSPEMU_FUZZ=ON) in build-fuzz/ and runs each for
# SECONDS (default 60) from its committed seed corpus fuzz/corpus/<target>/, as many at once as
# there are cores, printing the executions per target. Any crash, leak, sanitizer report, input
# slower than 10 s or RSS over 2 GB fails: the log's tail is printed and the reproducer is left in
# build-fuzz/crashes/<target>/ (rerun it with build-fuzz/fuzz/<target>_fuzz FILE; it belongs in
# fuzz/corpus/<target>/ once fixed, and its case in the normal test suite).
# Usage: bash fuzz/run.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
targets=(safetensors model_config llama_config config_file)

started=$SECONDS
CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTSPEMU_WERROR=ON \
  -DTSPEMU_BUILD_BENCH=OFF -DTSPEMU_FUZZ=ON >/dev/null
cmake --build build-fuzz -j"$(nproc)" --target "${targets[@]/%/_fuzz}"
echo "fuzz build: $((SECONDS - started)) s"

# One harness, its exit status in build-fuzz/<target>.rc. New inputs go to a scratch directory:
# the committed corpus stays the small seed set.
fuzz_one() {
  local target=$1 found=build-fuzz/found/$1 crashes=build-fuzz/crashes/$1
  rm -rf "$found" "$crashes"
  mkdir -p "$found" "$crashes"
  local rc=0
  build-fuzz/fuzz/"$target"_fuzz -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -max_len=16384 -print_final_stats=1 -artifact_prefix="$crashes/" \
    "$found" fuzz/corpus/"$target" >build-fuzz/"$target".log 2>&1 || rc=$?
  echo "$rc" >build-fuzz/"$target".rc
}

# Each harness is one process: as many at once as there are cores.
for target in "${targets[@]}"; do
  fuzz_one "$target" &
  while [ "$(jobs -rp | wc -l)" -ge "$(nproc)" ]; do wait -n || true; done
done
wait
failed=0
for target in "${targets[@]}"; do
  log=build-fuzz/$target.log
  if [ "$(cat build-fuzz/"$target".rc)" != 0 ]; then
    tail -n 60 "$log"
    echo "fuzz: $target FAILED; reproducer: $(ls build-fuzz/crashes/"$target")" >&2
    failed=1
  else
    echo "fuzz: $target: $(awk '/number_of_executed_units/ {print $2}' "$log") executions" \
      "in $seconds s, no crash"
  fi
done
echo "fuzz step: $((SECONDS - started)) s"
exit "$failed"
