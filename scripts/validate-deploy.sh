#!/usr/bin/env bash
# Offline checks of the deployment recipes in deploy/ (issue #49, "Scale out"):
#
#   scripts/validate-deploy.sh
#
#  - every manifest in deploy/kubernetes/ against the Kubernetes API schemas, strictly (unknown
#    fields fail), for each version in DEPLOY_KUBE_VERSIONS (default: 1.30.0, the oldest the
#    recipes support, and 1.37.0, the newest the pinned kubernetes-validate knows);
#  - kustomization.yaml lists every manifest file there, and only those, and (where kubectl
#    is installed) `kubectl kustomize` builds them with the image set;
#  - deploy/compose.yaml has zarrgate-1..3 and nginx, nginx mounts deploy/nginx/zarrgate-lb.conf
#    as its nginx.conf, and the upstream block names those replicas;
#  - `nginx -t` on deploy/nginx/zarrgate-lb.conf, with and without its cache include, after the
#    rewrites a test running it makes (upstream servers and listen to 127.0.0.1, paths into a
#    temporary directory);
#  - deploy/config.toml parses, configmap.yaml holds a verbatim copy of it, secret.yaml and
#    .env.example provide each "env:VAR" it reads, and the grace periods of compose and
#    Kubernetes exceed twice its drain_seconds.
#
# One line per check; exits non-zero if any fails. Python packages come from
# deploy/requirements.txt (scripts/python-env.sh); nginx is installed with apt-get when absent.
# Nothing here talks to a cluster or to Docker, and nothing listens.
set -euo pipefail

cd "$(dirname "$0")/.."
KUBE_VERSIONS="${DEPLOY_KUBE_VERSIONS:-1.30.0 1.37.0}"
WORK="$(mktemp -d /tmp/zarrgate-deploy.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT

FAILED=0
# check NAME COMMAND...: run it, print "ok NAME" or "FAIL NAME" and its output, indented.
check() {
    local name="$1" out
    shift
    if out="$("$@" 2>&1)"; then
        echo "ok    $name"
    else
        echo "FAIL  $name"
        printf '%s\n' "$out" | sed 's/^/      /'
        FAILED=$((FAILED + 1))
    fi
}

if [ ! -x /usr/sbin/nginx ] && ! command -v nginx >/dev/null; then
    echo "validate-deploy: installing nginx with apt-get" >&2
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx >&2
fi
NGINX="$(command -v nginx || echo /usr/sbin/nginx)"
VENV="$(scripts/python-env.sh deploy deploy/requirements.txt)"
PY="$VENV/bin/python"

# The Python side of the checks: `checks.py NAME [ARGS]`.
cat >"$WORK/checks.py" <<'PYEOF'
import pathlib
import re
import sys
import tomllib

import yaml

DEPLOY = pathlib.Path("deploy")
KUBE = DEPLOY / "kubernetes"
LB_CONF = DEPLOY / "nginx" / "zarrgate-lb.conf"
CACHE_CONF = DEPLOY / "nginx" / "zarrgate-lb-cache.conf"
REPLICAS = ["zarrgate-1", "zarrgate-2", "zarrgate-3"]
errors = []


def load_yaml(path):
    with open(path) as f:
        return yaml.safe_load(f)


def seconds(value):
    """A compose duration ("30s", "1m30s") or a number, in seconds."""
    if isinstance(value, (int, float)):
        return value
    total, rest = 0.0, value
    for amount, unit in re.findall(r"(\d+(?:\.\d+)?)(h|ms|m|s|us)", value):
        total += float(amount) * {"h": 3600, "m": 60, "s": 1, "ms": 1e-3, "us": 1e-6}[unit]
        rest = rest.replace(amount + unit, "", 1)
    if rest:
        raise ValueError(f"not a duration: {value!r}")
    return total


def manifests():
    """The manifest files of deploy/kubernetes (every .yaml but kustomization.yaml)."""
    return sorted(p.name for p in KUBE.glob("*.y*ml") if p.name != "kustomization.yaml")


