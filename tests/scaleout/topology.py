"""Process management of the scale-out topology: N zarrgate replicas behind nginx, all on 127.0.0.1.

Every process is started here with subprocess.Popen and stopped by its PID (Popen.send_signal),
never by name. The PIDs are also written to WORK/pids (one "PID KIND" a line), so that
tests/scaleout/run.sh can stop what a killed test process left behind.

Replicas write their stderr (JSON log lines; ZARRGATE_LOG=info gives one zarrgate::access line per
request) to WORK/replica-I.log, appended across restarts, so a byte offset taken before a phase
(Topology.mark) selects that phase's lines.
"""

from __future__ import annotations

import atexit
import http.client
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

HOST = "127.0.0.1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------------------------------------
# HTTP
# ---------------------------------------------------------------------------------------------


class Client:
    """One keep-alive HTTP/1.1 connection to HOST:port. A failed request is not retried: it
    raises (the caller counts it), and the next request opens a new connection."""

    def __init__(self, port: int, timeout: float = 10.0):
        self.port = port
        self.timeout = timeout
        self.conn: http.client.HTTPConnection | None = None

    def get(self, path: str, headers: dict | None = None, method: str = "GET"):
        """(status, headers with lower-case names, body)."""
        if self.conn is None:
            self.conn = http.client.HTTPConnection(HOST, self.port, timeout=self.timeout)
        try:
            self.conn.request(method, path, headers=headers or {})
            r = self.conn.getresponse()
            body = r.read()
            hdrs = {k.lower(): v for k, v in r.getheaders()}
            if r.will_close:
                self.close()
            return r.status, hdrs, body
        except BaseException:
            self.close()
            raise

    def close(self):
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def get(port: int, path: str, headers: dict | None = None, timeout: float = 10.0):
    """One request on a connection of its own: (status, headers, body)."""
    c = Client(port, timeout)
    try:
        return c.get(path, headers)
    finally:
        c.close()


def status_of(port: int, path: str, timeout: float = 2.0) -> int | None:
    """The status of GET path, or None when nothing answers."""
    try:
        return get(port, path, timeout=timeout)[0]
    except (OSError, http.client.HTTPException):
        return None


