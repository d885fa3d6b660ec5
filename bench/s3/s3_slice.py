"""One-chunk slice of a sharded array on S3 (moto on 127.0.0.1): zarrgate with the shard index
cold and warm, next to zarr-python (obstore S3Store) reading the same slice from the same bucket,
in the same run. Upstream requests are counted from moto's own request log.

Run through bench/s3/run.sh, which installs the venvs and builds the binary.
"""
import re
import os
import pathlib
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

import numpy as np
import obstore.store
import zarr
import zarr.storage

RUNS = int(os.environ.get("RUNS", "5"))
BUCKET = "bench"
SHAPE, SHARD, INNER = (4096, 4096), (2048, 2048), (256, 256)
ONE = (slice(0, 256), slice(0, 256))
OTHER = (slice(256, 512), slice(0, 256))


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def wait(port, seconds=30):
    end = time.time() + seconds
    while time.time() < end:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port}")


class Moto:
    def __init__(self, moto_bin):
        self.port = free_port()
        self.log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
        self.proc = subprocess.Popen([moto_bin, "-H", "127.0.0.1", "-p", str(self.port)], stdout=self.log, stderr=self.log)
        wait(self.port)
        self.url = f"http://127.0.0.1:{self.port}"

    def requests(self):
        """Object requests seen so far (moto logs one line per request, colour-coded)."""
        time.sleep(0.3)  # let the server's log catch up
        text = re.sub(r"\x1b\[[0-9;]*m", "", pathlib.Path(self.log.name).read_text())
        return sum(1 for line in text.splitlines() if re.search(rf'"(GET|HEAD) /{BUCKET}/', line))

    def stop(self):
        self.proc.terminate()
        self.proc.wait()


def s3_store(moto):
    return obstore.store.S3Store(
        BUCKET,
        endpoint=moto.url,
        region="us-east-1",
        access_key_id="testing",
        secret_access_key="testing",
        client_options={"allow_http": True},
    )


def fill_bucket(moto):
    urllib.request.urlopen(urllib.request.Request(f"{moto.url}/{BUCKET}", method="PUT")).read()
    store = zarr.storage.ObjectStore(s3_store(moto))
    arr = zarr.create_array(store, name="a", shape=SHAPE, shards=SHARD, chunks=INNER, dtype="float32",
                            compressors=zarr.codecs.ZstdCodec(level=1), fill_value=0)
    y, x = np.mgrid[0:SHAPE[0], 0:SHAPE[1]]
    arr[...] = (np.sin(y / 97.0) * np.cos(x / 61.0)).astype("float32")
    return arr[ONE], arr[OTHER]


class Zarrgate:
    def __init__(self, binary, moto):
        self.port = free_port()
        self.cfg = tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False)
        self.cfg.write(f"""[mounts.s3]
url = "s3://{BUCKET}"
endpoint = "{moto.url}"
region = "us-east-1"
allow_http = true
""")
        self.cfg.close()
        env = dict(os.environ, AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", ZARRGATE_LOG="warn")
        self.proc = subprocess.Popen([binary, "serve", "--config", self.cfg.name, "--bind", f"127.0.0.1:{self.port}"],
                                     env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait(self.port)

    def slice(self, sel):
        (a, b), (c, d) = [(s.start, s.stop) for s in sel]
        url = f"http://127.0.0.1:{self.port}/api/v1/slice/s3/a?select={a}:{b},{c}:{d}&format=bin"
        t = time.perf_counter()
        body = urllib.request.urlopen(url).read()
        return time.perf_counter() - t, np.frombuffer(body, dtype="<f4").reshape(b - a, d - c)

    def stop(self):
        self.proc.terminate()
        self.proc.wait()


def measure(moto, fn):
    before = moto.requests()
    seconds, value = fn()
    return seconds, moto.requests() - before, value


def summary(xs):
    return f"{min(xs)*1e3:.2f} / {statistics.median(xs)*1e3:.2f} / {max(xs)*1e3:.2f}"


def main():
    binary, moto_bin, out = sys.argv[1], sys.argv[2], pathlib.Path(sys.argv[3])
    moto = Moto(moto_bin)
    try:
        want_one, want_other = fill_bucket(moto)
        rows = {k: ([], []) for k in ["zarrgate cold (metadata, index, chunk)", "zarrgate index warm (other inner chunk)",
                                       "zarrgate fully warm (same slice)", "zarr-python + obstore, fresh open"]}
        for _ in range(RUNS):
            zg = Zarrgate(binary, moto)
            try:
                for name, sel, want in [("zarrgate cold (metadata, index, chunk)", ONE, want_one),
                                        ("zarrgate index warm (other inner chunk)", OTHER, want_other),
                                        ("zarrgate fully warm (same slice)", ONE, want_one)]:
                    s, n, got = measure(moto, lambda: zg.slice(sel))
                    assert np.array_equal(got, want), name
                    rows[name][0].append(s)
                    rows[name][1].append(n)
            finally:
                zg.stop()

            def zp():
                t = time.perf_counter()
                arr = zarr.open_array(zarr.storage.ObjectStore(s3_store(moto), read_only=True), path="a", mode="r")
                v = arr[ONE]
                return time.perf_counter() - t, v
            s, n, got = measure(moto, zp)
            assert np.array_equal(got, want_one)
            rows["zarr-python + obstore, fresh open"][0].append(s)
            rows["zarr-python + obstore, fresh open"][1].append(n)
        lines = [
            "# One-chunk slice of a sharded array on S3 (moto, 127.0.0.1)",
            "",
            f"Array: float32 {SHAPE[0]}x{SHAPE[1]}, shards {SHARD[0]}x{SHARD[1]}, inner chunks {INNER[0]}x{INNER[1]} (zstd); "
            f"the slice is one inner chunk (256 KiB). {RUNS} runs; zarrgate restarted for every cold run. "
            f"zarr {zarr.__version__}, obstore {obstore.__version__}.",
            "",
            "| reader | time ms (min / median / max) | upstream requests (median) |",
            "|---|---|---|",
        ]
        for name, (times, counts) in rows.items():
            lines.append(f"| {name} | {summary(times)} | {statistics.median(counts):g} |")
        cold = statistics.median(rows["zarrgate cold (metadata, index, chunk)"][0])
        zp = statistics.median(rows["zarr-python + obstore, fresh open"][0])
        lines += ["", f"zarrgate cold / zarr-python: {cold / zp:.2f}x the time."]
        out.write_text("\n".join(lines) + "\n")
        print("\n".join(lines))
    finally:
        moto.stop()


if __name__ == "__main__":
    main()
