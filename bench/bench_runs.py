"""Running benchmark programs and pooling their samples, for the same-session comparison scripts
(compare_builds.py, compare_openmpi.py).

A sample is one repetition's time of one benchmark in microseconds (runtime_bench reports the
median batch time per call of each repetition). Programs are run in alternation, round after
round, so a burst of load from the other users of the machine hits every program alike; a
benchmark's number is the median of all its samples.
"""
import json
import os
import statistics
import subprocess
import sys

# The collectives and sizes of the runtime targets (issues 12 and 18): 8 B and 4 MiB per rank.
KINDS = ["broadcast", "all_gather", "all_reduce", "reduce_scatter", "sendrecv"]
RANKS = [2, 4, 8]
SIZES = [8, 4 << 20]


def target_filter(kinds=KINDS, ranks=RANKS, sizes=SIZES):
    """A --benchmark_filter regex for coll/<kind>/ranks:<n>/bytes:<s> over the given lists."""
    return "^coll/({})/ranks:({})/bytes:({})(/|$)".format(
        "|".join(kinds), "|".join(map(str, ranks)), "|".join(map(str, sizes)))


def run_google_benchmark(binary, bench_filter, repetitions, extra=()):
    """Runs a Google Benchmark program once; returns {name: [microseconds per repetition]}."""
    cmd = [binary, "--benchmark_filter=" + bench_filter,
           "--benchmark_repetitions={}".format(repetitions), "--benchmark_format=json",
           *extra]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    samples = {}
    for b in json.loads(out)["benchmarks"]:
        if b.get("run_type", "iteration") != "iteration":
            continue
        scale = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}[b.get("time_unit", "ns")]
        samples.setdefault(base_name(b["run_name"]), []).append(b["real_time"] * scale)
    return samples


def base_name(run_name):
    """The registered name: Google Benchmark appends options (/iterations:1/repeats:5/manual_time)."""
    return "/".join(p for p in run_name.split("/")
                    if not p.startswith(("iterations:", "repeats:", "min_time:", "manual_time",
                                         "real_time")))


def merge(into, samples):
    for name, values in samples.items():
        into.setdefault(name, []).extend(values)


def medians(samples):
    return {name: statistics.median(v) for name, v in samples.items()}


def load_average():
    one, five, fifteen = os.getloadavg()
    return "load average {:.2f} {:.2f} {:.2f} on {} cores".format(one, five, fifteen,
                                                                  os.cpu_count())


def sort_key(name):
    """coll/<kind>/ranks:<n>/bytes:<s> in kind, size, ranks order."""
    parts = name.split("/")
    if len(parts) != 4:
        return (name,)
    kind = KINDS.index(parts[1]) if parts[1] in KINDS else len(KINDS)
    return (kind, int(parts[3].split(":")[1]), int(parts[2].split(":")[1]))


def log(*args):
    print(*args, file=sys.stderr, flush=True)
