"""Helper of bench/capacity.sh (issue #49, "Capacity on paper"). Subcommands:

  data DIR                  the raw-key arrays and the fleet's working set (stdlib only;
                            deterministic, kept while DIR/STAMP matches)
  tiles DIR                 the zstd uint16 array of the viewer tiles (needs zarr-python: run it
                            with the interop venv's python)
  fill MOTO_URL BUCKET DIR  upload DIR/raw and DIR/ws to the bucket (unsigned PUTs, as moto takes)
  fleet BIN MOTO_URL MOTO_LOG BUCKET DIR OUT.json
                            the fleet's cache: N = 1, 2, 3 replicas behind deploy's nginx conf
                            (tests/scaleout/topology.py), each with a small raw cache, reading
                            the working set from the bucket; how many requests reached it
  report TSV META FLEET.json    results-capacity.md on stdout

Everything listens on 127.0.0.1; every process is started and stopped by its PID (the fleet by
topology.py's registry).
"""

from __future__ import annotations

import json
import os
import random
import re
import statistics
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
STAMP = "capacity-data-v1"

# Raw keys: 1-D uint8 arrays whose chunk files are exactly the size named (no codec).
RAW = {"c16k.zarr": (16 << 10, 256), "c1m.zarr": (1 << 20, 64)}
# The fleet's working set: 1,280 objects of 64 KiB = 80 MiB, against raw caches of 32 MiB.
WS_CHUNK, WS_COUNT = 64 << 10, 1280
FLEET_RAW_BYTES = 32 << 20
ZIPF_S = 1.0
FLEET_THREADS = 4
FLEET_WARM = int(os.environ.get("CAP_FLEET_WARM", "2000"))
FLEET_MEASURE = int(os.environ.get("CAP_FLEET_REQUESTS", "6000"))


def v3_bytes_array(path: Path, chunk: int, count: int, seed: int):
    path.mkdir(parents=True, exist_ok=True)
    meta = {
        "zarr_format": 3,
        "node_type": "array",
        "shape": [chunk * count],
        "data_type": "uint8",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [chunk]}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": 0,
        "codecs": [{"name": "bytes"}],
        "attributes": {},
    }
    (path / "zarr.json").write_text(json.dumps(meta, indent=2))
    (path / "c").mkdir(exist_ok=True)
    rnd = random.Random(seed)
    for i in range(count):
        (path / "c" / str(i)).write_bytes(rnd.randbytes(chunk))


def cmd_data(root: str):
    root = Path(root)
    if (root / "STAMP").exists() and (root / "STAMP").read_text().strip() == STAMP:
        return
    for n, (name, (chunk, count)) in enumerate(RAW.items()):
        v3_bytes_array(root / "raw" / name, chunk, count, seed=n + 1)
    v3_bytes_array(root / "ws" / "ws.zarr", WS_CHUNK, WS_COUNT, seed=49)
    (root / "STAMP").write_text(STAMP + "\n")


def cmd_tiles(root: str):
    """4096x4096 uint16, chunks 512x512 (512 KiB decoded), zstd level 3: a smooth field plus
    noise (zstd takes a chunk to about 1/1.9 of its size). Writes the expected bytes of the tile
    0:256,0:256 beside it."""
    import numpy as np
    import zarr
    from zarr.codecs import ZstdCodec

    root = Path(root)
    path = root / "tiles" / "tiles.zarr"
    ref = root / "tiles" / "tile_0_0.bin"
    if ref.exists() and (root / "tiles" / "STAMP").exists():
        return
    y = np.arange(4096, dtype=np.float32)[:, None]
    x = np.arange(4096, dtype=np.float32)[None, :]
    base = 1000 + 400 * np.sin(y / 97.0) * np.cos(x / 131.0)
    noise = np.random.default_rng(49).normal(0, 4, (4096, 4096))
    data = np.clip(base + noise, 0, 65535).astype(np.uint16)
    arr = zarr.create_array(
        store=zarr.storage.LocalStore(str(path)),
        shape=data.shape,
        chunks=(512, 512),
        dtype="uint16",
        compressors=ZstdCodec(level=3),
        fill_value=0,
        overwrite=True,
    )
    arr[...] = data
    ref.write_bytes(data[0:256, 0:256].astype("<u2").tobytes())
    (root / "tiles" / "STAMP").write_text(STAMP + "\n")


# ---------------------------------------------------------------------------------------------
# The bucket (moto)
# ---------------------------------------------------------------------------------------------


