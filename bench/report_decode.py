#!/usr/bin/python3
"""The decode-step figures of issue 36 (deliverable 8), from one run of this script.

Usage: bench/report_decode.py [--build DIR] [--rounds R] [--no-tspw]

1. The reference decode step (DIR/bench/reference_bench, BM_DecodeStep: one fp32 Llama layer,
   C=1024, NH=NKV=16, F=2816, B=1, a cache of 2048 positions; 5 repetitions of 10 steps) against
   Debian's PyTorch doing the same KV-cached step on 1 thread (/usr/bin/python3
   bench/torch_decode_bench.py, 5 x 10 steps), the two programs alternated for R rounds so a burst
   of load from the machine's other users hits both alike. Each round gives the two medians and
   their ratio; the reported ratio is the median of the rounds' ratios. Target: ours / torch <= 0.7.
2. The same benchmark's memory-traffic bound: the bytes a step must read (weights + the cache)
   over the memcpy bandwidth measured in the same process (counters bound_ms, x_bound = step time /
   bound; reference_bench.cpp says how). No target: it is reported.
3. TSP-W decode at D = 4 against the reference decode of the same batch (DIR/bench/tsp_bench,
   BM_TspwDecodeStep/D:4: both timed in every iteration; x_reference = TSP-W / reference). No
   target on 2 cores: 4 rank threads share them.

Every figure is printed with the BLAS kernel that produced it and the load average before and
after. Build DIR with -DTSPEMU_BUILD_BENCH=ON (targets reference_bench, tsp_bench).
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys

import bench_runs

HERE = os.path.dirname(os.path.abspath(__file__))
TARGET = 0.7


def medians_of(binary, bench_filter):
    """{benchmark: its median aggregate (dict)} and the blas context of one run of `binary`."""
    out = subprocess.run([binary, "--benchmark_format=json", "--benchmark_filter=" + bench_filter],
                         check=True, capture_output=True, text=True).stdout
    doc = json.loads(out)
    got = {}
    for b in doc["benchmarks"]:
        if b.get("aggregate_name") == "median":
            got[bench_runs.base_name(b["run_name"])] = b
    return got, doc["context"].get("blas", "?")


def run_torch():
    """Median ms per step of bench/torch_decode_bench.py, and torch's version line."""
    out = subprocess.run(["/usr/bin/python3", os.path.join(HERE, "torch_decode_bench.py")],
                         check=True, capture_output=True, text=True).stdout
    m = re.search(r"median ([0-9.]+) ms", out)
    if not m:
        sys.exit("report_decode: no median in torch_decode_bench.py's output:\n" + out)
    return float(m.group(1)), out.split(":")[0].strip()


def binary(build, name):
    path = os.path.join(build, "bench", name)
    if not os.access(path, os.X_OK):
        sys.exit("report_decode: {} not found (build with -DTSPEMU_BUILD_BENCH=ON)".format(path))
    return path


def reference_vs_torch(a):
    ref = binary(a.build, "reference_bench")
    rounds, kernel, torch_name = [], "?", "torch"
    for r in range(a.rounds):
        pair = {}
        for which in (["ours", "torch"] if r % 2 == 0 else ["torch", "ours"]):
            bench_runs.log("round {}/{}: {}".format(r + 1, a.rounds, which))
            if which == "torch":
                pair["torch"], torch_name = run_torch()
            else:
                got, kernel = medians_of(ref, "^BM_DecodeStep")
                pair["ours"] = got["BM_DecodeStep"]
        rounds.append(pair)
    print("reference decode step (C=1024, NH=NKV=16, F=2816, B=1, S=2048, fp32, 1 thread) vs {}, "
          "{} rounds alternated; medians of 5 repetitions".format(torch_name, a.rounds))
    print("tspemu blas: {}".format(kernel))
    print("{:<7}{:>11}{:>11}{:>12}{:>11}{:>10}{:>13}".format(
        "round", "torch ms", "ours ms", "ours/torch", "bound ms", "x_bound", "memcpy GB/s"))
    ratios, x_bounds = [], []
    for i, p in enumerate(rounds):
        o = p["ours"]
        ratios.append(o["real_time"] / p["torch"])
        x_bounds.append(o["x_bound"])
        print("{:<7}{:>11.2f}{:>11.2f}{:>12.3f}{:>11.2f}{:>10.2f}{:>13.1f}".format(
            i + 1, p["torch"], o["real_time"], ratios[-1], o["bound_ms"], o["x_bound"],
            o["memcpy_GB/s"]))
    ratio = statistics.median(ratios)
    print("ours / torch, median of the rounds: {:.3f} (target <= {}) {}".format(
        ratio, TARGET, "PASS" if ratio <= TARGET else "FAIL"))
    print("step / memory-traffic bound ({:.1f} MB per step), median of the rounds: {:.2f}".format(
        rounds[0]["ours"]["bytes/step"] / 1e6, statistics.median(x_bounds)))
    return ratio <= TARGET


def tspw_vs_reference(a):
    got, kernel = medians_of(binary(a.build, "tsp_bench"), "^BM_TspwDecodeStep/D:4")
    b = got["BM_TspwDecodeStep/D:4"]
    print()
    print("TSP-W decode step at D = 4 (C=512, NH=8, NKV=4, F=1408, L=2, V=512, B=4, 256 cached "
          "positions, fp32) vs the reference decode step, timed in the same iterations; medians "
          "of 5 repetitions")
    print("tspemu blas: {}".format(kernel))
    print("TSP-W {:.2f} ms, reference {:.2f} ms, TSP-W / reference {:.3f}".format(
        b["real_time"], b["reference_ms"], b["x_reference"]))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build", default=os.path.join(HERE, "..", "build"))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--no-tspw", action="store_true", help="skip the TSP-W part")
    a = p.parse_args()
    print(bench_runs.load_average())
    ok = reference_vs_torch(a)
    if not a.no_tspw:
        tspw_vs_reference(a)
    print("after: {}".format(bench_runs.load_average()))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
