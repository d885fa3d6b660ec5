"""The scale-out topology of issue #49: three zarrgate replicas behind nginx's consistent hash
(deploy/nginx/zarrgate-lb.conf), as processes on 127.0.0.1.

Environment: ZARRGATE_BIN (the binary, required), ZARRGATE_LB_CONF (the nginx conf; default
deploy/nginx/zarrgate-lb.conf), ZARRGATE_SCALEOUT_WORK (a directory for configs, logs and data;
default a temporary one). tests/scaleout/run.sh sets them.

The tests run in file order and share one topology; each starts by restoring it (every replica
running with a valid config, nginx past the fail_timeout of any outage).
"""

from __future__ import annotations

import collections
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import topology  # noqa: E402
from topology import Client, Load, Topology, get, wait_status  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "data"
DRAIN = 2.0
LOAD_THREADS = 8
LOAD_RATE = 300.0  # requests a second, all threads together

topology.install_signal_handlers()


# ---------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------


def fixture_keys(n: int = 190) -> list[tuple[str, bytes]]:
    """n files of tests/fixtures/data, evenly spread over their sizes, as (/zarr/fx/KEY, bytes)."""
    files = sorted((p.stat().st_size, p.relative_to(FIXTURES).as_posix()) for p in FIXTURES.rglob("*") if p.is_file())
    files = [f for f in files if re.fullmatch(r"[A-Za-z0-9._/-]+", f[1])]
    step = len(files) / n
    picked = [files[int(i * step)][1] for i in range(n)] if len(files) > n else [f[1] for f in files]
    return [(f"/zarr/fx/{k}", (FIXTURES / k).read_bytes()) for k in picked]


def write_files(root: Path, sizes: dict[str, int], seed: int) -> None:
    rnd = random.Random(seed)
    for key, size in sizes.items():
        p = root / key
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(rnd.randbytes(size))


def mount_keys(mount: str, root: Path) -> list[tuple[str, bytes]]:
    return [(f"/zarr/{mount}/{p.relative_to(root).as_posix()}", p.read_bytes())
            for p in sorted(root.rglob("*")) if p.is_file()]


# Larger bodies than the fixtures have: nginx buffers some of them to its temp files.
BIG_SIZES = {f"blob/{n}.bin": n for n in (4096, 65_535, 65_537, 200_000, 1 << 20, 3 * (1 << 20) + 7)}
BIG_SIZES.update({f"blob/deep/x{i}/y.bin": 10_000 * (i + 1) for i in range(4)})
ADDED_SIZES = {f"new/k{i:02d}": 50 + 97 * i for i in range(30)}


# ---------------------------------------------------------------------------------------------
# Fixtures
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def work():
    given = os.environ.get("ZARRGATE_SCALEOUT_WORK")
    if given:
        path = Path(given)
        path.mkdir(parents=True, exist_ok=True)
        yield path
    else:
        path = Path(tempfile.mkdtemp(prefix="zarrgate-scaleout."))
        yield path
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def topo(work):
    binary = os.environ.get("ZARRGATE_BIN")
    if not binary or not os.access(binary, os.X_OK):
        pytest.fail(f"ZARRGATE_BIN must name the zarrgate binary (is {binary!r})")
    conf = Path(os.environ.get("ZARRGATE_LB_CONF") or REPO / "deploy" / "nginx" / "zarrgate-lb.conf")
    if not conf.is_file():
        pytest.fail(f"no nginx conf at {conf}")
    write_files(work / "big", BIG_SIZES, seed=49)
    write_files(work / "added", ADDED_SIZES, seed=50)
    t = Topology(binary, conf, work, drain_seconds=DRAIN)
    t.mounts = {
        "fx": {"url": str(FIXTURES), "consolidated": False},
        "big": {"url": str(work / "big"), "consolidated": False},
    }
    try:
        t.start()
        yield t
    finally:
        t.stop()


@pytest.fixture(scope="session")
def keys(topo, work):
    return {
        "fx": fixture_keys(),
        "big": mount_keys("big", work / "big"),
        "added": mount_keys("added", work / "added"),
    }


@pytest.fixture(autouse=True)
def healthy(topo):
    topo.ensure_healthy()
    yield


def json_error(body: bytes) -> tuple[str, str] | None:
    """(code, message) of a `{"error": {"code": .., "message": ..}}` body, else None."""
    try:
        e = json.loads(body)["error"]
    except (ValueError, KeyError, TypeError):
        return None
    if isinstance(e, dict) and isinstance(e.get("code"), str) and isinstance(e.get("message"), str) \
            and e["code"] and e["message"]:
        return e["code"], e["message"]
    return None


