#!/usr/bin/env bash
# The tspemu command under mpirun: a run spanning P processes reports what the same run without
# mpirun reports (per-rank traffic and memory, every tensor's error, the verdict: everything but
# the timings), written once by process 0; a rank failing in one process ends every process with
# exit code 1; a P that does not divide the ranks is exit 2 in every process, naming the flag.
# Usage: cli_under_mpirun.sh MPIEXEC PROCESSES TSPEMU
set -u
mpiexec=$1 np=$2 tspemu=$3
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "cli_under_mpirun.sh: FAILED: $*" >&2; exit 1; }
mpirun_() { timeout 120 "$mpiexec" --allow-run-as-root --oversubscribe -np "$np" "$@"; }
small=(-q --layers 1 --seq 256 --hidden 64 --heads 4 --kv-heads 4 --ffn 128 --vocab 64)

# Each process's exit code, one line each ("process P exit C"); the wrapper exits 0 so that mpirun
# does not tear the job down before every process has said its code.
codes() {
  mpirun_ bash -c '"$@" >/dev/null 2>"'"$dir"'/err.$OMPI_COMM_WORLD_RANK"; \
    echo "process $OMPI_COMM_WORLD_RANK exit $?"; exit 0' _ "$@" | sort
}
expect_codes() {  # CODE ARGS...
  local want=$1; shift
  local got; got=$(codes "$tspemu" "$@")
  echo "$got"
  [ "$(echo "$got" | grep -c " exit $want\$")" -eq "$np" ] ||
    fail "tspemu $* under mpirun -np $np: want exit $want in all $np processes, got: $got"
}

same_json() {  # A B: equal but for timings
  python3 "$(dirname "$0")/../same_json.py" "$1" "$2" seconds tokens_per_s time ||
    fail "JSON of $1 and $2 differ beyond timings"
}

for args in "--strategy tsp" "--strategy tsp --layers-only" "--strategy tp" \
            "--strategy tp-sp --tp 2 --sp 2" "--strategy ring"; do
  # shellcheck disable=SC2086
  "$tspemu" run "${small[@]}" $args --json "$dir/one.json" >/dev/null || fail "run $args failed"
  # shellcheck disable=SC2086
  mpirun_ "$tspemu" run "${small[@]}" $args --json "$dir/many.json" >"$dir/many.txt" ||
    fail "run $args under mpirun failed"
  same_json "$dir/one.json" "$dir/many.json"
  [ "$(grep -c '^verdict:' "$dir/many.txt")" -eq 1 ] || fail "the report is not printed exactly once"
  echo "run $args: the same report under mpirun -np $np"
done

# --trace: one file, one track per rank, each with the events of the run without mpirun (but the
# "send wait" slices: a message to another process is copied at send, so its send never waits).
"$tspemu" run "${small[@]}" --trace "$dir/one.trace" >/dev/null || fail "run --trace failed"
mpirun_ "$tspemu" run "${small[@]}" --trace "$dir/many.trace" >/dev/null ||
  fail "run --trace under mpirun failed"
python3 - "$dir/one.trace" "$dir/many.trace" <<'PY' || fail "the merged trace differs"
import collections, json, sys
def tracks(path):
    j = json.load(open(path))
    events = j["traceEvents"] if isinstance(j, dict) else j
    names = sorted(e["args"]["name"] for e in events
                   if e.get("ph") == "M" and e.get("name") == "process_name")
    per_rank = collections.Counter((e["pid"], e["ph"], e["name"].split(" #")[0]) for e in events
                                   if not e["name"].startswith("send wait"))
    return names, per_rank
one, many = tracks(sys.argv[1]), tracks(sys.argv[2])
assert one[0] == many[0] == ["rank 0", "rank 1", "rank 2", "rank 3"], many[0]
assert one[1] == many[1], (one[1] - many[1], many[1] - one[1])
PY
echo "run --trace: one track per rank, the events of the run without mpirun"

model=(--layers 1 --seq 256 --hidden 64 --heads 4 --kv-heads 4 --ffn 128)
"$tspemu" compare -q "${model[@]}" --json "$dir/one.json" >/dev/null || fail "compare failed"
mpirun_ "$tspemu" compare -q "${model[@]}" --json "$dir/many.json" >/dev/null ||
  fail "compare under mpirun failed"
same_json "$dir/one.json" "$dir/many.json"
echo "compare: the same rows under mpirun -np $np"
mpirun_ "$tspemu" scale -q "${model[@]}" --max-ranks 4 --mode both --json "$dir/scale.json" \
  >/dev/null || fail "scale under mpirun failed"
python3 - "$dir/scale.json" "$np" <<'PY' || fail "scale under mpirun: wrong rows"
import json, sys
j, np = json.load(open(sys.argv[1])), int(sys.argv[2])
assert j["processes"] == np, j["processes"]
for row in j["rows"]:
    if row["D"] % np:
        assert "mpirun processes" in row["skipped"], row
    else:
        assert row["skipped"] is None and row["model_match"] and row["tokens_per_s"] > 0, row
PY
echo "scale: the degrees the $np processes divide, each matching the cost model"

expect_codes 1 run "${small[@]}" --inject-failure-rank 3
grep -q "rank 3 failed: injected failure" "$dir/err.0" || fail "process 0 does not name rank 3"
expect_codes 2 run "${small[@]}" --ranks 3
grep -q -- "--ranks 3: launched by mpirun with $np processes" "$dir/err.0" ||
  fail "the exit-2 message does not name --ranks and the processes"
expect_codes 2 train "${small[@]}"
echo "cli_under_mpirun.sh: OK"