def wait_status(port: int, path: str, want: int, timeout: float, proc=None) -> bool:
    """Poll GET path until it answers `want` (True), the process `proc` exits, or timeout."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if status_of(port, path) == want:
            return True
        if proc is not None and proc.poll() is not None:
            return False
        time.sleep(0.05)
    return False


# ---------------------------------------------------------------------------------------------
# Process registry: every PID started here, for cleanup
# ---------------------------------------------------------------------------------------------


class Registry:
    def __init__(self, path: Path):
        self.path = path
        self.procs: dict[int, tuple[str, subprocess.Popen]] = {}
        self.lock = threading.Lock()

    def add(self, kind: str, proc: subprocess.Popen):
        with self.lock:
            self.procs[proc.pid] = (kind, proc)
            self._write()

    def forget(self, proc: subprocess.Popen):
        with self.lock:
            self.procs.pop(proc.pid, None)
            self._write()

    def _write(self):
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text("".join(f"{pid} {kind}\n" for pid, (kind, _) in self.procs.items()))
        tmp.replace(self.path)

    def stop_all(self):
        """Stop every process still registered: SIGINT (zarrgate: stop now, finish what is under
        way) / SIGQUIT (nginx: graceful), SIGKILL after 5 s."""
        with self.lock:
            procs = list(self.procs.values())
        for kind, p in procs:
            if p.poll() is None:
                try:
                    p.send_signal(signal.SIGQUIT if kind == "nginx" else signal.SIGINT)
                except ProcessLookupError:
                    pass
        for kind, p in procs:
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
            self.forget(p)


# ---------------------------------------------------------------------------------------------
# Replicas
# ---------------------------------------------------------------------------------------------


class Replica:
    def __init__(self, topo: "Topology", index: int, port: int):
        self.topo = topo
        self.index = index
        self.port = port
        self.name = f"replica-{index + 1}"
        self.config = topo.work / f"{self.name}.toml"
        self.log = topo.work / f"{self.name}.log"
        self.out = topo.work / f"{self.name}.out"
        self.proc: subprocess.Popen | None = None
        self.started_at = 0
        self.started_before = False

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_size(self) -> int:
        return self.log.stat().st_size if self.log.exists() else 0

    def start(self, timeout: float = 20.0):
        assert not self.alive(), f"{self.name} is running"
        env = {k: v for k, v in os.environ.items() if not k.startswith("ZARRGATE_")}
        env["ZARRGATE_LOG"] = "info"
        env["ZG_SIGNING_KEY"] = self.topo.signing_key
        self.started_at = self.log_size()
        with open(self.log, "ab") as err, open(self.out, "ab") as out:
            self.proc = subprocess.Popen(
                [self.topo.binary, "serve", "--config", str(self.config), "--bind", f"{HOST}:{self.port}"],
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,  # a Ctrl-C in the terminal reaches the test alone
            )
        self.topo.registry.add(self.name, self.proc)
        restarted = self.started_before
        self.started_before = True
        if not wait_status(self.port, "/healthz", 200, timeout, self.proc):
            rc = self.proc.poll()
            tail = self.log_tail(self.started_at)
            if rc is None:
                self.stop()
            raise RuntimeError(
                f"{self.name} did not come up on {HOST}:{self.port} (exit {rc}); its log:\n{tail}"
            )
        if restarted:
            # nginx may have marked it failed while it was down: until fail_timeout from now.
            self.topo.note_outage()

    def log_tail(self, since: int = 0, lines: int = 30) -> str:
        if not self.log.exists():
            return ""
        with open(self.log, "rb") as f:
            f.seek(since)
            text = f.read().decode(errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    def send(self, sig: int):
        assert self.alive(), f"{self.name} is not running"
        self.proc.send_signal(sig)

    def wait_exit(self, timeout: float) -> int | None:
        """The exit code, or None if still running after `timeout`."""
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        self.topo.registry.forget(self.proc)
        return rc

    def stop(self, sig: int = signal.SIGINT, timeout: float = 10.0) -> int | None:
        """Stop by PID (SIGINT: no readiness phase), SIGKILL past `timeout`. The exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        rc = self.wait_exit(timeout)
        if rc is None:
            self.proc.kill()
            rc = self.wait_exit(5)
        self.topo.registry.forget(self.proc)
        self.topo.note_outage()
        return rc

    def kill(self) -> int | None:
        return self.stop(signal.SIGKILL, 5)


# ---------------------------------------------------------------------------------------------
# nginx
# ---------------------------------------------------------------------------------------------

# Directives whose first argument is a path nginx writes to.
_WRITTEN_PATHS = {
    "pid", "error_log", "access_log", "lock_file", "proxy_cache_path", "fastcgi_cache_path",
    "uwsgi_cache_path", "scgi_cache_path", "client_body_temp_path", "proxy_temp_path",
    "fastcgi_temp_path", "uwsgi_temp_path", "scgi_temp_path",
}
_TEMP_PATHS = ["client_body_temp_path", "proxy_temp_path", "fastcgi_temp_path", "uwsgi_temp_path", "scgi_temp_path"]


def _seconds(value: str) -> float:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m|h)?", value)
    if not m:
        return 10.0
    n = float(m[1])
    return n * {"ms": 0.001, "s": 1, "m": 60, "h": 3600, None: 1}[m[2]]


