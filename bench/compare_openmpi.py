#!/usr/bin/python3
"""Same-session comparison of tspemu with OpenMPI (collectives) and with PyTorch (one layer).

Usage: bench/compare_openmpi.py [--build DIR] [--rounds R] [--repetitions N] [--ranks 2,4,8]
                                [--bytes 8,4194304] [--pin-ranks] [--no-torch]

1. Collectives: broadcast, all_gather, all_reduce, reduce_scatter and sendrecv at each rank
   count and size, OpenMPI's (DIR/bench/mpi_collectives under `mpirun --oversubscribe -np N`,
   shared-memory transport, its default binding) and tspemu's (DIR/bench/runtime_bench), timed
   alike (median batch time per call, see mpi_collectives.cpp). The two programs alternate, R
   rounds of N repetitions each; the table shows the medians over all samples and the ratio
   tspemu / OpenMPI (below 1: tspemu is faster).
2. The reference layer (DIR/bench/reference_bench: one Llama layer fp32, 1 thread, with the BLAS
   kernel it ran on) against PyTorch on the same shape (/usr/bin/python3
   bench/torch_layer_bench.py, 1 thread), forward and forward+backward, run in alternation too.

Build DIR with -DTSPEMU_BUILD_BENCH=ON (mpi_collectives needs MPI: TSPEMU_HAVE_MPI). Timings on a
shared machine are noisy: the load average is printed with the results.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys

import bench_runs

HERE = os.path.dirname(os.path.abspath(__file__))


def run_openmpi(binary, n, sizes, repetitions):
    """{name: [microseconds per repetition]} from one mpirun of mpi_collectives."""
    cmd = ["mpirun", "--oversubscribe", "-np", str(n), binary,
           "--bytes", ",".join(map(str, sizes)), "--repetitions", str(repetitions),
           "--samples"]
    if os.geteuid() == 0:
        cmd.insert(1, "--allow-run-as-root")
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    samples = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0].startswith("coll/"):
            samples.setdefault(parts[0], []).extend(float(x) for x in parts[1:])
    return samples


def compare_collectives(a, load_before):
    mpi = os.path.join(a.build, "bench", "mpi_collectives")
    rt = os.path.join(a.build, "bench", "runtime_bench")
    for path in (mpi, rt):
        if not os.access(path, os.X_OK):
            sys.exit("compare_openmpi: {} not found (build with -DTSPEMU_BUILD_BENCH=ON{})".format(
                path, " and MPI" if path == mpi else ""))
    openmpi, tspemu = {}, {}
    extra = ["--pin_ranks"] if a.pin_ranks else []
    for r in range(a.rounds):
        for n in a.ranks:
            steps = [("openmpi", n), ("tspemu", n)]
            for which, n in (steps if r % 2 == 0 else steps[::-1]):
                bench_runs.log("round {}/{}: {} {} ranks".format(r + 1, a.rounds, which, n))
                if which == "openmpi":
                    bench_runs.merge(openmpi, run_openmpi(mpi, n, a.bytes, a.repetitions))
                else:
                    bench_runs.merge(tspemu, bench_runs.run_google_benchmark(
                        rt, bench_runs.target_filter(ranks=[n], sizes=a.bytes), a.repetitions,
                        extra))
    om, tm = bench_runs.medians(openmpi), bench_runs.medians(tspemu)
    print("collectives, same session: {} rounds x {} repetitions per program{}; medians in us"
          .format(a.rounds, a.repetitions, ", tspemu ranks pinned" if a.pin_ranks else ""))
    print("{}; after: {}".format(load_before, bench_runs.load_average()))
    print("{:<16}{:>6}{:>10}{:>14}{:>14}{:>16}".format("collective", "ranks", "bytes", "OpenMPI",
                                                       "tspemu", "tspemu/OpenMPI"))
    for name in sorted(set(om) & set(tm), key=bench_runs.sort_key):
        _, kind, ranks, size = name.split("/")
        print("{:<16}{:>6}{:>10}{:>14.3f}{:>14.3f}{:>16.3f}".format(
            kind, ranks.split(":")[1], size.split(":")[1], om[name], tm[name],
            tm[name] / om[name]))


def run_torch():
    """(forward ms, forward+backward ms) of bench/torch_layer_bench.py, wall medians."""
    out = subprocess.run(["/usr/bin/python3", os.path.join(HERE, "torch_layer_bench.py")],
                         check=True, capture_output=True, text=True).stdout
    got = {}
    for line in out.splitlines():
        m = re.match(r"(forward\+backward|forward)\s+median\s+([0-9.]+) ms wall", line)
        if m:
            got[m.group(1)] = float(m.group(2))
    return got["forward"], got["forward+backward"]


def run_reference(binary):
    """(forward ms, forward+backward ms, blas kernel) of reference_bench, medians."""
    out = subprocess.run([binary, "--benchmark_format=json", "--benchmark_filter=BM_Layer"],
                         check=True, capture_output=True, text=True).stdout
    import json
    doc = json.loads(out)
    got = {}
    for b in doc["benchmarks"]:
        if b.get("aggregate_name") == "median":
            got[b["run_name"].split("/")[0]] = b["real_time"]
    return got["BM_LayerForward"], got["BM_LayerForwardBackward"], doc["context"].get("blas", "?")


def compare_torch(a):
    ref = os.path.join(a.build, "bench", "reference_bench")
    if not os.access(ref, os.X_OK):
        sys.exit("compare_openmpi: {} not found (a full build with benchmarks)".format(ref))
    load_before = bench_runs.load_average()
    ours, theirs, kernel = [], [], "?"
    for r in range(a.torch_rounds):
        for which in (["tspemu", "torch"] if r % 2 == 0 else ["torch", "tspemu"]):
            bench_runs.log("reference vs PyTorch round {}/{}: {}".format(r + 1, a.torch_rounds,
                                                                         which))
            if which == "torch":
                theirs.append(run_torch())
            else:
                f, fb, kernel = run_reference(ref)
                ours.append((f, fb))
    print()
    print("reference layer (C=1024, NH=NKV=16, F=2816, T=2048, fp32, 1 thread) vs PyTorch, same "
          "session, {} rounds; medians in ms".format(a.torch_rounds))
    print("tspemu blas: {}".format(kernel))
    print("{}; after: {}".format(load_before, bench_runs.load_average()))
    print("{:<18}{:>12}{:>12}{:>16}".format("pass", "PyTorch", "tspemu", "tspemu/PyTorch"))
    for i, name in enumerate(("forward", "forward+backward")):
        t = statistics.median(x[i] for x in theirs)
        o = statistics.median(x[i] for x in ours)
        print("{:<18}{:>12.1f}{:>12.1f}{:>16.3f}".format(name, t, o, o / t))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build", default=os.path.join(HERE, "..", "build"))
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--repetitions", type=int, default=5)
    p.add_argument("--ranks", default="2,4,8")
    p.add_argument("--bytes", default="8,4194304")
    p.add_argument("--pin-ranks", action="store_true",
                   help="run tspemu's ranks pinned (rank i on core i mod cores)")
    p.add_argument("--no-torch", action="store_true", help="skip the reference vs PyTorch part")
    p.add_argument("--torch-rounds", type=int, default=2)
    a = p.parse_args()
    a.ranks = [int(x) for x in a.ranks.split(",")]
    a.bytes = [int(x) for x in a.bytes.split(",")]
    compare_collectives(a, bench_runs.load_average())
    if not a.no_torch:
        compare_torch(a)


if __name__ == "__main__":
    main()
