#!/usr/bin/env python3
"""Draws the engine's house from its imports: which layer each file is in, and every
import or method call that goes up a layer or across between layers of the same rank.
Exit 1 on any.

Layers (low to high) are the folders of crates/engine/src; the root's own files are the
base any layer may use. Test modules (after `#[cfg(test)]`) are left out: tests may build
an image with mkfs at any layer."""
import pathlib, re, sys

ROOT = pathlib.Path(__file__).resolve().parent.parent / "crates/engine/src"
RANK = {"base": 0, "io": 1, "ctree": 2, "transaction": 3, "inode": 4, "data": 5,
        "vfs": 6, "tree_log": 7, "subvolume": 7, "scrub": 7, "rescue": 7, "filesystem": 8, "mkfs": 9}
# What the crate root re-exports, by the layer it comes from.
ROOT_NAMES = {"Filesystem": "filesystem", "OpenOptions": "transaction",
              "Compress": "transaction", "Transaction": "transaction",
              "InodeId": "transaction", "Attr": "transaction", "DirEntry": "transaction",
              "FileKind": "transaction", "StatFs": "transaction", "Timespec": "transaction",
              "SubvolumeInfo": "transaction", "TreeRoot": "ctree", "ExtentInfo": "data",
              "NewInode": "vfs", "SetAttr": "vfs", "RenameFlags": "vfs", "FallocMode": "vfs",
              "XattrSet": "inode", "now": "inode", "fileattr": "vfs", "compression": "inode"}
# Types every layer extends with methods from its own files (the kernel's fs_info,
# transaction handle and the public handle): a call of such a method defined only in a
# higher layer is an upward call even without an import.
CONTEXTS = r"FsCore|Transaction<[^>]*>|TxnState|Filesystem"
# Method names too common to tell apart by name alone.
COMMON = {"remove", "write", "read", "open", "join", "finish", "generation", "lookup",
          "settle", "insert_items", "get", "insert", "len", "push", "take", "clone",
          "flush", "sync", "lock", "trim"}

def layer(rel):
    parts = rel.parts
    return "base" if len(parts) == 1 else parts[0]

bad = []
edges = {}
texts = {}
methods = {}
all_fns = {}
for f in sorted(ROOT.rglob("*.rs")):
    rel = f.relative_to(ROOT)
    if rel.name == "lib.rs":
        continue
    text = f.read_text()
    cut = text.find("#[cfg(test)]")
    if cut >= 0:
        text = text[:cut]
    texts[rel] = text
    for n in re.findall(r"\bfn ([a-z_0-9]+)", text):
        all_fns[n] = all_fns.get(n, 0) + 1
    for m in re.finditer(r"^impl(?:<[^>]*>)? (?:%s) \{(.*?)^\}" % CONTEXTS, text, re.M | re.S):
        for n in re.findall(r"^    (?:pub(?:\([a-z]+\))? )?fn ([a-z_0-9]+)", m.group(1), re.M):
            methods.setdefault(n, set()).add(layer(rel))

for rel, text in texts.items():
    me = layer(rel)
    uses = set(re.findall(r"\bcrate::([a-z_]+)", text))
    uses |= {ROOT_NAMES[n] for n in re.findall(r"\bcrate::([A-Za-z_]+)\b", text) if n in ROOT_NAMES}
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

    for n in sorted(set(re.findall(r"\.([a-z_0-9]+)\(", text)) - COMMON):
        where = methods.get(n)
        if where and all_fns[n] == len(where) and all(RANK[w] > RANK[me] for w in where):
            bad.append(f"{rel} ({me}) calls .{n}(), defined in {', '.join(sorted(where))}")

for (a, b), files in sorted(edges.items(), key=lambda e: (RANK[e[0][0]], RANK[e[0][1]])):
    print(f"{a:>11} -> {b:<11} {len(files)} files")
if bad:
    print("\nupward or sideways imports:")
    print("\n".join(sorted(bad)))
    sys.exit(1)
print("\nno upward imports")
