#!/usr/bin/env python3
"""Every relative link in README.md and docs/**/*.md resolves.

A link [text](target) or [text](target#anchor) outside code (fenced blocks, indented blocks,
inline code spans) must name a file or folder that exists, relative to the page that holds it,
and an anchor must be the GitHub slug of a heading of the target page (of the page itself for a
bare #anchor). Links with a scheme (https:, mailto:) are not checked.

Usage: docs_links.py [REPO_ROOT]   (default: two folders above this script). Exit 0 when every
link resolves, 1 listing each broken one as file:line: target (reason).
"""
import os
import re
import sys

LINK = re.compile(r"(?<!!)\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^()\s]+)\)")
FENCE = re.compile(r"^\s*(```|~~~)")


def prose_lines(path):
    """(line number, text) of the lines outside fenced and indented code blocks."""
    in_fence = False
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if FENCE.match(line):
                in_fence = not in_fence
                continue
            if in_fence or line.startswith("    ") or line.startswith("\t"):
                continue
            yield n, line.rstrip("\n")


def links(line):
    """The targets of the line's links that do not start inside an inline code span."""
    spans = [m.span() for m in re.finditer(r"`[^`]*`", line)]
    return [m.group(1) for m in LINK.finditer(line)
            if not any(a <= m.start() < b for a, b in spans)]


def slug(heading):
    s = heading.strip().lower()
    s = re.sub(r"`", "", s)
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def anchors(path):
    seen = {}
    out = set()
    for _, line in prose_lines(path):
        m = re.match(r"^(#{1,6})\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        base = slug(m.group(2))
        k = seen.get(base, 0)
        seen[base] = k + 1
        out.add(base if k == 0 else f"{base}-{k}")
    return out


def pages(root):
    yield os.path.join(root, "README.md")
    for dirpath, _, files in os.walk(os.path.join(root, "docs")):
        for name in sorted(files):
            if name.endswith(".md"):
                yield os.path.join(dirpath, name)


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                           os.path.join(os.path.dirname(__file__), "..", ".."))
    broken, checked = [], 0
    for page in pages(root):
        rel_page = os.path.relpath(page, root)
        for n, line in prose_lines(page):
            for target in links(line):
                if re.match(r"^[a-z][a-z0-9+.-]*:", target):
                    continue
                checked += 1
                path_part, _, anchor = target.partition("#")
                dest = os.path.normpath(os.path.join(os.path.dirname(page), path_part)) \
                    if path_part else page
                rel_dest = os.path.relpath(dest, root)
                where = f"{rel_page}:{n}: {target}"
                if not os.path.exists(dest):
                    broken.append(f"{where} (no such file: {rel_dest})")
                    continue
                if anchor:
                    if not dest.endswith(".md") or os.path.isdir(dest):
                        broken.append(f"{where} (anchor on a page that is not markdown)")
                    elif anchor not in anchors(dest):
                        broken.append(f"{where} (no heading with anchor #{anchor} in {rel_dest})")
    for b in broken:
        print(b)
    print(f"{checked} relative links checked, {len(broken)} broken")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