def kustomization():
    k = load_yaml(KUBE / "kustomization.yaml")
    if k.get("kind") != "Kustomization":
        errors.append("kustomization.yaml: kind is not Kustomization")
    listed = k.get("resources") or []
    if len(listed) != len(set(listed)):
        errors.append(f"kustomization.yaml lists a file twice: {listed}")
    for name in sorted(set(manifests()) - set(listed)):
        errors.append(f"{name} is not in kustomization.yaml's resources")
    for name in sorted(set(listed) - set(manifests())):
        errors.append(f"kustomization.yaml lists {name}, which is not a file in {KUBE}")


def kubernetes_validate(version):
    import kubernetes_validate

    for name in manifests():
        for doc in yaml.safe_load_all(open(KUBE / name)):
            if doc is None:
                continue
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except Exception as e:  # ValidationError, SchemaNotFoundError, ...
                what = f"{doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
                errors.append(f"{name} ({what}): {getattr(e, 'message', e)}")


def drain_seconds():
    config = tomllib.loads((DEPLOY / "config.toml").read_text())
    return config.get("server", {}).get("drain_seconds", 5)


def compose():
    c = load_yaml(DEPLOY / "compose.yaml")
    services = c.get("services") or {}
    for name in REPLICAS + ["nginx"]:
        if name not in services:
            errors.append(f"compose.yaml: no service {name}")
    drain = drain_seconds()
    for name in REPLICAS:
        s = services.get(name) or {}
        build = s.get("build") or {}
        if isinstance(build, str):
            build = {"context": build}
        dockerfile = DEPLOY / build.get("context", ".") / build.get("dockerfile", "Dockerfile")
        if not dockerfile.is_file() or dockerfile.resolve() != pathlib.Path("Dockerfile").resolve():
            errors.append(f"compose.yaml: {name} does not build from the repository's Dockerfile")
        if "healthcheck" not in (s.get("healthcheck") or {}).get("test", []):
            errors.append(f"compose.yaml: {name}'s healthcheck is not `zarrgate healthcheck`")
        grace = seconds(s.get("stop_grace_period", "10s"))
        if grace <= 2 * drain:
            errors.append(f"compose.yaml: {name}'s stop_grace_period {grace:g} s is not above 2 x drain_seconds ({drain})")
        env = s.get("environment") or {}
        config_path = env.get("ZARRGATE_CONFIG", "/srv/zarrgate/config.toml")
        mounts = {v.split(":")[1]: v.split(":")[0] for v in s.get("volumes") or [] if isinstance(v, str)}
        if mounts.get(config_path) != "./config.toml":
            errors.append(f"compose.yaml: {name} does not mount ./config.toml at ZARRGATE_CONFIG ({config_path})")
        for source in mounts.values():
            if source.startswith(".") and not (DEPLOY / source).exists():
                errors.append(f"compose.yaml: {name} mounts {source}, which does not exist")
    nginx = services.get("nginx") or {}
    mounts = {v.split(":")[1]: v.split(":")[0] for v in nginx.get("volumes") or [] if isinstance(v, str)}
    if (DEPLOY / mounts.get("/etc/nginx/nginx.conf", "-")).resolve() != LB_CONF.resolve():
        errors.append("compose.yaml: nginx does not mount nginx/zarrgate-lb.conf as /etc/nginx/nginx.conf")
    if (DEPLOY / mounts.get("/etc/nginx/zarrgate-lb-cache.conf", "-")).resolve() != CACHE_CONF.resolve():
        errors.append("compose.yaml: nginx does not mount nginx/zarrgate-lb-cache.conf beside its nginx.conf")
    hosts = re.findall(r"^\s*server\s+([^\s:;]+):8080\s", upstream_block(LB_CONF.read_text()), re.M)
    if hosts != REPLICAS:
        errors.append(f"zarrgate-lb.conf: upstream servers {hosts}, compose has {REPLICAS} on :8080")


