#!/usr/bin/python3
"""Same-session comparison of runtime_bench binaries (e.g. before and after a change).

Usage: bench/compare_builds.py BEFORE AFTER [MORE ...] [--rounds R] [--repetitions N]
                               [--filter REGEX] [--pin-ranks]

Runs the binaries in alternation, R rounds of N repetitions each (each round in the reverse order
of the previous one), and prints per benchmark the median over all samples of each binary and
its ratio to the first (BEFORE), with the load average before and after. The default filter is
the runtime target: broadcast, all_gather, all_reduce, reduce_scatter and sendrecv at 2, 4 and 8
ranks, 8 B and 4 MiB per rank. Build the binaries with the same build type (RelWithDebInfo).
"""
import argparse
import os

import bench_runs


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("binaries", nargs="+", help="runtime_bench programs; the first is the baseline")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--repetitions", type=int, default=5)
    p.add_argument("--filter", default=bench_runs.target_filter())
    p.add_argument("--pin-ranks", action="store_true",
                   help="pass --pin_ranks (rank i on core i mod cores) to every binary")
    a = p.parse_args()
    if len(a.binaries) < 2:
        p.error("give at least two binaries")
    load_before = bench_runs.load_average()
    samples = [{} for _ in a.binaries]
    order = list(range(len(a.binaries)))
    for r in range(a.rounds):
        for i in order:
            bench_runs.log("round {}/{}: {}".format(r + 1, a.rounds, a.binaries[i]))
            bench_runs.merge(samples[i], bench_runs.run_google_benchmark(
                a.binaries[i], a.filter, a.repetitions, ["--pin_ranks"] if a.pin_ranks else []))
        order.reverse()
    meds = [bench_runs.medians(s) for s in samples]
    print("same session, {} rounds x {} repetitions per binary{}, medians in us".format(
        a.rounds, a.repetitions, ", ranks pinned" if a.pin_ranks else ""))
    print("{}; after: {}".format(load_before, bench_runs.load_average()))
    for i, b in enumerate(a.binaries):
        print("  [{}] {}".format(i, os.path.relpath(b)))
    names = set(meds[0])
    for m in meds[1:]:
        names &= set(m)
    head = "{:<40}".format("benchmark") + "".join("{:>11}".format("[{}]".format(i))
                                                  for i in range(len(meds)))
    print(head + "".join("{:>10}".format("[{}]/[0]".format(i)) for i in range(1, len(meds))))
    for name in sorted(names, key=bench_runs.sort_key):
        row = "{:<40}".format(name) + "".join("{:>11.3f}".format(m[name]) for m in meds)
        print(row + "".join("{:>10.3f}".format(m[name] / meds[0][name]) for m in meds[1:]))


if __name__ == "__main__":
    main()
