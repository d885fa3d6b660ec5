#!/usr/bin/env python3
"""Attributes perf samples to the code that caused them.

    perf script -i perf.data --no-inline | python3 bench/perf_callers.py SYMBOL [FRAME_REGEX]

For every sample whose stack contains SYMBOL (e.g. a kernel function such as
asm_exc_page_fault or finish_task_switch, or a libc one such as __memset), counts the innermost
stack frame matching FRAME_REGEX (default: zarrgate, tokio blocking/fs, object_store, hyper,
codec crates). Prints percentages of all samples. Standard library only.
"""

import collections
import re
import sys

DEFAULT = r"zarrgate::|tokio::fs|tokio::runtime::blocking|object_store|hyper::|zstd::|flate2|bytes::|moka::|axum::|decode::main"


def main():
    mark = sys.argv[1]
    pat = re.compile(sys.argv[2] if len(sys.argv) > 2 else DEFAULT)
    counts = collections.Counter()
    total = hits = 0
    stack = []

    def flush():
        nonlocal total, hits
        if not stack:
            return
        total += 1
        if not any(mark in s for s in stack):
            return
        hits += 1
        for s in stack:
            name = re.sub(r"^\s*[0-9a-f]+\s+", "", s)
            name = re.sub(r"\+0x[0-9a-f]+", "", name)
            name = re.sub(r"\s+\([^()]*\)$", "", name)
            if pat.search(name):
                counts[name[:160]] += 1
                return
        counts["(other)"] += 1

    for line in sys.stdin:
        if not line.strip():
            flush()
            stack = []
        elif line[0] in " \t":
            stack.append(line.strip())
    flush()
    print(f"{mark}: {hits} of {total} samples ({100 * hits / max(total, 1):.1f}%), by innermost matching frame:")
    for name, n in counts.most_common(8):
        print(f"  {100 * n / max(total, 1):5.1f}%  {name}")


if __name__ == "__main__":
    main()
