#!/usr/bin/env python3
"""Whether two JSON documents are equal once every key containing one of the given substrings is
dropped, at any depth (timings, and values that differ only by rounding). Exit 1 naming the first
top-level key that differs.

Usage: same_json.py A.json B.json SUBSTRING...
"""
import json
import sys


def strip(d, drop):
    if isinstance(d, dict):
        return {k: strip(v, drop) for k, v in d.items() if not any(s in k for s in drop)}
    if isinstance(d, list):
        return [strip(x, drop) for x in d]
    return d


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    drop = sys.argv[3:]
    a, b = (strip(json.load(open(p)), drop) for p in sys.argv[1:3])
    for k in sorted(set(a) | set(b)):
        if a.get(k) != b.get(k):
            sys.exit(f"{sys.argv[1]} and {sys.argv[2]} differ at {k!r} (keys with {drop} left out)")


if __name__ == "__main__":
    main()
