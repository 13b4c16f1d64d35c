#!/usr/bin/env python3
"""Draws the engine's house from its imports: which layer each file is in, and every
import that goes up a layer or across between layers of the same rank. Exit 1 on any.

Layers (low to high) are the folders of crates/engine/src; the root's own files are the
base any layer may use. Test modules (after `#[cfg(test)]`) are left out: tests may build
an image with mkfs at any layer."""
import pathlib, re, sys

ROOT = pathlib.Path(__file__).resolve().parent.parent / "crates/engine/src"
RANK = {"base": 0, "io": 1, "ctree": 2, "transaction": 3, "inode": 4, "data": 5,
        "mkfs": 6, "tree_log": 6, "subvolume": 7, "filesystem": 8}

def layer(rel):
    parts = rel.parts
    return "base" if len(parts) == 1 else parts[0]

bad = []
edges = {}
for f in sorted(ROOT.rglob("*.rs")):
    rel = f.relative_to(ROOT)
    if rel.name == "lib.rs":
        continue
    text = f.read_text()
    cut = text.find("#[cfg(test)]")
    if cut >= 0:
        text = text[:cut]
    me = layer(rel)
    uses = set(re.findall(r"\bcrate::([a-z_]+)", text))
    # `use crate::{a::..., b}` groups
    for grp in re.findall(r"crate::\{([^}]*)\}", text):
        uses |= set(re.findall(r"(?:^|[,{\s])([a-z_]+)::", grp))
    for u in uses:
        if u in ("error", "sync", "blocking"):
            continue
        if u not in RANK:
            continue
        if u == me:
            continue
        edges.setdefault((me, u), []).append(str(rel))
        if RANK[u] >= RANK[me]:
            bad.append(f"{rel} ({me}) imports {u}")

for (a, b), files in sorted(edges.items(), key=lambda e: (RANK[e[0][0]], RANK[e[0][1]])):
    print(f"{a:>11} -> {b:<11} {len(files)} files")
if bad:
    print("\nupward or sideways imports:")
    print("\n".join(sorted(bad)))
    sys.exit(1)
print("\nno upward imports")
