#!/usr/bin/env python3
"""Summarizes one load/run.sh run and checks it: python3 load/summarize.py WORK CACHE_MB ALIVE
WRK_FAILED. Prints the summary (markdown tables, ready for load/README.md) and exits 1 when a
check fails. Thresholds come from the environment that run.sh exports."""
import glob
import json
import os
import re
import sys


def main():
    work, cache_mb, alive, wrk_failed = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1", sys.argv[4] == "1"
    warmup = float(os.environ.get("LOAD_WARMUP", "15"))
    headroom = int(os.environ.get("LOAD_RSS_HEADROOM_MB", "128"))
    drift_max = int(os.environ.get("LOAD_RSS_DRIFT_MB", "64"))
    expected_log = os.environ.get("LOAD_EXPECTED_LOG", "")
    failures = []

    results = []
    for path in sorted(glob.glob(os.path.join(work, "wrk-*.txt"))):
        text = open(path).read()
        m = re.search(r"^LOAD_RESULT (.*)$", text, re.M)
        if not m:
            failures.append(f"{os.path.basename(path)}: no result (wrk failed?)\n{text[-2000:]}")
            continue
        results.append(json.loads(m.group(1)))

    # Requests and latencies per kind.
    print("\n### Requests\n")
    print("| kind | requests | req/s | p50 ms | p90 ms | p99 ms | max ms | status codes | socket errors |")
    print("|---|---|---|---|---|---|---|---|---|")
    total_req, total_status, total_errors, seconds = 0, {}, {}, 0.0
    for r in results:
        secs = r["duration_us"] / 1e6
        seconds = max(seconds, secs)
        lat = r["latency_us"]
        codes = ", ".join(f"{k}: {v}" for k, v in sorted(r["status"].items()))
        errs = {k: v for k, v in r["errors"].items() if k != "status" and v}
        print(
            f"| {r['kind']} | {r['requests']} | {r['requests'] / secs:.0f} | {lat['p50'] / 1000:.1f} | "
            f"{lat['p90'] / 1000:.1f} | {lat['p99'] / 1000:.1f} | {lat['max'] / 1000:.0f} | {codes} | "
            f"{', '.join(f'{k}: {v}' for k, v in errs.items()) or '0'} |"
        )
        total_req += r["requests"]
        for k, v in r["status"].items():
            total_status[k] = total_status.get(k, 0) + v
        for k, v in errs.items():
            total_errors[k] = total_errors.get(k, 0) + v
    if results:
        codes = ", ".join(f"{k}: {v}" for k, v in sorted(total_status.items()))
        print(f"| **all** | {total_req} | {total_req / seconds:.0f} | | | | | {codes} | "
              f"{', '.join(f'{k}: {v}' for k, v in total_errors.items()) or '0'} |")
    fivexx = {k: v for k, v in total_status.items() if k.startswith("5")}
    if fivexx:
        failures.append(f"5xx responses under load: {fivexx}")
    if total_errors:
        failures.append(f"socket errors or timeouts: {total_errors}")
    if wrk_failed:
        failures.append("a wrk process failed")

    # Preflight: every URL once.
    pre = {}
    for line in open(os.path.join(work, "preflight.txt")):
        code, path = line.split(" ", 1)
        pre.setdefault(code, []).append(path.strip())
    print("\n### Preflight (each URL once)\n")
    for code in sorted(pre):
        paths = pre[code]
        shown = "" if code.startswith("2") else ": " + ", ".join(paths[:6]) + (" ..." if len(paths) > 6 else "")
        print(f"- {code}: {len(paths)}{shown}")
        if code.startswith("5") or code == "000":
            failures.append(f"preflight {code}: {paths[:10]}")

    # RSS.
    start = float(open(os.path.join(work, "load_start")).read())
    end = float(open(os.path.join(work, "load_end")).read())
    samples, threads = [], []
    for line in open(os.path.join(work, "rss.txt")):
        parts = line.split()
        if len(parts) < 2:
            continue
        samples.append((float(parts[0]) - start, int(parts[1]) / 1024))
        if len(parts) > 2:
            threads.append(int(parts[2]))
    during = [(t, mb) for t, mb in samples if 0 <= t <= end - start]
    print("\n### Server RSS (MiB)\n")
    if during:
        length = end - start
        first = [mb for t, mb in during if warmup <= t < warmup + 10]
        last = [mb for t, mb in during if t >= length - 10]
        before = [mb for t, mb in samples if t < 0]
        peak = max(mb for _, mb in samples)
        mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")
        drift = mean(last) - mean(first)
        limit = cache_mb + headroom
        print(f"- before load: {before[-1] if before else during[0][1]:.0f}")
        print(f"- first 10 s after {warmup:.0f} s warm-up (mean): {mean(first):.0f}")
        print(f"- last 10 s (mean): {mean(last):.0f} (drift {drift:+.0f}, allowed {drift_max})")
        print(f"- end of load: {during[-1][1]:.0f}; peak: {peak:.0f} (allowed {limit} = cache {cache_mb} + {headroom})")
        if threads:
            print(f"- server threads: {threads[0]} before load, peak {max(threads)}")
        print("- per 5 s: " + " ".join(f"{mb:.0f}" for t, mb in during[::5]))
        if peak > limit:
            failures.append(f"RSS peak {peak:.0f} MiB > {limit} MiB")
        if not (drift <= drift_max):
            failures.append(f"RSS drift {drift:+.0f} MiB > {drift_max} MiB")
    else:
        failures.append("no RSS samples during the load")
    if not alive:
        failures.append("the server died during the load")

    # Cache statistics from /metrics.
    metrics = open(os.path.join(work, "metrics.txt")).read() if os.path.exists(os.path.join(work, "metrics.txt")) else ""
    stats = {}
    for m in re.finditer(r'^(zarrgate_cache_(?:hits_total|misses_total|evictions_total|weighted_bytes|entries))\{cache="([^"]+)"\} (\S+)', metrics, re.M):
        stats.setdefault(m.group(2), {})[m.group(1).replace("zarrgate_cache_", "")] = float(m.group(3))
    if stats:
        print("\n### Caches at the end\n")
        for name, s in sorted(stats.items()):
            print(f"- {name}: " + ", ".join(f"{k} {v:.0f}" for k, v in sorted(s.items())))

    # Server log.
    log = open(os.path.join(work, "server.log"), errors="replace").read().splitlines()
    bad = [l for l in log if re.search(r"\b(WARN|ERROR)\b", l)]
    unexpected = [l for l in bad if not (expected_log and re.search(expected_log, l))]
    print(f"\n### Server log: {len(bad)} WARN/ERROR lines, {len(unexpected)} unexpected\n")
    for l in unexpected[:10]:
        print("    " + l[:300])
    if unexpected:
        failures.append(f"{len(unexpected)} unexpected WARN/ERROR lines in the server log")

    print()
    if failures:
        print("LOAD TEST FAILED:")
        for f in failures:
            print(" - " + f)
        return 1
    print("LOAD TEST PASSED")
    return 0


if __name__ == "__main__":
    sys.exit(main())
