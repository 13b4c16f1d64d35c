#!/usr/bin/env python3
"""oleo's Python binding against dissect.btrfs (Fox-IT's pure-Python btrfs reader), the
same images in the same run (issue 42):

- walk: a full walk with an lstat of every entry, over an image of N files (100,000 by
  default) in 1,000 directories;
- read: every file's contents read, over an image of about 1 GiB: half of it written
  with zstd compression, half plain; half of the bytes in small files (1 to 128 KiB,
  some 8,000 of them), half in large ones (1 to 8 MiB).

Each reader runs in a child interpreter of one venv (the oleo wheel built from this
checkout, dissect.btrfs and backports.zstd from PyPI). Each workload runs cold (the
host's page cache dropped before the run, as root: both read the disk) and warm (the
image already in the host's page cache: the readers' own costs). Medians of --reps runs;
the child's peak RSS (ru_maxrss) beside each time. Writes report.md and results.json to
--results.

    bench/python-readers.py --results bench/results/DATE-python [--files 100000] [--reps 3]

Runs alone (no builds or tests beside it), as every benchmark here.
"""

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# dissect.btrfs has no walk of its own: one depth-first walk for both workloads, with
# what each does per entry.
DISSECT_WALK = r"""
import sys
from dissect.btrfs import Btrfs
n = 0
with open(sys.argv[1], "rb") as fh:
    fs = Btrfs(fh)
    stack = [fs.get("/")]
    while stack:
        d = stack.pop()
        for name, node in d.iterdir():
            if name in (".", ".."):
                continue
            if node.is_dir():
                stack.append(node)
            %s
print(n)
"""

WALK = {
    "oleo": r"""
import oleo, sys
n = 0
with oleo.open(sys.argv[1]) as fs:
    for top, dirs, files in fs.walk("/"):
        for name in dirs + files:
            fs.lstat(f"{top.rstrip('/')}/{name}")
            n += 1
print(n)
""",
    # The same fields lstat gives, read from the inode item.
    "dissect": DISSECT_WALK % "node.mode, node.size, node.mtime_ns, node.uid; n += 1",
}

READ = {
    "oleo": r"""
import oleo, sys
n = 0
with oleo.open(sys.argv[1]) as fs:
    for top, dirs, files in fs.walk("/"):
        for name in files:
            path = f"{top.rstrip('/')}/{name}"
            with fs.open(path, "rb", buffering=0) as f:
                n += len(f.readall())
print(n)
""",
    "dissect": DISSECT_WALK % "n += len(node.open().read()) if node.is_file() else 0",
}

MEASURE = r"""
import resource, subprocess, sys, time
t0 = time.perf_counter()
r = subprocess.run([sys.executable, "-c", sys.argv[1], sys.argv[2]], capture_output=True, text=True)
took = time.perf_counter() - t0
if r.returncode != 0:
    sys.exit(r.stderr[-2000:])
rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
print(took, rss, r.stdout.strip())
"""


def sh(*argv, **kw):
    return subprocess.run(argv, check=True, **kw)


def venv(work):
    v = os.path.join(work, "venv")
    if not os.path.exists(os.path.join(v, "bin", "python")):
        sh("/usr/bin/python3", "-m", "venv", v)
        pip = [os.path.join(v, "bin", "pip"), "install", "-q", "--disable-pip-version-check"]
        sh(*pip, "--upgrade", "pip")
        # dissect.btrfs reads zstd extents through backports.zstd before Python 3.14.
        sh(*pip, os.path.join(ROOT, "crates", "python"), "dissect.btrfs", "backports.zstd")
    return os.path.join(v, "bin", "python")


def make_walk_image(py, path, files):
    code = r"""
import oleo, sys
path, files = sys.argv[1], int(sys.argv[2])
oleo.mkfs(path, 4 << 30)
with oleo.open(path, "w") as fs:
    per = max(files // 1000, 1)
    for d in range(0, files, per):
        fs.mkdir(f"/d{d // per:04d}")
        for i in range(min(per, files - d)):
            with fs.open(f"/d{d // per:04d}/f{i:05d}", "wb") as f:
                f.write(b"x" * (i % 7 * 100))
"""
    sh(py, "-c", code, path, str(files))


def make_read_image(py, path, total):
    code = r"""
import oleo, random, sys
path, total = sys.argv[1], int(sys.argv[2])
rnd = random.Random(42)
oleo.mkfs(path, 4 * total)
text = b"".join(b"%08d a line of compressible text, as logs and sources are\n" % i
                for i in range(200000))
for compress, half in ((None, "plain"), ("zstd", "zstd")):
    opts = {"compress": compress} if compress else {}
    with oleo.open(path, "w", **opts) as fs:
        fs.mkdir("/" + half)
        for kind, lo, hi in (("small", 1 << 10, 128 << 10), ("large", 1 << 20, 8 << 20)):
            fs.mkdir(f"/{half}/{kind}")
            done, i = 0, 0
            while done < total // 4:
                size = rnd.randrange(lo, hi)
                if rnd.random() < 0.5:
                    data = rnd.randbytes(size)
                else:
                    start = rnd.randrange(len(text) - size)
                    data = text[start:start + size]
                with fs.open(f"/{half}/{kind}/f{i:05d}", "wb") as f:
                    f.write(data)
                done += size
                i += 1
"""
    sh(py, "-c", code, path, str(total))


