"""FUSE requests per operation (issue 41): for the FUSE targets that can be asked (oleo,
oleo-devfuse, fuse-floor, fuse-floor-devfuse, all on oleo's own transport), the requests
of each opcode the kernel sent during the measured phase, divided by the workload's
operations, recorded as `fuse_requests` beside the figure and tabled in report.md.

The counts come from the FUSE_STATS ioctl on the mount's root (root only; the transport
answers it, crates/fuse/src/transport/counts.rs), read just before and just after the
measured phase. Reading them costs the mount an OPENDIR (oleo answers the first with
ENOSYS and sees no more), the IOCTL and a RELEASEDIR: three requests per measurement, in
the counts. Other FUSE daemons (fuse2fs, btrfs-fuse, zfs-fuse, fuse-overlayfs) cannot be
asked, nor can kernel filesystems: their records have no `fuse_requests`.
"""

import fcntl
import os
import struct

SLOTS = 64          # counts.rs SLOTS: opcode n < 64 in slot n, slot 0 the rest
FUSE_STATS = (2 << 30) | ((SLOTS * 8) << 16) | (ord("o") << 8) | 18   # _IOR('o', 18, 512)
# the server's nanoseconds per slot (subvol_ioctl.rs FUSE_STATS_TIME), same layout
FUSE_STATS_TIME = (2 << 30) | ((SLOTS * 8) << 16) | (ord("o") << 8) | 19

# fuse.h's opcode names (FUSE_ left off), as counts.rs::opcode_name.
NAMES = {
    0: "OTHER", 1: "LOOKUP", 2: "FORGET", 3: "GETATTR", 4: "SETATTR", 5: "READLINK",
    6: "SYMLINK", 8: "MKNOD", 9: "MKDIR", 10: "UNLINK", 11: "RMDIR", 12: "RENAME", 13: "LINK",
    14: "OPEN", 15: "READ", 16: "WRITE", 17: "STATFS", 18: "RELEASE", 20: "FSYNC",
    21: "SETXATTR", 22: "GETXATTR", 23: "LISTXATTR", 24: "REMOVEXATTR", 25: "FLUSH",
    26: "INIT", 27: "OPENDIR", 28: "READDIR", 29: "RELEASEDIR", 30: "FSYNCDIR", 31: "GETLK",
    32: "SETLK", 33: "SETLKW", 34: "ACCESS", 35: "CREATE", 36: "INTERRUPT", 37: "BMAP",
    38: "DESTROY", 39: "IOCTL", 40: "POLL", 41: "NOTIFY_REPLY", 42: "BATCH_FORGET",
    43: "FALLOCATE", 44: "READDIRPLUS", 45: "RENAME2", 46: "LSEEK", 47: "COPY_FILE_RANGE",
    48: "SETUPMAPPING", 49: "REMOVEMAPPING", 50: "SYNCFS", 51: "TMPFILE", 52: "STATX",
    53: "COPY_FILE_RANGE_64",
}


def opcode_name(n):
    return NAMES.get(n, f"OP{n}")


def _written_4k(metrics, params):
    return (metrics.get("written_MiB") or 0) * 256


def _moved_4k(metrics, params):
    return ((metrics.get("read_MiB") or 0) + (metrics.get("written_MiB") or 0)) * 256


def _files(metrics, params):
    return params.get("threads", 0) * params.get("files_per_thread", 0) * params.get("loops", 0)


# What one operation is, per workload: the one place it is defined. (label, count from the
# measurement's metrics and params). Workloads not listed get no requests per operation.
OPERATIONS = {
    "fsmark-create": ("file created", _files),
    "fsmark-fsync": ("file created", _files),
    # dbench's own count (the sum of its Operation table, the timed phase only); the
    # requests cover its whole run, warmup and cleanup included: an upper bound
    "dbench": ("dbench op", lambda m, p: m.get("ops")),
    "fsync-write": ("4 KiB written", _written_4k),
    "seq-write": ("4 KiB written", _written_4k),
    "compress-write": ("4 KiB written", _written_4k),
    "uring-randrw": ("4 KiB read or written", _moved_4k),
    # every file tar wrote and every file cp wrote; the requests cover both steps and the
    # syncs that end them
    "untar-cp": ("file written", lambda m, p: m.get("files")),
    # rename, link, unlink or rename back, in both directories (the fills not counted)
    "bigdir-ops": ("rename, link or unlink", lambda m, p: m.get("ops")),
}


def _slots(fd, ioctl):
    buf = bytearray(SLOTS * 8)
    fcntl.ioctl(fd, ioctl, buf, True)
    return list(struct.unpack(f"<{SLOTS}Q", bytes(buf)))


def snapshot(m):
    """The mount's request counts by opcode slot, followed by the server's nanoseconds by
    slot where it reports them (2 x SLOTS values then), or None for a target that cannot
    be asked (or a server too old to answer)."""
    if not getattr(m.target, "fuse_stats", False) or not m.path:
        return None
    try:
        fd = os.open(m.path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return None
    try:
        counts = _slots(fd, FUSE_STATS)
    except OSError:
        os.close(fd)
        return None
    try:
        counts += _slots(fd, FUSE_STATS_TIME)
    except OSError:
        pass
    finally:
        os.close(fd)
    return counts


def per_operation(workload, before, after, metrics, params):
    """The record's `fuse_requests`: the operation, how many, the requests of each opcode
    during the measured phase, and per operation; None without counts or operations."""
    if before is None or after is None or workload not in OPERATIONS:
        return None
    label, count = OPERATIONS[workload]
    ops = count(metrics, params or {})
    if not ops:
        return None
    n = min(len(before), len(after), SLOTS)
    delta = {opcode_name(i): after[i] - before[i] for i in range(n) if after[i] > before[i]}
    out = {
        "operation": label,
        "ops": ops,
        "requests": delta,
        "per_op": {k: v / ops for k, v in delta.items()},
        "total_per_op": sum(delta.values()) / ops,
    }
    if min(len(before), len(after)) >= 2 * SLOTS:
        # the server's own time on those requests (parse to reply handed to the transport)
        ns = sum(after[i] - before[i] for i in range(SLOTS, 2 * SLOTS))
        out["server_us_per_op"] = ns / ops / 1000
    return out