def mount_names(port: int, headers=None) -> set[str]:
    status, _, body = get(port, "/api/v1/mounts", headers)
    assert status == 200, f"/api/v1/mounts on :{port}: {status} {body[:200]!r}"
    doc = json.loads(body)
    items = doc["mounts"] if isinstance(doc, dict) else doc
    return {m["name"] if isinstance(m, dict) else m for m in items}


def check(problems: list, ok: bool, what: str):
    if not ok:
        problems.append(what)


# ---------------------------------------------------------------------------------------------
# (1) byte-exact reads through the balancer
# ---------------------------------------------------------------------------------------------


def test_1_byte_exact_through_balancer(topo, keys):
    every = keys["fx"] + keys["big"]
    sizes = sorted(len(b) for _, b in every)
    assert len(every) >= 190 and sizes[0] < 64 and sizes[-1] > 3 << 20, (len(every), sizes[:3], sizes[-3:])
    client = Client(topo.nginx.port)
    bad = []
    for path, want in every:
        status, headers, body = client.get(path)
        if status != 200 or body != want or headers.get("content-length") != str(len(want)):
            bad.append((path, status, len(body), len(want), headers.get("content-length")))
    assert bad == [], f"{len(bad)} of {len(every)} keys not byte-exact through nginx: {bad[:10]}"

    # Errors come through as the replica wrote them.
    status, _, body = client.get("/zarr/fx/v3/no_such_array/zarr.json")
    assert status == 404 and json_error(body) and json_error(body)[0] == "not_found", (status, body[:300])
    client.close()
    assert {"fx", "big"} <= mount_names(topo.nginx.port)


# ---------------------------------------------------------------------------------------------
# (2) one key, one replica
# ---------------------------------------------------------------------------------------------


def test_2_each_key_reaches_one_replica(topo, keys):
    every = keys["fx"] + keys["big"]
    reads = 3
    owner, counts, errors = topo.attribute(every, reads=reads)
    assert errors == [], errors[:10]
    n = len(topo.replicas)
    spread = {p: cs for p, cs in counts.items() if sorted(cs) != [0] * (n - 1) + [reads]}
    assert spread == {}, (
        f"{len(spread)} of {len(every)} paths not served {reads} times by exactly one replica "
        f"(counts per replica): {dict(list(spread.items())[:10])}"
    )
    share = collections.Counter(owner.values())
    assert sorted(share) == list(range(n)), share
    assert min(share.values()) >= len(every) // (3 * n), f"keys per replica: {dict(share)}"


# ---------------------------------------------------------------------------------------------
# (3) SIGKILL of a replica under load
# ---------------------------------------------------------------------------------------------


def test_3_replica_killed_under_load(topo, keys):
    fx = keys["fx"]
    before, _, errors = topo.attribute(fx)
    assert errors == [] and None not in before.values(), errors[:10]
    share = collections.Counter(before.values())
    victim_i = share.most_common(1)[0][0]
    victim = topo.replicas[victim_i]
    victim_keys = {p for p, o in before.items() if o == victim_i}

    load = Load(topo.nginx.port, fx, LOAD_THREADS, LOAD_RATE).start()
    time.sleep(4)
    rc = victim.kill()
    time.sleep(16)
    load.stop()
    print(f"kill of {victim.name} (owner of {len(victim_keys)} of {len(fx)} keys): {load.summary()}")
    assert rc == -signal.SIGKILL, rc
    assert load.failures == [], load.summary()
    assert load.ok >= LOAD_RATE * 20 * 0.5, load.summary()

    after, counts, errors = topo.attribute(fx)
    assert errors == [], errors[:10]
    assert None not in after.values(), {p: c for p, c in counts.items() if after[p] is None}
    moved = {p for p in before if after[p] != before[p]}
    assert moved == victim_keys, (
        f"keys that moved: {len(moved)}, the killed replica's: {len(victim_keys)}; "
        f"moved off survivors: {sorted(moved - victim_keys)[:10]}; "
        f"stayed on the killed one: {sorted(victim_keys - moved)[:10]}"
    )
    took = collections.Counter(after[p] for p in victim_keys)
    survivors = [i for i in range(len(topo.replicas)) if i != victim_i]
    assert sorted(took) == survivors, f"the killed replica's {len(victim_keys)} keys went to {dict(took)}"

    # Back on the same port: its keys come back to it once nginx tries it again.
    victim.start()
    deadline = time.monotonic() + topo.nginx.info["fail_timeout"] + 10
    while True:
        again, _, errors = topo.attribute(fx)
        assert errors == [], errors[:10]
        if again == before or time.monotonic() > deadline:
            break
        time.sleep(1)
    back = {p for p in victim_keys if again[p] == victim_i}
    assert again == before, f"after the restart {len(back)} of its {len(victim_keys)} keys came back"