def drop_caches():
    if os.geteuid() == 0:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")


def measure(py, code, image, cold):
    if cold:
        drop_caches()
    else:
        # Warm: the image read once beforehand, so the run finds it in the page cache.
        with open(image, "rb") as f:
            while f.read(16 << 20):
                pass
    out = subprocess.run([py, "-c", MEASURE, code, image], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"a reader failed: {out.stderr}")
    took, rss, result = out.stdout.split(maxsplit=2)
    return float(took), int(rss) / 1024, result.strip()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", required=True)
    ap.add_argument("--files", type=int, default=100_000)
    ap.add_argument("--read-bytes", type=int, default=1 << 30)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--work", default=None)
    a = ap.parse_args()
    work = a.work or tempfile.mkdtemp(prefix="oleo-pybench-")
    os.makedirs(a.results, exist_ok=True)
    py = venv(work)
    walk_img = os.path.join(work, f"walk-{a.files}.img")
    read_img = os.path.join(work, f"read-{a.read_bytes}.img")
    if not os.path.exists(walk_img):
        make_walk_image(py, walk_img, a.files)
    if not os.path.exists(read_img):
        make_read_image(py, read_img, a.read_bytes)
    versions = subprocess.run(
        [py, "-c", "import importlib.metadata as m, platform; print(m.version('oleo'), "
                   "m.version('dissect.btrfs'), platform.python_version())"],
        capture_output=True, text=True, check=True).stdout.split()
    results = []
    for workload, codes, image in (("walk", WALK, walk_img), ("read", READ, read_img)):
        for cache in ("cold", "warm"):
            for rep in range(a.reps):
                # Alternate who goes first in each repetition.
                order = ["oleo", "dissect"] if rep % 2 == 0 else ["dissect", "oleo"]
                for reader in order:
                    took, rss, out = measure(py, codes[reader], image, cache == "cold")
                    results.append({"workload": workload, "cache": cache, "reader": reader,
                                    "rep": rep, "seconds": took, "peak_rss_mib": rss,
                                    "result": out})
                    print(f"{workload} {cache} {reader} rep {rep}: {took:.2f} s, {rss:.0f} MiB,"
                          f" {out}", flush=True)
    meta = {"date": time.strftime("%Y-%m-%d %H:%M:%S %z"), "kernel": platform.release(),
            "cpus": os.cpu_count(), "python": versions[2],
            "oleo": versions[0], "dissect.btrfs": versions[1], "files": a.files,
            "read_bytes": a.read_bytes, "reps": a.reps,
            "cold": os.geteuid() == 0}
    with open(os.path.join(a.results, "results.json"), "w") as f:
        json.dump({"meta": meta, "results": results}, f, indent=1)
    lines = ["# oleo's Python binding against dissect.btrfs", "",
             f"{meta['date']}, kernel {meta['kernel']}, {meta['cpus']} CPUs, Python "
             f"{meta['python']}; oleo {meta['oleo']}, dissect.btrfs {meta['dissect.btrfs']}; "
             f"medians of {a.reps} (min-max); cold: the page cache dropped before each run"
             + ("" if meta["cold"] else " (not root: no drop, so cold is warm too)") + ".",
             "",
             "| workload | cache | oleo s | dissect.btrfs s | oleo's speed ×dissect "
             "| oleo peak RSS MiB | dissect peak RSS MiB | result (entries / bytes) |",
             "|---|---|---|---|---|---|---|---|"]
    for workload, what in (("walk", f"walk + lstat of {a.files:,} files"),
                           ("read", f"read every file, {a.read_bytes >> 20} MiB")):
        for cache in ("cold", "warm"):
            row = {}
            for reader in ("oleo", "dissect"):
                rs = [r for r in results if r["workload"] == workload and
                      r["cache"] == cache and r["reader"] == reader]
                secs = [r["seconds"] for r in rs]
                row[reader] = (statistics.median(secs), min(secs), max(secs),
                               statistics.median(r["peak_rss_mib"] for r in rs),
                               rs[0]["result"])
            o, d = row["oleo"], row["dissect"]
            lines.append(f"| {what} | {cache} | {o[0]:.2f} ({o[1]:.2f}-{o[2]:.2f}) | "
                         f"{d[0]:.2f} ({d[1]:.2f}-{d[2]:.2f}) | {d[0] / o[0]:.1f} | {o[3]:.0f} "
                         f"| {d[3]:.0f} | {o[4]} / {d[4]} |")
    with open(os.path.join(a.results, "report.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