def upstream_block(text):
    m = re.search(r"^\s*upstream\s+zarrgate\s*\{(.*?)^\s*\}", text, re.M | re.S)
    if not m:
        errors.append("zarrgate-lb.conf: no `upstream zarrgate { ... }` block")
        return ""
    return m.group(1)


# Directives whose first argument is a file: a test must be able to move each of them.
PATH_DIRECTIVES = {"pid", "error_log", "access_log", "include", "client_body_temp_path", "proxy_temp_path",
                   "fastcgi_temp_path", "uwsgi_temp_path", "scgi_temp_path", "proxy_cache_path"}


def nginx_rewrite(out_dir, with_cache, port):
    """The LB conf (and its cache include) as a test runs them: upstream servers and listen on
    127.0.0.1, every path under out_dir; the cache include uncommented when with_cache."""
    out = pathlib.Path(out_dir)
    paths = [("/var/cache/nginx", str(out / "cache")), ("/var/log/nginx", str(out / "log")),
             ("/run/nginx.pid", str(out / "nginx.pid"))]

    def relocate(text):
        for old, new in paths:
            text = text.replace(old, new)
        return text

    text = LB_CONF.read_text()
    block = upstream_block(text)
    n = iter(range(1, 100))
    new_block, servers = re.subn(r"^(\s*server\s+)\S+:\d+(\s)", lambda m: f"{m[1]}127.0.0.1:{port + next(n)}{m[2]}", block, flags=re.M)
    if servers != 3:
        errors.append(f"zarrgate-lb.conf: {servers} `server HOST:PORT ...;` lines in the upstream, not 3")
    text = text.replace(block, new_block)
    text, listens = re.subn(r"^(\s*)listen\s+8080;", rf"\g<1>listen 127.0.0.1:{port};", text, flags=re.M)
    if listens != 1:
        errors.append(f"zarrgate-lb.conf: {listens} `listen 8080;` lines, not 1")
    text, includes = re.subn(r"^(\s*)#\s*(include\s+zarrgate-lb-cache\.conf;)", r"\1\2" if with_cache else r"\g<0>", text, flags=re.M)
    if includes != 1:
        errors.append(f"zarrgate-lb.conf: {includes} commented `include zarrgate-lb-cache.conf;` lines, not 1")
    (out / "log").mkdir(parents=True, exist_ok=True)
    (out / "cache").mkdir(parents=True, exist_ok=True)
    for name, conf in (("nginx.conf", relocate(text)), ("zarrgate-lb-cache.conf", relocate(CACHE_CONF.read_text()))):
        for line in conf.splitlines():
            words = line.split("#", 1)[0].split()
            if words and words[0] in PATH_DIRECTIVES and len(words) > 1:
                path = words[1].rstrip(";")
                if path.startswith("/") and not path.startswith(str(out)):
                    errors.append(f"{name}: {words[0]} {path} is outside /var/cache/nginx, /var/log/nginx, /run/nginx.pid")
        (out / name).write_text(conf)