def put(url: str, body: bytes | None = None):
    req = urllib.request.Request(url, data=body, method="PUT")
    # urllib's default for a body, form-urlencoded, makes moto read it as a form: a 400 after 60 s
    req.add_header("Content-Type", "application/octet-stream")
    with urllib.request.urlopen(req, timeout=60) as r:
        r.read()
        if r.status // 100 != 2:
            raise RuntimeError(f"PUT {url}: {r.status}")


def cmd_fill(moto: str, bucket: str, root: str):
    root = Path(root)
    try:
        put(f"{moto}/{bucket}")
    except urllib.error.HTTPError as e:  # already there (a second fill)
        if e.code != 409:
            raise
    files = [p for sub in ("raw", "ws") for p in sorted((root / sub).rglob("*")) if p.is_file()]
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda p: put(f"{moto}/{bucket}/{p.relative_to(root).as_posix()}", p.read_bytes()), files))
    print(f"{len(files)} objects, {sum(p.stat().st_size for p in files) >> 20} MiB", file=sys.stderr)


def moto_gets(log: Path, prefix: str) -> int:
    """GETs of keys under /prefix in moto's request log (one line a request)."""
    time.sleep(0.3)  # the log line follows the response
    text = re.sub(r"\x1b\[[0-9;]*m", "", log.read_text(errors="replace"))
    return len(re.findall(rf'"GET /{re.escape(prefix)}', text))


# ---------------------------------------------------------------------------------------------
# The fleet: tests/scaleout/topology.py, with 1 to 3 replicas
# ---------------------------------------------------------------------------------------------

sys.path.insert(0, str(REPO / "tests" / "scaleout"))


def lb_conf(n: int, out: Path) -> Path:
    """deploy/nginx/zarrgate-lb.conf with its upstream's server lines made n of the same kind."""
    text = (REPO / "deploy" / "nginx" / "zarrgate-lb.conf").read_text()
    lines = text.splitlines()
    servers = [i for i, l in enumerate(lines) if re.match(r"\s*server\s+zarrgate-\d+:", l)]
    assert servers == list(range(servers[0], servers[0] + len(servers))), "server lines not together"
    template = lines[servers[0]]
    new = [re.sub(r"zarrgate-\d+:", f"zarrgate-{i + 1}:", template) for i in range(n)]
    lines[servers[0] : servers[-1] + 1] = new
    out.write_text("\n".join(lines) + "\n")
    return out


def metrics(port: int) -> dict[str, float]:
    import topology

    status, _, body = topology.get(port, "/metrics")
    assert status == 200, f"/metrics: {status}"
    out = {}
    for line in body.decode().splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name, _, value = line.rpartition(" ")
        try:
            out[name] = float(value)
        except ValueError:
            pass
    return out


def fleet_counts(topo, mount: str) -> dict:
    """Sums over the replicas: upstream requests of `mount` by kind, raw-cache hits and misses,
    and each replica's raw-key requests."""
    c = {"upstream": {}, "raw_hits": 0.0, "raw_misses": 0.0, "per_replica": []}
    for r in topo.replicas:
        m = metrics(r.port)
        for k, v in m.items():
            g = re.fullmatch(r'zarrgate_upstream_requests_total\{mount="([^"]+)",kind="(\w+)"\}', k)
            if g and g[1] == mount:
                c["upstream"][g[2]] = c["upstream"].get(g[2], 0) + v
        c["raw_hits"] += m.get('zarrgate_cache_hits_total{cache="raw"}', 0)
        c["raw_misses"] += m.get('zarrgate_cache_misses_total{cache="raw"}', 0)
        c["per_replica"].append(sum(v for k, v in m.items()
                                    if k.startswith("zarrgate_requests_total{") and 'route="raw"' in k))
    return c