def rewrite_nginx_conf(text: str, replica_ports: list[int] | None, prefix: Path):
    """The balancer's nginx.conf made to run here: each upstream `server HOST:PORT ...;` to
    127.0.0.1:<replica port> (in order; `replica_ports` None: only counted), each `listen` to a
    free port on 127.0.0.1 (IPv6 listens dropped), each absolute path nginx writes to moved under
    `prefix`, `user` and `resolver` dropped (upstreams are addresses here).

    Returns (conf text, {"servers": n, "listen": main port, "listens": {old: new},
    "fail_timeout": s, "daemon": bool, "pid": bool, "notes": [...]})."""
    out, info = [], {"servers": 0, "listen": None, "listens": {}, "fail_timeout": 10.0,
                     "daemon": False, "pid": False, "notes": []}
    depth, upstream_depth = 0, None
    temp_seen = set()

    def moved(path: str) -> str:
        if not path.startswith("/") or path.startswith("/dev/"):
            return path
        new = prefix / "fs" / path.lstrip("/")
        new.parent.mkdir(parents=True, exist_ok=True)
        return str(new)

    for line in text.splitlines():
        code = line.partition("#")[0]
        stripped = code.strip()
        m = re.match(r"(\w+)\s*(.*?)\s*;\s*$", stripped)
        name = m[1] if m else None
        args = m[2].split() if m else []
        new = line
        if name == "user" and depth == 0:
            new = "# (scaleout) " + line
        elif name == "resolver":
            new = "# (scaleout) " + line
        elif name == "daemon":
            info["daemon"] = True
            new = "daemon off;"
        elif name in _WRITTEN_PATHS and args and args[0] != "off":
            if name == "pid":
                info["pid"] = True
            if name in _TEMP_PATHS:
                temp_seen.add(name)
            args[0] = moved(args[0])
            new = f"{code[:len(code) - len(code.lstrip())]}{name} {' '.join(args)};"
        elif name == "listen" and args:
            addr = args[0]
            if addr.startswith("["):
                new = "# (scaleout, IPv6) " + line
            else:
                port = int(addr.rsplit(":", 1)[-1]) if addr.rsplit(":", 1)[-1].isdigit() else 80
                if port not in info["listens"]:
                    info["listens"][port] = free_port()
                args[0] = f"{HOST}:{info['listens'][port]}"
                args = [a for a in args if a not in ("ipv6only=on", "ipv6only=off")]
                new = f"{code[:len(code) - len(code.lstrip())]}listen {' '.join(args)};"
        elif name == "server" and upstream_depth is not None and depth == upstream_depth + 1:
            i = info["servers"]
            info["servers"] += 1
            if replica_ports is not None:
                if i >= len(replica_ports):
                    raise ValueError("the upstream lists more servers than replica ports given")
                params = [a for a in args[1:] if a != "resolve" and not a.startswith("service=")]
                for a in params:
                    if a.startswith("fail_timeout="):
                        info["fail_timeout"] = _seconds(a.split("=", 1)[1])
                new = f"{code[:len(code) - len(code.lstrip())]}server {HOST}:{replica_ports[i]} {' '.join(params)};"
        # Braces: nesting depth, and whether this line opens the upstream block.
        if re.match(r"upstream\s+\S+\s*\{", stripped):
            upstream_depth = depth
        depth += stripped.count("{") - stripped.count("}")
        if upstream_depth is not None and depth <= upstream_depth:
            upstream_depth = None
        if re.match(r"http\s*\{", stripped):
            # nginx's compiled-in temp paths are system directories: each one here instead.
            new = new + "\n" + "".join(f"    {{{t}}}\n" for t in _TEMP_PATHS)
        out.append(new)
    conf = "\n".join(out) + "\n"
    for t in _TEMP_PATHS:
        repl = "" if t in temp_seen else f"{t} {prefix / 'temp' / t.replace('_temp_path', '')};"
        conf = conf.replace("{" + t + "}", repl)
    (prefix / "temp").mkdir(parents=True, exist_ok=True)
    if info["listens"]:
        info["listen"] = info["listens"].get(8080) or next(iter(info["listens"].values()))
    if replica_ports is not None and info["servers"] != len(replica_ports):
        raise ValueError(f"the upstream lists {info['servers']} servers, not {len(replica_ports)}")
    if re.search(r"^\s*proxy_cache\s+(?!off)", conf, re.M):
        info["notes"].append("the conf caches responses (proxy_cache): replicas see fewer requests")
    return conf, info


