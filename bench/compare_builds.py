#!/usr/bin/python3
"""Same-session comparison of runtime_bench binaries (e.g. before and after a change).

Usage: bench/compare_builds.py BEFORE AFTER [MORE ...] [--rounds R] [--repetitions N]
                               [--filter REGEX] [--pin-ranks] [--per-case]

Runs the binaries in alternation, R rounds of N repetitions each (each round in the reverse order
of the previous one), and prints per benchmark the median over all samples of each binary and
its ratio to the first (BEFORE), with the load average before and after. The default filter is
the runtime target: broadcast, all_gather, all_reduce, reduce_scatter and sendrecv at 2, 4 and 8
ranks, 8 B and 4 MiB per rank. Build the binaries with the same build type (RelWithDebInfo).

--per-case alternates the binaries on each benchmark separately (one process per benchmark,
binary and round, ~0.3 s each), so the samples of a pair are seconds apart rather than a whole
suite apart: a machine whose speed drifts over minutes (other tenants of a shared host) shifts
both alike. It also prints, per benchmark, the median and quartiles of the per-round ratios
(each round's median of AFTER over BEFORE's), whose spread says how far the verdict can be
trusted.
"""
import argparse
import os
import re
import statistics
import subprocess

import bench_runs


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("binaries", nargs="+", help="runtime_bench programs; the first is the baseline")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--repetitions", type=int, default=5)
    p.add_argument("--filter", default=bench_runs.target_filter())
    p.add_argument("--pin-ranks", action="store_true",
                   help="pass --pin_ranks (rank i on core i mod cores) to every binary")
    p.add_argument("--per-case", action="store_true",
                   help="alternate the binaries on each benchmark separately (see above)")
    a = p.parse_args()
    if len(a.binaries) < 2:
        p.error("give at least two binaries")
    extra = ["--pin_ranks"] if a.pin_ranks else []
    load_before = bench_runs.load_average()
    samples = [{} for _ in a.binaries]
    # rounds[i][name]: binary i's per-round medians, for the paired ratios of --per-case.
    rounds = [{} for _ in a.binaries]
    order = list(range(len(a.binaries)))
    cases = [a.filter] if not a.per_case else [
        "^" + re.escape(name) + "(/|$)" for name in listed(a.binaries[0], a.filter)]
    for r in range(a.rounds):
        bench_runs.log("round {}/{}".format(r + 1, a.rounds))
        for case in cases:
            for i in order:
                got = bench_runs.run_google_benchmark(a.binaries[i], case, a.repetitions, extra)
                bench_runs.merge(samples[i], got)
                for name, values in got.items():
                    rounds[i].setdefault(name, []).append(statistics.median(values))
            order.reverse()
        if not a.per_case:
            order.reverse()
    meds = [bench_runs.medians(s) for s in samples]
    print("same session, {} rounds x {} repetitions per binary{}{}, medians in us".format(
        a.rounds, a.repetitions, ", alternating per benchmark" if a.per_case else "",
        ", ranks pinned" if a.pin_ranks else ""))
    print("{}; after: {}".format(load_before, bench_runs.load_average()))
    for i, b in enumerate(a.binaries):
        print("  [{}] {}".format(i, os.path.relpath(b)))
    names = set(meds[0])
    for m in meds[1:]:
        names &= set(m)
    head = "{:<40}".format("benchmark") + "".join("{:>11}".format("[{}]".format(i))
                                                  for i in range(len(meds)))
    paired = "".join("{:>22}".format("rounds [{}]/[0]".format(i)) for i in range(1, len(meds)))
    print(head + "".join("{:>10}".format("[{}]/[0]".format(i)) for i in range(1, len(meds))) +
          (paired if a.per_case else ""))
    for name in sorted(names, key=bench_runs.sort_key):
        row = "{:<40}".format(name) + "".join("{:>11.3f}".format(m[name]) for m in meds)
        row += "".join("{:>10.3f}".format(m[name] / meds[0][name]) for m in meds[1:])
        if a.per_case:
            for i in range(1, len(meds)):
                ratios = [x / y for x, y in zip(rounds[i][name], rounds[0][name])]
                q1, q2, q3 = quartiles(ratios)
                row += "{:>22}".format("{:.3f} ({:.2f}-{:.2f})".format(q2, q1, q3))
        print(row)


def listed(binary, bench_filter):
    """The benchmark names (without Google Benchmark's option suffixes) the filter selects."""
    out = subprocess.run([binary, "--benchmark_list_tests", "--benchmark_filter=" + bench_filter],
                         check=True, capture_output=True, text=True).stdout
    names = []
    for line in out.split():
        name = bench_runs.base_name(line)
        if name not in names:
            names.append(name)
    return names


def quartiles(values):
    """(first quartile, median, third quartile); all three the value itself for one value."""
    if len(values) < 2:
        return values[0], values[0], values[0]
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[0], statistics.median(values), q[2]


if __name__ == "__main__":
    main()
