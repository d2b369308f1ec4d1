#!/usr/bin/env bash
# A process of an MPI world killed by SIGKILL mid-run must end the whole job with an error naming
# it, within seconds, never a hang: OpenMPI's mpirun notices the death and tears the job down; the
# survivors, blocked in a collective waiting for the dead ranks, must not keep it alive.
# Usage: killed_process.sh MPIEXEC PROCESSES TEST_PROGRAM
set -u
mpiexec=$1 np=$2 program=$3
limit=20  # seconds from start to the job's end (a run takes well under 1 s)
start=$(date +%s%N)
out=$(TSPEMU_MPI_KILL_PROCESS=1 timeout 120 "$mpiexec" --allow-run-as-root --oversubscribe \
  -x TSPEMU_MPI_KILL_PROCESS -np "$np" "$program" --gtest_color=no \
  --gtest_filter='MpiKilledProcess.*' 2>&1)
rc=$?
elapsed_ms=$((($(date +%s%N) - start) / 1000000))
echo "$out" | tail -n 15
echo "killed_process.sh: mpirun exit code $rc after ${elapsed_ms} ms"
fail() { echo "killed_process.sh: FAILED: $*" >&2; exit 1; }
[ "$rc" -eq 124 ] && fail "the job hung (killed by timeout after 120 s)"
[ "$rc" -eq 0 ] && fail "mpirun exited 0 although a process was killed"
echo "$out" | grep -Eq "signal 9|Killed" || fail "mpirun's output does not name the killed process"
[ "$elapsed_ms" -le $((limit * 1000)) ] || fail "the job took ${elapsed_ms} ms to end (limit ${limit} s)"
echo "killed_process.sh: OK"
