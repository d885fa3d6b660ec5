#!/usr/bin/env python3
"""Fails when a module of src/ imports, directly or through others, one that imports it back.

Modules are files (a directory's mod.rs is the directory). An edge is any `crate::a::b` or
`super::x` path outside `#[cfg(test)] mod tests`, doc links included: the data flows one way
(docs/architecture.md), and so do the references. The one cycle allowed is the codec chain and
the sharding codec, which contain each other as the nested sharding of the Zarr v3 spec does.

    python3 scripts/module_cycles.py        # exit 1 and the cycles, or exit 0
"""
import collections
import pathlib
import re
import sys

SRC = pathlib.Path(__file__).resolve().parents[1] / "src"
ALLOWED = [{"codec/chain", "codec/sharding"}]


def modules():
    out = {}
    for path in SRC.rglob("*.rs"):
        name = path.relative_to(SRC).with_suffix("").as_posix()
        if name.endswith("/mod"):
            name = name[: -len("/mod")]
        if name not in ("lib", "main"):
            out[name] = path
    return out


def edges(mods):
    def resolve(parts):
        best = None
        for i in range(1, len(parts) + 1):
            if "/".join(parts[:i]) in mods:
                best = "/".join(parts[:i])
        return best

    graph = collections.defaultdict(set)
    for name, path in mods.items():
        text = re.split(r"\n#\[cfg\(test\)\]\nmod tests", path.read_text())[0]
        parent = name.rsplit("/", 1)[0].split("/") if "/" in name else []
        if path.name == "mod.rs":
            parent = name.split("/")[:-1]
        targets = [p.split("::") for p in re.findall(r"\bcrate::((?:[a-z_][a-z0-9_]*::?)+)", text)]
        targets += [parent + p.split("::") for p in re.findall(r"\bsuper::((?:[a-z_][a-z0-9_]*::?)+)", text)]
        for parts in targets:
            target = resolve([p for p in parts if p])
            if target and target != name and not name.startswith(target + "/"):
                graph[name].add(target)
    return graph


def cycles(graph, nodes):
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(component)

    for v in nodes:
        if v not in index:
            visit(v)
    return found


def main():
    mods = modules()
    graph = edges(mods)
    bad = [c for c in cycles(graph, sorted(mods)) if c not in ALLOWED]
    for component in bad:
        print("import cycle:")
        for name in sorted(component):
            print(f"  {name} -> {', '.join(sorted(graph[name] & component))}")
    if bad:
        return 1
    print(f"module_cycles: {len(mods)} modules, no import cycle")
    return 0


if __name__ == "__main__":
    sys.exit(main())