# ---------------------------------------------------------------------------------------------
# (4) SIGHUP reload under load
# ---------------------------------------------------------------------------------------------


def test_4_sighup_adds_a_mount_under_load(topo, keys, work):
    fx, added = keys["fx"], keys["added"]
    problems: list[str] = []
    load = Load(topo.nginx.port, fx, LOAD_THREADS, LOAD_RATE).start()
    try:
        time.sleep(1.5)
        topo.mounts["added"] = {"url": str(work / "added"), "consolidated": False}
        topo.write_configs()
        topo.sighup_all()

        # Every replica serves the new mount, directly ...
        for r in topo.replicas:
            path, want = added[r.index]
            ok = wait_status(r.port, path, 200, 10)
            check(problems, ok and r.alive(), f"{r.name}: {path} not 200 within 10 s of SIGHUP (alive: {r.alive()})")
            if ok:
                check(problems, get(r.port, path)[2] == want, f"{r.name}: {path} not byte-exact")
                check(problems, "added" in mount_names(r.port), f"{r.name}: /api/v1/mounts lacks 'added'")
        # ... and through the balancer, all its keys, spread over the replicas.
        if not problems:
            owner, _, errors = topo.attribute(added)
            check(problems, errors == [], f"/zarr/added through nginx: {errors[:5]}")
            check(problems, set(owner.values()) == set(range(len(topo.replicas))),
                  f"replicas serving /zarr/added: {collections.Counter(owner.values())}")

        # An invalid file keeps the config in force: a syntax error, then an unknown key (with a
        # new mount beside it, which must not appear: the file is refused whole).
        ghost = "[mounts.ghost]\n" f"url = {json.dumps(str(FIXTURES))}\n"
        for what, text in (
            ("a TOML syntax error", topo.render_config() + "\n[mounts.broken\nurl = \n"),
            ("an unknown key", topo.render_config().replace("[server]\n", "[server]\nno_such_key = 1\n", 1) + ghost),
        ):
            topo.write_configs(text)
            for r in topo.replicas:
                if r.alive():
                    r.send(signal.SIGHUP)
            time.sleep(1.0)
            for r in topo.replicas:
                if not r.alive():
                    problems.append(f"{what}: {r.name} exited on SIGHUP (code {r.proc.poll()})")
                    continue
                for path, want in (fx[r.index], added[r.index]):
                    status, _, body = get(r.port, path)
                    check(problems, status == 200 and body == want, f"{what}: {r.name} {path} -> {status}")
                status, _, body = get(r.port, "/zarr/ghost/v3/zstd_i4/zarr.json")
                check(problems, status == 404, f"{what}: {r.name} serves the refused file's mount ghost ({status})")
            c = Client(topo.nginx.port)
            for path, want in added[:10]:
                status, _, body = c.get(path)
                check(problems, status == 200 and body == want, f"{what}: {path} through nginx -> {status}")
            c.close()
        topo.write_configs()
        time.sleep(1.0)
    finally:
        topo.write_configs()
        load.stop()
    print(f"SIGHUP: {load.summary()}")
    check(problems, load.failures == [], f"load on /zarr/fx during the reloads: {load.summary()}")
    assert problems == [], "\n".join(problems)


# ---------------------------------------------------------------------------------------------
# (5) rolling SIGTERM restart under load
# ---------------------------------------------------------------------------------------------


def test_5_rolling_restart_under_load(topo, keys):
    fx = keys["fx"]
    problems: list[str] = []
    load = Load(topo.nginx.port, fx, LOAD_THREADS, LOAD_RATE).start()
    try:
        time.sleep(1.0)
        for r in topo.replicas:
            path, want = fx[r.index]
            t0 = time.monotonic()
            r.send(signal.SIGTERM)
            not_ready = wait_status(r.port, "/readyz", 503, 1.0)
            check(problems, not_ready, f"{r.name}: /readyz not 503 within 1 s of SIGTERM")
            if not_ready:
                # Still accepting and answering while not ready.
                try:
                    status, _, body = get(r.port, path, timeout=5)
                except OSError as e:
                    status, body = f"{type(e).__name__}: {e}", b""
                check(problems, status == 200 and body == want,
                      f"{r.name}: {path} directly while draining -> {status}")
                check(problems, time.monotonic() - t0 < DRAIN, f"{r.name}: the checks of the drain took past it")
            rc = r.wait_exit(2 * DRAIN + 5)
            gone = time.monotonic() - t0
            if rc is None:
                problems.append(f"{r.name}: still running {gone:.1f} s after SIGTERM")
                r.stop(signal.SIGKILL)
            else:
                check(problems, rc == 0, f"{r.name}: exit code {rc} after SIGTERM")
                check(problems, gone >= DRAIN - 0.25,
                      f"{r.name}: exited {gone:.2f} s after SIGTERM, before drain_seconds = {DRAIN}")
            r.start()
            check(problems, wait_status(r.port, "/readyz", 200, 10), f"{r.name}: /readyz not 200 after restart")
            # nginx marked it failed while it was down (max_fails/fail_timeout) and sends it
            # nothing until fail_timeout has passed: stopping the next one sooner can leave
            # every replica of a key's ring marked failed (502 "no live upstreams").
            topo.settle()
        time.sleep(1.0)
    finally:
        load.stop()
    print(f"rolling restart: {load.summary()}")
    check(problems, load.failures == [], f"load during the rolling restart: {load.summary()}")
    check(problems, load.ok > 0, load.summary())
    assert problems == [], "\n".join(problems)


