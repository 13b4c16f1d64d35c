#!/usr/bin/env python3
"""One kind of metadata operation in a loop, one thread, as a shell loop or a package
manager does them: operations per second, and with --pid the CPU time the FUSE daemon
spent per operation (its utime and stime from /proc). docs/benchmarks.md ("Where oleo's
time goes") uses it, under `perf stat -e cpu-migrations`, to compare oleo with nullfs.

    bench/fuse-ops.py MNT KIND [--n 5000] [--pid PID]

KIND: chmod (0600 and back), rename (a to ax and back), link (a to al, unlink al),
create (a new empty file), mkdir (a new directory). Each iteration is two operations
except create and mkdir (one). Works in MNT/ops-KIND, which it makes.
"""

import argparse
import os
import time

KINDS = ("chmod", "rename", "link", "create", "mkdir")


def cpu_ticks(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]), int(fields[12])   # utime, stime (fields 14 and 15)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mnt")
    ap.add_argument("kind", choices=KINDS)
    ap.add_argument("--n", type=int, default=5000)
    ap.add_argument("--pid", type=int, help="the FUSE daemon, for its CPU per operation")
    a = ap.parse_args()
    d = os.path.join(a.mnt, f"ops-{a.kind}")
    os.makedirs(d, exist_ok=True)
    f = os.path.join(d, "a")
    os.close(os.open(f, os.O_CREAT | os.O_WRONLY, 0o644))
    before = cpu_ticks(a.pid) if a.pid else None
    t0 = time.monotonic()
    for i in range(a.n):
        if a.kind == "chmod":
            os.chmod(f, 0o600)
            os.chmod(f, 0o644)
        elif a.kind == "rename":
            os.rename(f, f + "x")
            os.rename(f + "x", f)
        elif a.kind == "link":
            os.link(f, f + "l")
            os.unlink(f + "l")
        elif a.kind == "create":
            os.close(os.open(os.path.join(d, f"c{i}"), os.O_CREAT | os.O_WRONLY, 0o644))
        else:
            os.mkdir(os.path.join(d, f"m{i}"))
    dt = time.monotonic() - t0
    ops = a.n * (1 if a.kind in ("create", "mkdir") else 2)
    line = f"{a.kind}: {ops / dt:.0f} ops/s"
    if before:
        after = cpu_ticks(a.pid)
        tick_us = 1e6 / os.sysconf("SC_CLK_TCK")
        user, system = ((x - y) * tick_us / ops for x, y in zip(after, before))
        line += f", daemon CPU per operation: user {user:.1f} us, system {system:.1f} us"
    print(line)


if __name__ == "__main__":
    main()