def upstream_server_count(conf_path: Path) -> int:
    """How many `server` lines the conf's upstream block has."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        return rewrite_nginx_conf(conf_path.read_text(), None, Path(d))[1]["servers"]


def nginx_binary() -> str:
    return shutil.which("nginx") or "/usr/sbin/nginx"


class Nginx:
    def __init__(self, topo: "Topology", conf_src: Path):
        self.topo = topo
        self.prefix = topo.work / "nginx"
        self.prefix.mkdir(parents=True, exist_ok=True)
        for d in (topo.work, self.prefix):  # worker processes (nobody) write temp files below
            d.chmod(0o755)
        text, self.info = rewrite_nginx_conf(
            conf_src.read_text(), [r.port for r in topo.replicas], self.prefix
        )
        self.conf = self.prefix / "nginx.conf"
        self.conf.write_text(text)
        self.port = self.info["listen"]
        self.errlog = self.prefix / "error.log"
        self.proc: subprocess.Popen | None = None

    def args(self) -> list[str]:
        g = []
        if not self.info["daemon"]:
            g.append("daemon off;")
        if not self.info["pid"]:
            g.append(f"pid {self.prefix / 'nginx.pid'};")
        cmd = [nginx_binary(), "-p", f"{self.prefix}/", "-c", str(self.conf), "-e", str(self.errlog)]
        return cmd + (["-g", " ".join(g)] if g else [])

    def start(self):
        check = subprocess.run(self.args() + ["-t"], capture_output=True, text=True, timeout=30)
        if check.returncode != 0:
            raise RuntimeError(f"nginx -t failed for {self.conf}:\n{check.stderr}")
        with open(self.prefix / "stdout.log", "ab") as out, open(self.prefix / "stderr.log", "ab") as err:
            self.proc = subprocess.Popen(self.args(), stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
        self.topo.registry.add("nginx", self.proc)
        end = time.monotonic() + 15
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                break
            try:
                socket.create_connection((HOST, self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"nginx did not listen on {HOST}:{self.port}:\n"
                           + (self.prefix / "stderr.log").read_text(errors="replace")[-3000:]
                           + (self.errlog.read_text(errors="replace")[-3000:] if self.errlog.exists() else ""))

    def stop(self):
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGQUIT)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.topo.registry.forget(self.proc)


# ---------------------------------------------------------------------------------------------
# Access logs
# ---------------------------------------------------------------------------------------------


def access_lines(log: Path, since: int) -> list[dict]:
    """The zarrgate::access records of `log` after byte `since`, as dicts with at least method,
    path and status (int). JSON lines; a line that is not JSON (a text-format log, a line being
    written) is skipped."""
    if not log.exists():
        return []
    with open(log, "rb") as f:
        f.seek(since)
        data = f.read()
    out = []
    for raw in data.split(b"\n"):
        try:
            rec = json.loads(raw)
        except ValueError:
            continue
        if not isinstance(rec, dict):
            continue
        fields = rec.get("fields") if isinstance(rec.get("fields"), dict) else rec
        if rec.get("target") not in (None, "zarrgate::access") or "path" not in fields:
            continue
        try:
            status = int(fields.get("status"))
        except (TypeError, ValueError):
            status = None
        out.append({**fields, "status": status})
    return out


# ---------------------------------------------------------------------------------------------
# Load
# ---------------------------------------------------------------------------------------------


class Load:
    """`threads` threads reading `keys` ([(path, expected bytes)]) through HOST:port on keep-alive
    connections, at most `rate` requests a second in all, until stop(). Every answer must be 200
    and byte-exact; anything else (another status, other bytes, a connection error) is a
    failure, recorded with its time, path and what happened. No request is retried."""

    def __init__(self, port: int, keys: list[tuple[str, bytes]], threads: int = 8, rate: float = 300.0):
        self.port, self.keys, self.threads, self.rate = port, keys, threads, rate
        self.ok = 0
        self.failures: list[tuple[float, str, str]] = []
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.workers: list[threading.Thread] = []
        self.t0 = 0.0

    def _run(self, seed: int):
        rnd = random.Random(seed)
        interval = self.threads / self.rate
        client = Client(self.port, timeout=15)
        next_at = time.monotonic() + rnd.random() * interval
        ok = 0
        while not self.stopping.is_set():
            delay = next_at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            next_at = max(next_at + interval, time.monotonic() - interval)
            path, want = self.keys[rnd.randrange(len(self.keys))]
            try:
                status, _, body = client.get(path)
                if status != 200:
                    what = f"status {status}: {body[:200]!r}"
                elif body != want:
                    what = f"body of {len(body)} bytes differs from the file's {len(want)}"
                else:
                    ok += 1
                    continue
            except (OSError, http.client.HTTPException) as e:
                what = f"{type(e).__name__}: {e}"
            with self.lock:
                self.failures.append((round(time.monotonic() - self.t0, 3), path, what))
        client.close()
        with self.lock:
            self.ok += ok

    def start(self) -> "Load":
        self.t0 = time.monotonic()
        self.workers = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(self.threads)]
        for w in self.workers:
            w.start()
        return self

    def stop(self) -> "Load":
        self.stopping.set()
        for w in self.workers:
            w.join(30)
        self.seconds = time.monotonic() - self.t0
        return self

    def summary(self) -> str:
        return (f"{self.ok} ok, {len(self.failures)} failed in {self.seconds:.1f} s"
                + (f"; first failures: {self.failures[:5]}" if self.failures else ""))


# ---------------------------------------------------------------------------------------------
# The topology
# ---------------------------------------------------------------------------------------------


def _toml_str(s: str) -> str:
    return json.dumps(str(s))  # a TOML basic string is a JSON string for these characters


class Topology:
    """N replicas (N = the upstream servers of the nginx conf) and nginx in front of them.

    `mounts` ({name: {key: value}}) and `auth` (None or {"jwks": path, "issuer": ..,
    "audience": ..}) make each replica's config file (render_config); tests change them and call
    write_configs()."""

    def __init__(self, binary: str, conf_src: Path, work: Path, drain_seconds: float = 2.0):
        self.binary = binary
        self.conf_src = conf_src
        self.work = work
        self.drain_seconds = drain_seconds
        self.signing_key = "scaleout-" + os.urandom(16).hex()
        self.registry = Registry(work / "pids")
        atexit.register(self.registry.stop_all)
        n = upstream_server_count(conf_src)
        if n < 2:
            raise ValueError(f"{conf_src}: the upstream block lists {n} server(s); the test needs 2 or more")
        self.replicas = [Replica(self, i, free_port()) for i in range(n)]
        self.nginx = Nginx(self, conf_src)
        self.mounts: dict[str, dict] = {}
        self.auth: dict | None = None
        self.last_outage = 0.0

    # -- config ---------------------------------------------------------------------------

    def render_config(self) -> str:
        lines = [
            "# written by tests/scaleout/topology.py",
            "[server]",
            f"drain_seconds = {self.drain_seconds}",
            'log_format = "json"',
            "workers = 1",
            "",
        ]
        if self.auth:
            lines += [
                "[auth]",
                'url_signing_key = "env:ZG_SIGNING_KEY"',
                "",
                "[auth.jwt]",
                f"jwks = {_toml_str(self.auth['jwks'])}",
                f"issuer = {_toml_str(self.auth['issuer'])}",
                f"audience = {_toml_str(self.auth['audience'])}",
                "",
            ]
        for name, table in self.mounts.items():
            lines.append(f"[mounts.{name}]")
            for k, v in table.items():
                lines.append(f"{k} = " + (("true" if v else "false") if isinstance(v, bool) else _toml_str(v)))
            lines.append("")
        return "\n".join(lines)

    def write_configs(self, text: str | None = None):
        """Each replica's config file: `text`, or render_config(). Written whole, then renamed."""
        text = self.render_config() if text is None else text
        for r in self.replicas:
            tmp = r.config.with_suffix(".tmp")
            tmp.write_text(text)
            tmp.replace(r.config)

    # -- processes ------------------------------------------------------------------------

    def start(self):
        self.write_configs()
        for r in self.replicas:
            r.start()
        self.nginx.start()

    def stop(self):
        self.nginx.stop()
        for r in self.replicas:
            if r.alive():
                r.stop()
        self.registry.stop_all()

    def note_outage(self):
        self.last_outage = time.monotonic()

    def settle(self):
        """Wait until nginx may send to a replica it saw failing (max_fails/fail_timeout)."""
        left = self.last_outage + self.nginx.info["fail_timeout"] + 0.5 - time.monotonic()
        if left > 0:
            time.sleep(left)

    def ensure_healthy(self):
        """Every replica running with a valid config (restarted if a test left it stopped), nginx
        running, and nginx past the fail_timeout of any outage."""
        self.write_configs()
        for r in self.replicas:
            if not r.alive():
                r.start()
                self.note_outage()
        if self.nginx.proc is None or self.nginx.proc.poll() is not None:
            self.nginx.start()
        self.settle()

    def sighup_all(self):
        for r in self.replicas:
            r.send(signal.SIGHUP)

    # -- access logs ----------------------------------------------------------------------

    def mark(self) -> list[int]:
        return [r.log_size() for r in self.replicas]

    def access(self, mark: list[int]) -> list[list[dict]]:
        return [access_lines(r.log, m) for r, m in zip(self.replicas, mark)]

    def wait_access(self, mark: list[int], paths: set[str], count: int, timeout: float = 5.0):
        """The access records since `mark` per replica, once `count` of them are for `paths`
        (a record is written when its response is over, so it may come after the answer)."""
        end = time.monotonic() + timeout
        while True:
            recs = self.access(mark)
            n = sum(1 for rs in recs for rec in rs if rec["path"] in paths)
            if n >= count or time.monotonic() > end:
                return recs
            time.sleep(0.1)

    def attribute(self, keys: list[tuple[str, bytes]], reads: int = 1):
        """Read every key `reads` times through nginx (each must be 200 and byte-exact), then
        find who served it in the replicas' access logs.

        Returns (owner: {path: replica index or None}, counts: {path: [count per replica]},
        errors: [str])."""
        errors = []
        mark = self.mark()
        client = Client(self.nginx.port)
        for _ in range(reads):
            for path, want in keys:
                try:
                    status, _, body = client.get(path)
                except (OSError, http.client.HTTPException) as e:
                    errors.append(f"{path}: {type(e).__name__}: {e}")
                    continue
                if status != 200 or body != want:
                    errors.append(f"{path}: status {status}, {len(body)} bytes (want 200, {len(want)} bytes)")
        client.close()
        paths = {p for p, _ in keys}
        recs = self.wait_access(mark, paths, len(keys) * reads)
        counts = {p: [0] * len(self.replicas) for p in paths}
        for i, rs in enumerate(recs):
            for rec in rs:
                if rec["path"] in counts:
                    counts[rec["path"]][i] += 1
        owner = {}
        for p, cs in counts.items():
            serving = [i for i, c in enumerate(cs) if c]
            owner[p] = serving[0] if len(serving) == 1 else None
        return owner, counts, errors


def install_signal_handlers():
    """SIGTERM/SIGHUP to the test process (`timeout`, a closed terminal) interrupt it as Ctrl-C
    does: pytest stops, the fixtures' teardown and atexit stop the processes."""

    def bye(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")

    for s in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, bye)