# ---------------------------------------------------------------------------------------------
# (6) JWT and signed URLs
# ---------------------------------------------------------------------------------------------


ISSUER, AUDIENCE, SCOPE = "https://issuer.test", "zarrgate", "read:private"
PRIVATE_PREFIX = "v3/vlen_utf8"


def make_keys(work: Path):
    """Signing keys and the JWKS file (RS256 and ES256 keys in it; two keys not in it)."""
    import jwt
    from cryptography.hazmat.primitives.asymmetric import ec, rsa

    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ec_key = ec.generate_private_key(ec.SECP256R1())
    rogue = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    rsa_jwk = jwt.algorithms.RSAAlgorithm.to_jwk(rsa_key.public_key(), as_dict=True)
    ec_jwk = jwt.algorithms.ECAlgorithm.to_jwk(ec_key.public_key(), as_dict=True)
    rsa_jwk.update(kid="rsa-1", alg="RS256", use="sig")
    ec_jwk.update(kid="ec-1", alg="ES256", use="sig")
    path = work / "jwks.json"
    path.write_text(json.dumps({"keys": [rsa_jwk, ec_jwk]}))
    return path, {"rsa": rsa_key, "ec": ec_key, "rogue": rogue}


def token(keys, which="rsa", kid=None, alg=None, **claims) -> str:
    import jwt

    now = int(time.time())
    body = {"iss": ISSUER, "aud": AUDIENCE, "iat": now, "exp": now + 600, "scope": SCOPE, "sub": "scaleout"}
    body.update(claims)
    body = {k: v for k, v in body.items() if v is not None}
    alg = alg or ("ES256" if which == "ec" else "RS256")
    kid = kid or {"rsa": "rsa-1", "ec": "ec-1", "rogue": "rsa-1"}[which]
    return jwt.encode(body, keys[which], algorithm=alg, headers={"kid": kid})