def config():
    text = (DEPLOY / "config.toml").read_text()
    tomllib.loads(text)
    cm = load_yaml(KUBE / "configmap.yaml")
    if (cm.get("data") or {}).get("config.toml") != text:
        errors.append("kubernetes/configmap.yaml's config.toml is not a verbatim copy of deploy/config.toml")
    # Every "env:VAR" secret the config reads is provided by both recipes.
    wanted = set(re.findall(r'"env:(\w+)"', "\n".join(l.split("#", 1)[0] for l in text.splitlines())))
    secret = set((load_yaml(KUBE / "secret.yaml").get("stringData") or {}).keys())
    dotenv = set(re.findall(r"^\s*(\w+)=", (DEPLOY / ".env.example").read_text(), re.M))
    for var in sorted(wanted - secret):
        errors.append(f"config.toml reads env:{var}, which kubernetes/secret.yaml does not hold")
    for var in sorted(wanted - dotenv):
        errors.append(f"config.toml reads env:{var}, which .env.example does not name")
    drain = drain_seconds()
    pod = load_yaml(KUBE / "deployment.yaml")["spec"]["template"]["spec"]
    grace = pod.get("terminationGracePeriodSeconds", 30)
    if grace <= 2 * drain:
        errors.append(f"deployment.yaml: terminationGracePeriodSeconds {grace} is not above 2 x drain_seconds ({drain})")
    container = pod["containers"][0]
    env = {e["name"]: e.get("value") for e in container.get("env", [])}
    config_path = env.get("ZARRGATE_CONFIG", "/srv/zarrgate/config.toml")
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    found = False
    for m in container.get("volumeMounts", []):
        cm_ref = volumes.get(m["name"], {}).get("configMap", {}).get("name")
        if cm_ref == cm["metadata"]["name"] and "subPath" not in m and config_path == m["mountPath"].rstrip("/") + "/config.toml":
            found = True
    if not found:
        errors.append(f"deployment.yaml: ZARRGATE_CONFIG ({config_path}) is not config.toml in a directory mount of the ConfigMap")


def built(path):
    """The output of `kubectl kustomize`: every manifest's resource, the image set."""
    docs = [d for d in yaml.safe_load_all(open(path)) if d]
    want = sum(1 for name in manifests() for d in yaml.safe_load_all(open(KUBE / name)) if d)
    if len(docs) != want:
        errors.append(f"kustomize built {len(docs)} resources, the manifests hold {want}")
    for d in docs:
        if d["kind"] == "Deployment":
            for c in d["spec"]["template"]["spec"]["containers"]:
                if ":" not in c["image"]:
                    errors.append(f"container {c['name']}: image {c['image']!r} has no tag (kustomization.yaml's images:)")


what = sys.argv[1]
{"kustomization": kustomization, "built": lambda: built(sys.argv[2]), "compose": compose, "config": config,
 "kubernetes": lambda: kubernetes_validate(sys.argv[2]),
 "nginx": lambda: nginx_rewrite(sys.argv[2], sys.argv[3] == "cache", int(sys.argv[4]))}[what]()
for e in errors:
    print(e)
sys.exit(1 if errors else 0)
PYEOF

checks() { "$PY" "$WORK/checks.py" "$@"; }

for version in $KUBE_VERSIONS; do
    check "kubernetes manifests valid against Kubernetes $version (strict)" checks kubernetes "$version"
done
check "kustomization.yaml lists every manifest, and only those" checks kustomization
# kustomize ships with kubectl; where there is none, the check above stands alone.
kustomize_build() {
    kubectl kustomize deploy/kubernetes >"$WORK/built.yaml" && checks built "$WORK/built.yaml"
}
if command -v kubectl >/dev/null; then
    check "kubectl kustomize deploy/kubernetes builds them, image set" kustomize_build
else
    echo "skip  kubectl kustomize deploy/kubernetes (no kubectl here)"
fi
check "compose.yaml: zarrgate-1..3 and nginx, with the LB conf and grace periods" checks compose

# nginx_test on|off: nginx -t on the rewritten LB conf, with the cache include or without.
nginx_test() {
    local dir="$WORK/nginx-$1"
    checks nginx "$dir" "$([ "$1" = on ] && echo cache || echo plain)" 18080 || return 1
    "$NGINX" -t -q -p "$dir" -c "$dir/nginx.conf"
}
check "nginx -t deploy/nginx/zarrgate-lb.conf" nginx_test off
check "nginx -t deploy/nginx/zarrgate-lb.conf with zarrgate-lb-cache.conf" nginx_test on
check "config.toml: parses, copied in configmap.yaml, its secrets provided, grace > 2 x drain" checks config

if [ "$FAILED" -gt 0 ]; then
    echo "validate-deploy: $FAILED check(s) failed"
    exit 1
fi
echo "validate-deploy: all checks passed"
