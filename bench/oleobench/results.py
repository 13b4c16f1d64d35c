"""The results folder: results.jsonl (one line per measurement, N/A included),
meta.json (versions, machine, parameters), report.md and plots/.

Lines are appended and flushed as measurements finish, so an interrupted run
still leaves every finished measurement on disk.
"""

import dataclasses
import json
import os
import platform
import re
import subprocess

from .sysutil import which


class Writer:
    def __init__(self, results_dir):
        os.makedirs(results_dir, exist_ok=True)
        self.path = os.path.join(results_dir, "results.jsonl")
        self._f = open(self.path, "a")

    def write(self, rec):
        self._f.write(json.dumps(rec, sort_keys=True) + "\n")
        self._f.flush()

    def close(self):
        self._f.close()


def load(results_dir):
    recs = []
    with open(os.path.join(results_dir, "results.jsonl")) as f:
        for line in f:
            line = line.strip()
            if line:
                recs.append(json.loads(line))
    meta = {}
    mp = os.path.join(results_dir, "meta.json")
    if os.path.exists(mp):
        with open(mp) as f:
            meta = json.load(f)
    return recs, meta


def write_meta(results_dir, meta):
    with open(os.path.join(results_dir, "meta.json"), "w") as f:
        json.dump(meta, f, indent=2, sort_keys=True, default=str)
        f.write("\n")


def _out(argv):
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=20)
        return (r.stdout + r.stderr).strip()
    except (OSError, subprocess.TimeoutExpired):
        return ""


def _first_match(text, pattern):
    m = re.search(pattern, text)
    return m.group(1) if m else None


def _dpkg(pkg):
    v = _out(["dpkg-query", "-W", "-f=${Version}", pkg])
    return v if v and "no packages found" not in v.lower() else None


def versions(oleo_bin, btrfs_fuse_bin):
    """Versions of everything that shapes a number. Tools without a --version
    (fs_mark, zfs-fuse) are read from their Debian package."""
    v = {
        "kernel": platform.release(),
        "fio": _out(["fio", "--version"]) if which("fio") else None,
        "dbench": _first_match(_out(["dbench", "--help"]), r"dbench version (\S+)") if which("dbench") else None,
        "fs_mark": (_dpkg("fsmark") or "present, version unknown") if which("fs_mark") else None,
        "btrfs-progs": _first_match(_out(["btrfs", "--version"]), r"(v[\d.]+)") if which("btrfs") else None,
        "xfsprogs": _first_match(_out(["mkfs.xfs", "-V"]), r"version ([\d.]+)") if which("mkfs.xfs") else None,
        "e2fsprogs": _dpkg("e2fsprogs"),
        "fuse2fs": _dpkg("fuse2fs"),
        "zfs-fuse": _dpkg("zfs-fuse"),
        "fuse3": _dpkg("fuse3"),
        "btrfs-fuse": (_out([btrfs_fuse_bin, "--version"]) or "present") if btrfs_fuse_bin else None,
        "oleo": None,
        "python": platform.python_version(),
        # Whether the kernel offers FUSE over io_uring (the oleo target turns it on).
        "fuse_enable_uring": _read_param("/sys/module/fuse/parameters/enable_uring"),
    }
    if oleo_bin and os.path.isfile(oleo_bin):
        v["oleo"] = _out([oleo_bin, "--version"]).splitlines()[0:1] or ["unknown"]
        v["oleo"] = v["oleo"][0] if v["oleo"] else "unknown"
        repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(oleo_bin))))
        rev = _out(["git", "-C", repo, "rev-parse", "--short", "HEAD"])
        if re.fullmatch(r"[0-9a-f]{4,40}", rev or ""):
            dirty = _out(["git", "-C", repo, "status", "--porcelain", "--untracked-files=no"])
            v["oleo_git"] = rev + ("-dirty" if dirty else "")
    return v


def _read_param(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def machine():
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = _first_match(f.read(), r"model name\s*:\s*(.*)") or ""
    except OSError:
        pass
    mem_kib = None
    with open("/proc/meminfo") as f:
        mem_kib = int(_first_match(f.read(), r"MemTotal:\s+(\d+)") or 0)
    return {"hostname": platform.node(), "cpus": os.cpu_count(), "cpu": cpu,
            "mem_GiB": round(mem_kib / 1048576, 1)}


def params_dict(p):
    return dataclasses.asdict(p)
