#!/usr/bin/env python3
"""Runs runtime_bench and checks the issue 2 section 6 targets against same-run medians.

Usage:
  bench/report_runtime.py [--bench PATH] [--repetitions N] [--targets-only] [--json FILE]
                          [--keep FILE] [-- extra runtime_bench args]

--json FILE reads an existing runtime_bench JSON output (made with --benchmark_repetitions and
--benchmark_report_aggregates_only=true) instead of running the benchmark; --keep FILE saves the
JSON of a fresh run. Exit status: 0 when every target passes, 1 otherwise.

Targets (ratios of medians from one run):
  1. 8-byte all_gather at 2 ranks <= 4x the two-thread cache-line ping-pong round trip
  2. broadcast and all_gather algbw at 1-4 MiB per rank, 2 ranks, >= 0.8x single-thread memcpy
  3. 8-byte all_gather at 8 ranks (2 cores) <= 5x the same-core sched_yield round trip
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import resource

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_BENCH = os.path.join(HERE, "..", "build", "bench", "runtime_bench")
MIB = 1 << 20
BW_SIZES = [1 * MIB, 2 * MIB, 4 * MIB]
TARGETS_FILTER = ("^(pingpong|yield_pingpong|memcpy/bytes:(1048576|2097152|4194304)"
                  "|memcpy_pair/bytes:(1048576|2097152|4194304)"
                  "|coll/(all_gather|all_gather_inplace|broadcast)/ranks:2/bytes:(8|1048576|2097152|4194304)"
                  "|coll/all_gather/ranks:8/bytes:8)/")


def base_name(run_name):
    """'coll/all_gather/ranks:2/bytes:8/iterations:1/manual_time' -> 'coll/all_gather/ranks:2/bytes:8'."""
    parts = [p for p in run_name.split("/")
             if not p.startswith(("iterations:", "min_time:", "repeats:"))
             and p not in ("manual_time", "real_time")]
    return "/".join(parts)


def to_us(value, unit):
    return value * {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}[unit]


def load_medians(data):
    """Median entry per benchmark; falls back to the mean of plain runs without aggregates."""
    medians, plain = {}, {}
    for b in data["benchmarks"]:
        name = base_name(b.get("run_name", b["name"]))
        if b.get("run_type") == "aggregate":
            if b.get("aggregate_name") == "median":
                medians[name] = b
        else:
            plain.setdefault(name, []).append(b)
    for name, runs in plain.items():
        if name not in medians:
            runs = sorted(runs, key=lambda r: r["real_time"])
            medians[name] = runs[len(runs) // 2]
    return medians


def cpu_busy_seconds():
    """Busy CPU seconds of the whole machine so far (all cores), from /proc/stat."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except OSError:
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def run_bench(bench, reps, extra, keep):
    out = keep or tempfile.mktemp(suffix=".json")
    cmd = [bench, "--benchmark_repetitions=%d" % reps,
           "--benchmark_report_aggregates_only=true",
           "--benchmark_out=" + out, "--benchmark_out_format=json"] + extra
    print("running:", " ".join(cmd), file=sys.stderr)
    busy0, t0 = cpu_busy_seconds(), time.monotonic()
    child0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    child1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    busy1, t1 = cpu_busy_seconds(), time.monotonic()
    if busy0 is not None:
        ours = (child1.ru_utime + child1.ru_stime) - (child0.ru_utime + child0.ru_stime)
        others = max(0.0, (busy1 - busy0) - ours) / (t1 - t0)
        print("run took %.0f s; other processes kept %.2f of %d cores busy meanwhile%s"
              % (t1 - t0, others, os.cpu_count(),
                 " (noisy: expect worse ratios)" if others > 0.2 else ""))
    with open(out) as f:
        data = json.load(f)
    if not keep:
        os.unlink(out)
    return data


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--bench", default=DEFAULT_BENCH)
    ap.add_argument("--repetitions", type=int, default=5)
    ap.add_argument("--json", help="read this runtime_bench JSON instead of running")
    ap.add_argument("--keep", help="save the JSON of the run here")
    ap.add_argument("--targets-only", action="store_true",
                    help="run only the benchmarks the targets use (~30 s, less exposed to load "
                         "changes on a shared machine)")
    ap.add_argument("extra", nargs="*", help="extra runtime_bench arguments (after --)")
    a = ap.parse_args()

    if a.json:
        with open(a.json) as f:
            data = json.load(f)
    else:
        extra = list(a.extra)
        if a.targets_only:
            extra.append("--benchmark_filter=" + TARGETS_FILTER)
        data = run_bench(a.bench, a.repetitions, extra, a.keep)
    med = load_medians(data)

    def lat_us(name):
        b = med.get(name)
        if b is None:
            return None
        return to_us(b["real_time"], b.get("time_unit", "ns"))

    def algbw(name):
        b = med.get(name)
        return None if b is None else b.get("algbw")

    fails = 0

    def check(label, value, limit, ok, detail):
        nonlocal fails
        if value is None:
            print("  MISSING %-58s (benchmarks not in the output)" % label)
            fails += 1
            return
        verdict = "PASS" if ok(value, limit) else "FAIL"
        fails += verdict == "FAIL"
        print("  %s %-58s %6.2f (limit %s)  %s" % (verdict, label, value, limit, detail))

    pp = lat_us("pingpong")
    yp = lat_us("yield_pingpong")
    print("Baselines (medians): ping-pong round trip %s us, same-core yield round trip %s us"
          % (fmt(pp), fmt(yp)))
    for n in (2, 4, 8):
        print("  World::run round trip, %d ranks: %s us" % (n, fmt(lat_us("world_run/ranks:%d" % n))))

    print("\nKey medians (latency us / algbw GB/s / busbw GB/s / allocs per call):")
    kinds = ["broadcast", "all_gather", "all_gather_inplace", "reduce_scatter", "all_reduce", "reduce", "all_to_all",
             "sendrecv"]
    for n in (2, 4, 8):
        for k in kinds:
            row = []
            for s in (8, 1 * MIB, 4 * MIB, 16 * MIB):
                b = med.get("coll/%s/ranks:%d/bytes:%d" % (k, n, s))
                if b is None:
                    row.append("-")
                    continue
                row.append("%s: %s us %s/%s GB/s a=%g" % (
                    size_name(s), fmt(to_us(b["real_time"], b["time_unit"])),
                    fmt(b.get("algbw", 0) / 1e9), fmt(b.get("busbw", 0) / 1e9),
                    b.get("allocs_per_iter", float("nan"))))
            print("  n=%d %-18s %s" % (n, k, " | ".join(row)))
        b = med.get("coll/barrier/ranks:%d/bytes:0" % n)
        if b is not None:
            print("  n=%d %-15s %s us" % (n, "barrier", fmt(to_us(b["real_time"], b["time_unit"]))))
    for s in (8, 1 * MIB, 4 * MIB, 16 * MIB):
        bw = algbw("memcpy/bytes:%d" % s)
        print("  memcpy %-8s %s us %s GB/s" % (size_name(s), fmt(lat_us("memcpy/bytes:%d" % s)),
                                              fmt(None if bw is None else bw / 1e9)))

    print("\nTargets:")
    ag2 = lat_us("coll/all_gather/ranks:2/bytes:8")
    check("all_gather 8 B, 2 ranks / ping-pong round trip", ratio(ag2, pp), 4.0,
          lambda v, l: v <= l, "(%s us / %s us)" % (fmt(ag2), fmt(pp)))
    for k in ("broadcast", "all_gather"):
        for s in BW_SIZES:
            c = algbw("coll/%s/ranks:2/bytes:%d" % (k, s))
            m = algbw("memcpy/bytes:%d" % s)
            check("%s algbw %s, 2 ranks / memcpy algbw" % (k, size_name(s)), ratio(c, m), 0.8,
                  lambda v, l: v >= l,
                  "(%s / %s GB/s)" % (fmt(None if c is None else c / 1e9),
                                      fmt(None if m is None else m / 1e9)))
    for s in BW_SIZES:
        c = algbw("coll/all_gather_inplace/ranks:2/bytes:%d" % s)
        p = algbw("memcpy_pair/bytes:%d" % s)
        m = algbw("memcpy/bytes:%d" % s)
        print("  info all_gather %s, 2 ranks: in-place algbw / memcpy %s; out-of-place copy "
              "pattern without any waiting (memcpy_pair) / memcpy %s" % (
                  size_name(s), fmt(ratio(c, m)), fmt(ratio(p, m))))
    ag8 = lat_us("coll/all_gather/ranks:8/bytes:8")
    check("all_gather 8 B, 8 ranks / same-core yield round trip", ratio(ag8, yp), 5.0,
          lambda v, l: v <= l, "(%s us / %s us)" % (fmt(ag8), fmt(yp)))

    allocs = [(n, b["allocs_per_iter"]) for n, b in med.items()
              if n.startswith("coll/") and b.get("allocs_per_iter", 0) > 0]
    if allocs:
        print("\nNote: median allocations per call > 0 in: " +
              ", ".join("%s (%g)" % x for x in sorted(allocs)))
    print("\n%s" % ("ALL TARGETS PASS" if fails == 0 else "%d TARGET(S) FAIL" % fails))
    return 0 if fails == 0 else 1


def ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b


def fmt(x):
    if x is None:
        return "n/a"
    return "%.3g" % x


def size_name(s):
    if s >= MIB:
        return "%dMiB" % (s // MIB)
    if s >= 1024:
        return "%dKiB" % (s // 1024)
    return "%dB" % s


if __name__ == "__main__":
    sys.exit(main())