def drive(port: int, paths: list[str], expected: dict[str, bytes]) -> int:
    """GET every path of `paths` through port on FLEET_THREADS keep-alive connections (thread t
    takes paths t, t + T, ...); every answer must be 200 and byte-exact. Errors."""
    import topology

    errors = []

    def run(t):
        c = topology.Client(port, timeout=30)
        for p in paths[t::FLEET_THREADS]:
            try:
                status, _, body = c.get(p)
                if status != 200 or body != expected[p]:
                    errors.append(f"{p}: {status}, {len(body)} bytes")
            except Exception as e:  # noqa: BLE001 (counted, reported)
                errors.append(f"{p}: {type(e).__name__}: {e}")
        c.close()

    threads = [threading.Thread(target=run, args=(t,)) for t in range(FLEET_THREADS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if errors:
        print(f"fleet: {len(errors)} errors, first: {errors[:3]}", file=sys.stderr)
    return len(errors)


def cmd_fleet(binary: str, moto: str, moto_log: str, bucket: str, root: str, out: str):
    import tempfile

    import topology

    class Fleet(topology.Topology):
        """topology.Topology for 1 replica or more (its constructor asks for 2, the least a
        scale-out test needs), with a [cache] table of its own in each replica's config."""

        def __init__(self, binary, conf_src, work, cache_toml):
            self.binary, self.conf_src, self.work = binary, conf_src, work
            self.drain_seconds = 1.0
            self.signing_key = "capacity-" + os.urandom(16).hex()
            self.registry = topology.Registry(work / "pids")
            import atexit

            atexit.register(self.registry.stop_all)
            n = topology.upstream_server_count(conf_src)
            self.replicas = [topology.Replica(self, i, topology.free_port()) for i in range(n)]
            self.nginx = topology.Nginx(self, conf_src)
            self.mounts, self.auth, self.last_outage = {}, None, 0.0
            self.cache_toml = cache_toml

        def render_config(self):
            return super().render_config() + "\n" + self.cache_toml

    root = Path(root)
    keys = [f"/zarr/ws/ws.zarr/c/{i}" for i in range(WS_COUNT)]
    expected = {k: (root / "ws" / "ws.zarr" / "c" / k.rsplit("/", 1)[1]).read_bytes() for k in keys}
    rnd = random.Random(4949)
    # Zipf over the keys: rank r has weight 1 / r^s; ranks shuffled over the keys, so that hot
    # keys fall on every replica's share of the ring.
    ranked = keys[:]
    rnd.shuffle(ranked)
    cum, acc = [], 0.0
    for r in range(1, len(ranked) + 1):
        acc += 1.0 / r**ZIPF_S
        cum.append(acc)
    hot_share = {n: cum[n - 1] / acc for n in (64, 512)}

    phases = []
    results = {
        "working_set_objects": WS_COUNT,
        "object_bytes": WS_CHUNK,
        "raw_bytes_per_replica": FLEET_RAW_BYTES,
        "zipf_s": ZIPF_S,
        "zipf_top512_share": hot_share[512],
        "warm_requests": FLEET_WARM,
        "measured_requests": FLEET_MEASURE,
        "threads": FLEET_THREADS,
        "runs": [],
    }
    cache_toml = (f"[cache]\nraw_bytes = {FLEET_RAW_BYTES}\nraw_object_max = 1048576\n")
    for n in (1, 2, 3):
        # under capacity.sh's work directory (CAP_WORK): replica logs, nginx's conf and logs
        work = Path(tempfile.mkdtemp(prefix=f"fleet{n}.", dir=os.environ.get("CAP_WORK", "/tmp")))
        work.chmod(0o755)
        conf = lb_conf(n, work / "zarrgate-lb.conf")
        topo = Fleet(binary, conf, work, cache_toml)
        topo.mounts = {"ws": {"url": f"s3://{bucket}/ws", "endpoint": moto, "region": "us-east-1",
                              "allow_http": True, "immutable": True,
                              "cache_control": "public, max-age=31536000, immutable"}}
        t0 = time.monotonic()
        topo.start()
        try:
            port = topo.nginx.port
            plan = [("fill", False, rnd.sample(keys, len(keys)))]
            plan.append(("uniform_warm", False, rnd.choices(keys, k=FLEET_WARM)))
            plan.append(("uniform", True, rnd.choices(keys, k=FLEET_MEASURE)))
            plan.append(("zipf_warm", False, rnd.choices(ranked, cum_weights=cum, k=FLEET_WARM)))
            plan.append(("zipf", True, rnd.choices(ranked, cum_weights=cum, k=FLEET_MEASURE)))
            for name, _measured, paths in plan:
                before = fleet_counts(topo, "ws")
                mg0 = moto_gets(Path(moto_log), f"{bucket}/ws/")
                ts = time.monotonic()
                errors = drive(port, paths, expected)
                secs = time.monotonic() - ts
                after = fleet_counts(topo, "ws")
                mg1 = moto_gets(Path(moto_log), f"{bucket}/ws/")
                up = {k: after["upstream"].get(k, 0) - before["upstream"].get(k, 0) for k in after["upstream"]}
                hits = after["raw_hits"] - before["raw_hits"]
                misses = after["raw_misses"] - before["raw_misses"]
                per = [a - b for a, b in zip(after["per_replica"], before["per_replica"])]
                row = {
                    "replicas": n,
                    "phase": name,
                    "requests": len(paths),
                    "distinct": len(set(paths)),
                    "errors": errors,
                    "seconds": round(secs, 2),
                    "upstream_by_kind": {k: int(v) for k, v in up.items() if v},
                    "upstream": int(sum(up.values())),
                    "moto_gets": mg1 - mg0,
                    "bucket_fraction": sum(up.values()) / len(paths),
                    "raw_hit_ratio": hits / (hits + misses) if hits + misses else None,
                    "per_replica_requests": [int(p) for p in per],
                }
                results["runs"].append(row)
                print(f"fleet N={n} {name}: {row['requests']} requests, {row['upstream']} upstream "
                      f"({row['bucket_fraction']:.3f}), moto {row['moto_gets']}, {secs:.1f} s, "
                      f"per replica {row['per_replica_requests']}", file=sys.stderr)
            results.setdefault("cache_weighted_bytes", {})[n] = [
                metrics(r.port).get('zarrgate_cache_weighted_bytes{cache="raw"}', 0) for r in topo.replicas]
        finally:
            topo.stop()
        results.setdefault("fleet_seconds", {})[n] = round(time.monotonic() - t0, 1)
    Path(out).write_text(json.dumps(results, indent=1))


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------


def mmm(vals, fmt="{:.0f}"):
    if not vals:
        return "-"
    s = sorted(vals)
    med = statistics.median(s)
    if len(s) == 1:
        return fmt.format(med)
    return f"{fmt.format(med)} ({fmt.format(s[0])}-{fmt.format(s[-1])})"


def cmd_report(tsv: str, meta: str, fleet: str):
    rows = [l.rstrip("\n").split("\t") for l in open(tsv) if l.strip()]
    meta = dict(l.rstrip("\n").split("\t", 1) for l in open(meta) if "\t" in l)
    vals: dict[tuple[str, str], list[float]] = {}
    for case, server, metric, value in rows:
        vals.setdefault((case, server, metric), []).append(float(value))
    fl = json.loads(Path(fleet).read_text()) if fleet and Path(fleet).exists() else None
    w = print
    w("# Capacity figures (issue #49, item 6)")
    w()
    w(f"Written by `bench/capacity.sh` on {meta.get('date')}; zarrgate: {meta.get('zarrgate_rev')}; "
      f"{meta.get('machine_cpu')}, {meta.get('machine_mem')}, {meta.get('machine_kernel')}; "
      f"{meta.get('nginx')}, {meta.get('wrk')}, moto {meta.get('moto')}. Load average before the run: "
      f"{meta.get('loadavg_before')}; after: {meta.get('loadavg_after')}. Run time {meta.get('total_seconds')} s.")
    w()
    w("What it measures and how to read it: [capacity.sh](capacity.sh) (header). The reasoning "
      "built on these figures: [docs/operations.md](../docs/operations.md#capacity).")
    w()
    w(f"## One core: raw keys and tiles ({meta.get('runs')} runs of {meta.get('load_seconds')} s each, medians (min-max))")
    w()
    w("The server under test pinned to core 0 (`taskset -c 0`; zarrgate `server.workers = 1`, "
      "nginx `worker_processes 1`), wrk pinned to core 1 (1 thread, 64 keep-alive connections, "
      "keys round-robin). CPU = the server's user + system time over the run's wall time "
      "(100% = the whole core); core 0 idle = the share of the run core 0 was idle (all processes); "
      "wrk CPU = wrk's user + system time over the run's wall time, on core 1. "
      "Ratio = zarrgate / nginx requests/s, per run pair (interleaved), "
      "median (min-max).")
    w()
    w("| case | body | zarrgate req/s | zarrgate MiB/s | zarrgate CPU | core 0 idle | wrk CPU | req per CPU-s | nginx req/s | nginx CPU | ratio |")
    w("|---|---|---|---|---|---|---|---|---|---|---|")
    cases = [
        ("raw_16k_local", "16 KiB raw key, local directory (page cache)", 16 << 10),
        ("raw_1m_local", "1 MiB raw key, local directory (page cache)", 1 << 20),
        ("raw_16k_s3", "16 KiB raw key, S3 mount (moto), raw cache warm", 16 << 10),
        ("raw_1m_s3", "1 MiB raw key, S3 mount (moto), raw cache warm", 1 << 20),
        ("tile_aligned", "256x256 uint16 slice, zstd 512² chunks, in 1 chunk, decoded chunks cached", 128 << 10),
        ("tile_4chunks", "256x256 uint16 slice, zstd 512² chunks, across 4 chunks, cached", 128 << 10),
    ]
    for case, label, size in cases:
        zr = vals.get((case, "zarrgate", "rps"), [])
        if not zr:
            continue
        zc = vals.get((case, "zarrgate", "cpu"), [])
        nr = vals.get((case, "nginx", "rps"), [])
        nc = vals.get((case, "nginx", "cpu"), [])
        ratios = [a / b for a, b in zip(zr, nr) if b]
        per_cpu = [r / c for r, c in zip(zr, zc) if c > 0]
        errs = sum(vals.get((case, "zarrgate", "errors"), [])) + sum(vals.get((case, "nginx", "errors"), []))
        w(f"| {label}{' (**%d errors**)' % errs if errs else ''} | {size >> 10} KiB | {mmm(zr)} | "
          f"{mmm([r * size / 2**20 for r in zr])} | {mmm([c * 100 for c in zc], '{:.0f}%')} | "
          f"{mmm([c * 100 for c in vals.get((case, 'zarrgate', 'core0_idle'), [])], '{:.0f}%')} | "
          f"{mmm([c * 100 for c in vals.get((case, 'zarrgate', 'wrk_cpu'), [])], '{:.0f}%')} | "
          f"{mmm(per_cpu)} | {mmm(nr)} | {mmm([c * 100 for c in nc], '{:.0f}%')} | "
          f"{mmm(ratios, '{:.2f}')} |")
    up = vals.get(("raw_s3", "zarrgate", "upstream_during_load"), [])
    if up:
        w()
        w(f"Upstream requests during the S3-mount load runs: {int(sum(up))} (every answer from the raw cache).")
    w()
    w("nginx serves the same files for the raw keys (sendfile) and, for the tiles, a static file "
      "of the tile's 128 KiB: the least work a server can do to send those bytes.")
    if fl:
        w()
        w("## The fleet's cache: requests that reach the bucket, N = 1, 2, 3 replicas")
        w()
        w(f"{fl['working_set_objects']} objects of {fl['object_bytes'] >> 10} KiB "
          f"({fl['working_set_objects'] * fl['object_bytes'] >> 20} MiB) in an S3 bucket (moto), an "
          f"`immutable` mount; each replica `cache.raw_bytes = {fl['raw_bytes_per_replica'] >> 20} MiB`; "
          "the replicas behind deploy/nginx/zarrgate-lb.conf (`hash $request_uri consistent`) via "
          f"tests/scaleout/topology.py, fresh for each N; {fl['threads']} client connections through "
          f"nginx, every answer checked byte for byte. Phases in order: `fill` (each key once), then "
          f"{fl['warm_requests']} warm-up and {fl['measured_requests']} measured requests drawn "
          f"uniformly, then the same drawn from a Zipf law (s = {fl['zipf_s']}, ranks shuffled over the keys; "
          f"the 512 hottest keys, one replica's cache, take {fl['zipf_top512_share']:.0%} of requests). "
          "Bucket fraction = upstream requests (all kinds, summed over the replicas' "
          "`zarrgate_upstream_requests_total`) / requests; moto GETs are counted in moto's own log.")
        w()
        w("| N | phase | requests | bucket requests | bucket fraction | moto GETs | raw-cache hit ratio | requests per replica | errors |")
        w("|---|---|---|---|---|---|---|---|---|")
        for r in fl["runs"]:
            if r["phase"].endswith("_warm"):
                continue
            hr = "-" if r["raw_hit_ratio"] is None else f"{r['raw_hit_ratio']:.3f}"
            w(f"| {r['replicas']} | {r['phase']} | {r['requests']} | {r['upstream']} "
              f"({', '.join(f'{k} {v}' for k, v in r['upstream_by_kind'].items()) or '-'}) | "
              f"**{r['bucket_fraction']:.3f}** | {r['moto_gets']} | {hr} | "
              f"{' / '.join(str(p) for p in r['per_replica_requests'])} | {r['errors']} |")
        cw = fl.get("cache_weighted_bytes", {})
        if cw:
            w()
            w("Raw cache held at the end (MiB per replica): " + "; ".join(
                f"N = {n}: " + " / ".join(f"{b / 2**20:.1f}" for b in v) for n, v in cw.items()) + ".")
    w()
    notes = [(k, v) for k, v in meta.items() if k.startswith("note_")]
    if notes:
        w("## Notes")
        w()
        for k, v in notes:
            w(f"- {v}")


def main():
    cmd, args = sys.argv[1], sys.argv[2:]
    {"data": cmd_data, "tiles": cmd_tiles, "fill": cmd_fill, "fleet": cmd_fleet, "report": cmd_report}[cmd](*args)


if __name__ == "__main__":
    main()