def sign(topo, prefix: str, expires: str, base: str) -> tuple[str | None, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZARRGATE_")}
    env["ZG_SIGNING_KEY"] = topo.signing_key
    cmd = [topo.binary, "sign", "--config", str(topo.replicas[0].config), "--mount", "private",
           "--prefix", prefix, "--expires", expires, "--base-url", base]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=20, env=env, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return None, "zarrgate sign timed out"
    lines = p.stdout.strip().splitlines()
    if p.returncode != 0 or len(lines) != 1:
        return None, f"zarrgate sign exited {p.returncode}: stdout {p.stdout[:300]!r} stderr {p.stderr[-500:]!r}"
    return lines[0].strip(), ""


def test_6_jwt_and_signed_urls(topo, keys, work):
    jwks, k = make_keys(work)
    topo.auth = {"jwks": str(jwks), "issuer": ISSUER, "audience": AUDIENCE}
    topo.mounts["private"] = {"url": str(FIXTURES), "consolidated": False, "jwt_scope": SCOPE}
    topo.write_configs()
    for r in topo.replicas:  # no traffic meanwhile: nginx does not see them down
        r.stop()
        r.start()

    private_dir = FIXTURES / PRIVATE_PREFIX
    inside = sorted(p.relative_to(private_dir).as_posix() for p in private_dir.rglob("*") if p.is_file())
    doc_path = f"/zarr/private/{PRIVATE_PREFIX}/zarr.json"
    doc = (private_dir / "zarr.json").read_bytes()
    fx_path, fx_want = keys["fx"][0]
    problems: list[str] = []
    now = int(time.time())
    bearer = lambda t: {"Authorization": f"Bearer {t}"}  # noqa: E731

    refused = {
        "expired": token(k, exp=now - 3600, iat=now - 7200),
        "bad signature": token(k, "rogue"),
        "wrong issuer": token(k, iss="https://other.test"),
        "wrong audience": token(k, aud="someone-else"),
        "unknown kid": token(k, "rogue", kid="no-such-kid"),
        "not a JWT": "not.a.jwt",
    }
    places = [("replica", topo.replicas[0].port), ("nginx", topo.nginx.port)]
    for where, port in places:
        def expect(what, headers, status, body=None, challenge=None, path=doc_path):
            got, h, b = get(port, path, headers)
            line = f"{where}: {what}: {got} {h.get('www-authenticate')!r} {b[:160]!r}"
            if got != status or (body is not None and b != body):
                problems.append(line + f" (want {status})")
            elif challenge and challenge not in (h.get("www-authenticate") or ""):
                problems.append(line + f" (want WWW-Authenticate with {challenge})")
            elif status >= 400 and json_error(b) is None:
                problems.append(line + " (want a JSON error body)")

        expect("public mount, no token", {}, 200, fx_want, path=fx_path)
        expect("no token", {}, 401, challenge="Bearer")
        expect("RS256 token with the scope", bearer(token(k)), 200, doc)
        expect("ES256 token, the scope among others", bearer(token(k, "ec", scope=f"read:other {SCOPE} x")), 200, doc)
        for name in inside:
            expect(f"RS256 token, {name}", bearer(token(k)), 200, (private_dir / name).read_bytes(),
                   path=f"/zarr/private/{PRIVATE_PREFIX}/{name}")
        for what, t in refused.items():
            expect(what, bearer(t), 401, challenge='error="invalid_token"')
        expect("no scope claim", bearer(token(k, scope=None)), 403, challenge='error="insufficient_scope"')
        expect("another scope", bearer(token(k, scope="read:public read:privateX")), 403,
               challenge='error="insufficient_scope"')

    # Signed URLs, made for the balancer.
    base = f"http://127.0.0.1:{topo.nginx.port}"
    url, err = sign(topo, PRIVATE_PREFIX, "1h", base)
    m = url and re.fullmatch(re.escape(base) + r"(/signed/([^/]+)\.([^/]+)/zarr/private/" + re.escape(PRIVATE_PREFIX) + "/)", url)
    if not m:
        problems.append(f"zarrgate sign: {err or repr(url)} is not {base}/signed/EXPIRES.SIGNATURE/zarr/private/{PRIVATE_PREFIX}/")
    else:
        signed, sig = m[1], m[3]
        bad_sig = ("B" if sig[0] == "A" else "A") + sig[1:]  # the first character: all its bits count
        tampered = signed.replace(f".{sig}/", f".{bad_sig}/")
        for where, port in places:
            for name in inside:
                status, _, body = get(port, signed + name)
                check(problems, status == 200 and body == (private_dir / name).read_bytes(),
                      f"{where}: signed URL + {name} -> {status} {body[:160]!r}")
            for what, path in (
                ("a sibling sharing the prefix's name", signed.replace(f"/{PRIVATE_PREFIX}/", f"/{PRIVATE_PREFIX}_2d_missing/") + "zarr.json"),
                ("another array", signed.replace(f"/{PRIVATE_PREFIX}/", "/v3/dtype_int8/") + "zarr.json"),
                ("a tampered signature", tampered + "zarr.json"),
            ):
                status, _, body = get(port, path)
                check(problems, status == 403 and json_error(body) is not None,
                      f"{where}: signed URL, {what}: {status} {body[:200]!r} (want 403 with a JSON error)")
            for what, path in (("..", signed + "../dtype_int8/zarr.json"), ("%2e%2e", signed + "%2e%2e/dtype_int8/zarr.json")):
                status, _, body = get(port, path)
                check(problems, status != 200 and body != (FIXTURES / "v3/dtype_int8/zarr.json").read_bytes(),
                      f"{where}: signed URL + {what} out of the prefix -> {status}")

    short, err = sign(topo, PRIVATE_PREFIX, "1s", base)
    if not short or not short.startswith(base + "/signed/"):
        problems.append(f"zarrgate sign --expires 1s: {err or repr(short)}")
    else:
        time.sleep(2.2)
        for where, port in places:
            status, _, body = get(port, short[len(base):] + "zarr.json")
            check(problems, status == 403 and json_error(body) is not None,
                  f"{where}: expired signed URL: {status} {body[:200]!r} (want 403 with a JSON error)")
    assert problems == [], f"{len(problems)} problems:\n" + "\n".join(problems)
