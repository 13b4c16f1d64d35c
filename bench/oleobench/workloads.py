"""The workloads: the five seeds, a sequential write, read workloads, and two on a
2-device btrfs (issue 31).

Each workload declares its metrics (key, label, higher-is-better), its variants (the
points of a sweep, e.g. fio job counts), which targets it cannot run on and why, and
runs one measurement on a mounted target. Sizes come from Params only.
"""

import fcntl
import json
import os
import subprocess
import time

from . import requests, tools
from .sysutil import (CmdError, NotApplicable, cpu_busy_seconds, disk_counters, drop_caches,
                      kill_group, read_tail, run, which)
from .targets import GiB, MiB, FsSpec


# The key under which a workload's run returns the FUSE request counts read before and
# after its measured phase (`requests.snapshot`); the runner turns them into the record's
# `fuse_requests` (`requests.per_operation`) and drops the key from the metrics.
REQUESTS = "_fuse_requests"


class Metric:
    def __init__(self, key, label, higher_is_better=True):
        self.key, self.label, self.higher = key, label, higher_is_better


class Workload:
    name = "?"
    seed = None
    kind = "write"              # "write": fresh empty fs; "read": copy of the read data set
    metrics = []
    needs_fs = True             # False: fio data workloads that also run on `raw`
    variant_name = None         # e.g. "jobs"

    def __init__(self, params):
        self.p = params

    def variants(self):
        return [None]

    def check(self, target):
        """Static reason why TARGET cannot run this, or None."""
        if target.only is not None and self.name not in target.only:
            return f"{target.name} is the FUSE transport alone: it runs only {', '.join(target.only)}"
        if target.raw and self.needs_fs:
            return "raw is the disk limit for fio data workloads; this one needs a filesystem"
        if self.kind == "write" and not target.writable:
            return f"{target.name} is a read-only driver"
        if self.kind == "read" and target.family is None:
            return f"{target.name} has no read data set"
        return None

    def spec(self):
        return FsSpec(self.image_bytes())

    def image_bytes(self):
        return 4 * GiB

    def describe(self):
        """Parameters recorded with every result line of this workload."""
        return {}

    def run(self, ctx, m, variant):
        raise NotImplementedError

    # fio helper: raw gets O_DIRECT, as it stands for the disk itself
    def fio(self, ctx, m, opts, timeout, variant=None):
        if m.target.raw:
            opts = dict(opts, direct=1)
        text = tools.fio_jobfile(self.name, opts)
        ctx.save_job(self, m.target, variant, text)
        # --readonly (command line only) makes fio refuse any write: the read data
        # set stays as prepared, raw's included.
        return tools.fio_totals(tools.run_fio(text, m.scratch, timeout,
                                              readonly=self.kind in ("read", "multi")))

    def fio_verify(self, ctx, m, opts, totals, timeout, variant=None):
        """Read back what a write job (run with verify=crc32c, do_verify=0) wrote,
        after sync and dropping the caches, and check fio's per-block header and
        checksum: a target whose data does not read back gets no number, its speed
        goes into the N/A reason. Off with --set verify_writes=0.

        The read-back job is the write job with verify_only=1 and no size, so each
        job reads its file as long as it is (a runtime cap may have stopped jobs at
        different points); together they must cover all that was written."""
        if not self.p.verify_writes:
            return
        drop_caches()
        vopts = {k: v for k, v in opts.items() if k not in ("runtime", "fsync", "end_fsync", "size")}
        vopts.update(verify_only=1, do_verify=1)
        if m.target.raw:
            vopts["direct"] = 1
        text = tools.fio_jobfile(self.name, vopts)
        ctx.save_job(self, m.target, "verify" if variant is None else f"{variant}-verify", text)
        wrote = totals["write"]["io_MiB"]
        why = (f"data did not read back after sync + drop_caches (the write ran at "
               f"{totals['write']['MiB_s']:.1f} MiB/s, {wrote:.0f} MiB)")
        try:
            back = tools.fio_totals(tools.run_fio(text, m.scratch, timeout))
        except CmdError as e:
            raise NotApplicable(f"{why}: {e}") from None
        if back["read"]["io_MiB"] < wrote:
            raise NotApplicable(f"{why}: only {back['read']['io_MiB']:.0f} MiB verified")


class FsyncWrite(Workload):
    name, seed, needs_fs, variant_name = "fsync-write", "000", False, "jobs"
    metrics = [Metric("write_MiB_s", "write MiB/s"),
               # What each fsync costs the disk under every target's image (host block
               # device counters, so the same ruler for kernel and FUSE targets).
               Metric("fsyncs_per_flush", "fsyncs per disk flush"),
               Metric("disk_KiB_per_fsync", "disk KiB written per fsync", higher_is_better=False)]

    def variants(self):
        return list(self.p.fsync_jobs)

    def image_bytes(self):
        # Sparse: only what is written takes room.
        return max(2 * GiB, (max(self.p.fsync_jobs) * self.p.fsync_job_mib + 1024) * MiB)

    def spec(self):
        # seed 000: mkfs -d single -m single, mount -o ssd
        return FsSpec(self.image_bytes(), ["-d", "single", "-m", "single"], "ssd")

    def describe(self):
        return {"runtime_s": self.p.fsync_runtime_s, "job_MiB": self.p.fsync_job_mib,
                "bs": "64k", "fsync": 1}

    def run(self, ctx, m, jobs):
        # Time based: the runtime ends the run, the files never run out.
        opts = {
            "rw": "write", "fsync": 1, "fallocate": "none", "group_reporting": 1,
            "direct": 0, "bs": "64k", "ioengine": "sync", "size": f"{self.p.fsync_job_mib}M",
            "directory": m.path, "numjobs": jobs, "thread": True,
            "runtime": self.p.fsync_runtime_s,
        }
        if self.p.verify_writes:
            opts.update(verify="crc32c", do_verify=0, verify_state_save=0)  # see fio_verify
        before = disk_counters(m.scratch)
        r0 = requests.snapshot(m)
        t = self.fio(ctx, m, opts, timeout=min(ctx.remaining(), self.p.fsync_runtime_s + 300),
                     variant=f"jobs{jobs}")
        r1 = requests.snapshot(m)
        after = disk_counters(m.scratch)
        self.fio_verify(ctx, m, opts, t, ctx.remaining(), variant=f"jobs{jobs}")
        out = {"write_MiB_s": t["write"]["MiB_s"], "written_MiB": t["write"]["io_MiB"],
               "runtime_s": t["runtime_s"], REQUESTS: (r0, r1)}
        # fio fsyncs after every 64 KiB write.
        fsyncs = t["write"]["io_MiB"] * 16
        if before and after and fsyncs > 0:
            flushes = after[1] - before[1]
            if flushes > 0:
                out["fsyncs_per_flush"] = fsyncs / flushes
            out["disk_KiB_per_fsync"] = (after[0] - before[0]) / 1024 / fsyncs
        return out


class SeqWrite(Workload):
    """One big sequential buffered write ending in an fsync (`dd bs=1M conv=fsync`):
    the throughput of the write path itself, page cache to disk, rather than of
    fsync latency (fsync-write) or metadata (fsmark-create)."""
    name, needs_fs = "seq-write", False
    metrics = [Metric("write_MiB_s", "write MiB/s (incl. final fsync)")]
    goal = ("oleo", "write_MiB_s", 0.7)   # the target: oleo >= 0.7x kernel btrfs

    def image_bytes(self):
        # the file, plus room for metadata and btrfs's chunk allocation
        return max(4 * GiB, self.p.seqw_file_mib * MiB * 3 // 2 + 2 * GiB)

    def describe(self):
        return {"file_MiB": self.p.seqw_file_mib, "bs": "1M", "end_fsync": 1,
                "max_runtime_s": self.p.seqw_max_runtime_s}

    def run(self, ctx, m, _):
        # fio's runtime includes the end_fsync, so MiB/s is size / (writes + fsync).
        # fallocate=none: plain writes into a new file, as dd does.
        opts = {
            "rw": "write", "bs": "1M", "ioengine": "psync", "direct": 0, "end_fsync": 1,
            "fallocate": "none", "size": f"{self.p.seqw_file_mib}M",
            "filename": os.path.join(m.path, "seq-write.bin"),
            "runtime": self.p.seqw_max_runtime_s,
        }
        if self.p.verify_writes:
            opts.update(verify="crc32c", do_verify=0, verify_state_save=0)  # see fio_verify
        r0 = requests.snapshot(m)
        t = self.fio(ctx, m, opts, timeout=ctx.remaining())
        r1 = requests.snapshot(m)
        self.fio_verify(ctx, m, opts, t, ctx.remaining())
        return {"write_MiB_s": t["write"]["MiB_s"], "written_MiB": t["write"]["io_MiB"],
                "runtime_s": t["runtime_s"], REQUESTS: (r0, r1)}


class FsmarkCreate(Workload):
    """fs_mark as seed 001 runs it: empty files, one thread per directory, no sync; each
    loop's rate is reported, so a rate that falls as the filesystem fills shows."""
    name, seed = "fsmark-create", "001"
    sync = 0                    # fs_mark -S: 0 no sync, 1 fsync before close
    metrics = [Metric("files_per_s", "files/s (all loops)"),
               # host block device counters, as fsync-write: the same ruler for all targets
               Metric("flushes_per_kfile", "disk flushes per 1000 files", higher_is_better=False)]
    goal = ("oleo", "files_per_s", 0.5)    # issue 11: at least half of kernel btrfs

    def shape(self):
        return self.p.fsmark_threads, self.p.fsmark_files, self.p.fsmark_loops

    def describe(self):
        threads, files, loops = self.shape()
        return {"threads": threads, "files_per_thread": files, "loops": loops,
                "tool": f"fs_mark -S {self.sync} -s 0 -k"}

    def check(self, target):
        r = super().check(target)
        if r is None and not which("fs_mark"):
            r = "fs_mark not installed (run bench/run --setup; Debian package fsmark)"
        return r

    def image_bytes(self):
        threads, files, loops = self.shape()
        return max(4 * GiB, threads * files * loops * 16 * 1024)

    def run(self, ctx, m, _):
        threads, files, loops = self.shape()
        # Relative directory names, run from the mount: fs_mark refuses directory
        # paths of 40 bytes or more.
        dirs = []
        for i in range(1, threads + 1):
            dirs += ["-d", f"d{i}"]
        argv = ["fs_mark", "-S", self.sync, "-s", "0", "-k", "-t", threads,
                "-n", files, "-L", loops,
                "-l", os.path.join(m.scratch, "fs_mark.log")] + dirs
        before = disk_counters(m.scratch)
        r0 = requests.snapshot(m)
        r = run(argv, cwd=m.path, timeout=ctx.remaining())
        r1 = requests.snapshot(m)
        after = disk_counters(m.scratch)
        rows = tools.parse_fs_mark(r.stdout)
        if len(rows) != loops:
            raise CmdError(argv, r.returncode, r.stdout, f"expected {loops} result rows, "
                           f"got {len(rows)}: {r.stderr.strip()[-200:]}")
        want = threads * files * loops
        if self.p.verify_writes:
            # the files are kept (-k): after sync + drop_caches they must all be there
            drop_caches()
            f = run(["find"] + dirs[1::2] + ["-type", "f"], cwd=m.path, timeout=ctx.remaining(),
                    check=False)
            have = f.stdout.count("\n")
            if have != want or f.returncode != 0:
                raise NotApplicable(f"fs_mark created {want} files but {have} are there after sync + "
                                    f"drop_caches{': ' + f.stderr.strip()[:200] if f.returncode else ''}")
        res = {f"loop{i + 1}_files_per_s": rate for i, (_, rate) in enumerate(rows)}
        res[REQUESTS] = (r0, r1)
        # Overall rate = all files over the summed loop times.
        per_loop = threads * files
        res["files_per_s"] = per_loop * len(rows) / sum(per_loop / rate for _, rate in rows)
        if before and after:
            res["flushes_per_kfile"] = (after[1] - before[1]) * 1000 / want
        return res


class FsmarkFsync(FsmarkCreate):
    """fs_mark -S 1: the same, with an fsync of each file before its close (seed 001's
    other mode): the log tree's cost per new file and its directory entry."""
    name, seed = "fsmark-fsync", "001"
    sync = 1
    goal = None

    def shape(self):
        return self.p.fsmark_threads, self.p.fsmark_sync_files, self.p.fsmark_sync_loops


class UringRandrw(Workload):
    """Seed 002: fio O_DIRECT through io_uring, iodepth 64, on one preallocated file of a
    nodatacow mount. Variants: the seed's randrw with its bssplit, 4 KiB random writes
    alone, 1 MiB sequential writes. CPU per GiB moved counts every CPU's busy time over
    the run (fio's, the kernel's and a FUSE server's alike)."""
    name, seed, needs_fs, variant_name = "uring-randrw", "002", False, "io"
    metrics = [Metric("read_MiB_s", "read MiB/s"), Metric("write_MiB_s", "write MiB/s"),
               Metric("cpu_s_per_GiB", "CPU s per GiB", False)]
    SHAPES = {
        "seed": {"rw": "randrw"},
        "randwrite4k": {"rw": "randwrite", "bs": "4k"},
        "seqwrite1m": {"rw": "write", "bs": "1m"},
    }

    def variants(self):
        return list(self.SHAPES)

    def image_bytes(self):
        return max(2 * GiB, self.p.uring_file_mib * MiB * 5 // 4 + GiB)

    def spec(self):
        # seed 002: mkfs -R free-space-tree -O no-holes, mount -o ssd,nodatacow.
        return FsSpec(self.image_bytes(), ["-R", "free-space-tree", "-O", "no-holes"],
                      "ssd,nodatacow")

    def describe(self):
        return {"jobs": self.p.uring_jobs, "file_MiB": self.p.uring_file_mib,
                "runtime_s": self.p.uring_runtime_s, "iodepth": self.p.uring_iodepth,
                "bssplit": self.p.uring_bssplit}

    def run(self, ctx, m, io):
        opts = {
            "fsync": 0, "fallocate": "posix", "group_reporting": 1,
            "direct": 1, "ioengine": "io_uring", "iodepth": self.p.uring_iodepth,
            "bssplit": self.p.uring_bssplit, "filesize": f"{self.p.uring_file_mib}M",
            "runtime": self.p.uring_runtime_s, "time_based": True,
            # directory before filename: fio joins them as it reads the options.
            "directory": m.path, "filename": "foobar",
            "numjobs": self.p.uring_jobs, "thread": True,
        }
        opts.update(self.SHAPES[io])
        if "bs" in opts:
            del opts["bssplit"]
        # fio lays the file out before it starts the clock: CPU is counted from the run
        # alone by a first pass that only lays out (the timed pass finds the file ready).
        lay = {k: v for k, v in opts.items() if k not in ("runtime", "time_based")}
        lay["io_size"] = "4k"
        self.fio(ctx, m, lay, timeout=ctx.remaining(), variant=f"{io}-layout")
        before = cpu_busy_seconds()
        r0 = requests.snapshot(m)
        t = self.fio(ctx, m, opts, timeout=ctx.remaining(), variant=io)
        r1 = requests.snapshot(m)
        cpu = cpu_busy_seconds() - before
        moved = (t["read"]["io_MiB"] + t["write"]["io_MiB"]) / 1024
        return {"read_MiB_s": t["read"]["MiB_s"], "write_MiB_s": t["write"]["MiB_s"],
                "read_iops": t["read"]["iops"], "write_iops": t["write"]["iops"],
                "read_MiB": t["read"]["io_MiB"], "written_MiB": t["write"]["io_MiB"],
                "cpu_s_per_GiB": cpu / moved if moved > 0 else None, REQUESTS: (r0, r1)}


BTRFS_IOC_SYNC = 0x9408      # _IO(0x94, 8): commit the transaction


class CompressWrite(Workload):
    """Sequential buffered 1 MiB writes under `compress=zstd` (issue 14), time-based over
    a file that wraps around, ending in an fsync: data fio makes compressible
    (buffer_compress_percentage, fresh buffers each write) and data that does not shrink.
    The ratio is the disk space the file takes (statfs used, after a sync) over its size,
    the same ruler for the kernel and oleo. Compression is btrfs's: other filesystems run
    the same writes uncompressed, for reference."""
    name, needs_fs, variant_name = "compress-write", True, "data"
    metrics = [Metric("write_MiB_s", "write MiB/s"),
               Metric("disk_ratio", "disk bytes / file bytes", False),
               Metric("cpu_s_per_GiB", "CPU s per GiB", False)]
    goal = ("oleo", "write_MiB_s", 1.0)   # issue 14: at least the kernel's, compressible

    def variants(self):
        return ["compressible", "incompressible"]

    def image_bytes(self):
        return max(4 * GiB, self.p.compw_file_mib * MiB * 3 // 2 + 2 * GiB)

    def spec(self):
        return FsSpec(self.image_bytes(), [], "ssd,compress=zstd")

    def describe(self):
        return {"file_MiB": self.p.compw_file_mib, "runtime_s": self.p.compw_runtime_s,
                "bs": "1M", "mount": "compress=zstd",
                "buffer_compress_percentage": self.p.compw_compress_percentage}

    @staticmethod
    def used_bytes(m):
        """Used bytes after everything written is committed: BTRFS_IOC_SYNC on btrfs
        targets (kernel and oleo take it alike; space the overwritten data held is then
        free again), syncfs elsewhere."""
        if m.target.family == "btrfs":
            fd = os.open(m.path, os.O_RDONLY)
            try:
                fcntl.ioctl(fd, BTRFS_IOC_SYNC)
            finally:
                os.close(fd)
        else:
            run(["sync", "-f", m.path], timeout=600)
        st = os.statvfs(m.path)
        return (st.f_blocks - st.f_bfree) * st.f_frsize

    def run(self, ctx, m, data):
        opts = {
            "rw": "write", "bs": "1M", "ioengine": "psync", "direct": 0, "end_fsync": 1,
            "fallocate": "none", "size": f"{self.p.compw_file_mib}M",
            "filename": os.path.join(m.path, "compress-write.bin"),
            "runtime": self.p.compw_runtime_s, "time_based": True, "refill_buffers": 1,
        }
        if data == "compressible":
            opts["buffer_compress_percentage"] = self.p.compw_compress_percentage
        used = self.used_bytes(m)
        before = cpu_busy_seconds()
        r0 = requests.snapshot(m)
        t = self.fio(ctx, m, opts, timeout=ctx.remaining(), variant=data)
        r1 = requests.snapshot(m)
        cpu = cpu_busy_seconds() - before
        took = self.used_bytes(m) - used
        size = os.stat(opts["filename"]).st_size
        moved = t["write"]["io_MiB"] / 1024
        return {"write_MiB_s": t["write"]["MiB_s"], "written_MiB": t["write"]["io_MiB"],
                "disk_ratio": took / size if size else None,
                "cpu_s_per_GiB": cpu / moved if moved > 0 else None, REQUESTS: (r0, r1)}


class Dbench(Workload):
    name, seed, variant_name = "dbench", "003", "clients"
    metrics = [Metric("MB_s", "MB/s"), Metric("max_latency_ms", "max latency ms", False),
               Metric("flushes_per_s", "disk flushes/s", False)]

    def variants(self):
        return list(self.p.dbench_clients)

    def check(self, target):
        r = super().check(target)
        if r is None and not which("dbench"):
            r = "dbench not installed (run bench/run --setup)"
        return r

    def image_bytes(self):
        return max(4 * GiB, max(self.p.dbench_clients) * 64 * MiB)

    def describe(self):
        return {"runtime_s": self.p.dbench_runtime_s, "loadfile": tools.dbench_loadfile()}

    def run(self, ctx, m, clients):
        argv = ["dbench", "-D", m.path, "-t", self.p.dbench_runtime_s]
        lf = tools.dbench_loadfile()
        if lf:
            argv += ["-c", lf]
        # dbench runs for runtime_s and cleans up within seconds (everywhere in the
        # 2026-11-21 run); a minute more means a hung target
        before = disk_counters(m.scratch)
        r0 = requests.snapshot(m)
        r = run(argv + [clients], cwd=m.scratch, check=False,
                timeout=min(ctx.remaining(), self.p.dbench_runtime_s + 60))
        r1 = requests.snapshot(m)
        after = disk_counters(m.scratch)
        try:
            mbs, lat = tools.parse_dbench(r.stdout)
        except ValueError:
            raise CmdError(r.args, r.returncode, r.stdout, r.stderr) from None
        if r.returncode != 0:
            raise CmdError(r.args, r.returncode, r.stdout, r.stderr)
        out = {"MB_s": mbs, "max_latency_ms": lat, "ops": tools.parse_dbench_ops(r.stdout),
               REQUESTS: (r0, r1)}
        if before and after:
            out["flushes_per_s"] = (after[1] - before[1]) / self.p.dbench_runtime_s
        return out


class SnapshotUnderWrite(Workload):
    name, seed, variant_name = "snapshot-under-write", "004", "writer"
    metrics = [Metric("snapshot_s", "snapshot wall s", False)]

    def variants(self):
        # seed 004's sequential writer, and four random writers beside it.
        return ["seq", "rand4"]

    def check(self, target):
        r = super().check(target)
        if r is None and not target.snapshots:
            r = getattr(target, "no_snapshots_reason", None) or f"{target.name} has no snapshots"
        return r

    def image_bytes(self):
        return max(4 * GiB, self.p.snap_file_mib * MiB * 3 // 2 + 2 * GiB)

    def describe(self):
        return {"delay_s": self.p.snap_delay_s, "file_MiB": self.p.snap_file_mib,
                "fio": "libaio iodepth=32 bs=4k buffered; seq: rw=write, 1 job; "
                       "rand4: rw=randwrite, 4 jobs with a file each (file_MiB split)"}

    def run(self, ctx, m, writer):
        sub = m.target.subvolume(m, "sub")
        # seed 004's writer: buffered 4 KiB sequential writes, libaio QD32; or 4 random ones.
        jobs = 4 if writer == "rand4" else 1
        opts = {"ioengine": "libaio", "iodepth": 32, "bs": "4k",
                "rw": "randwrite" if writer == "rand4" else "write",
                "size": f"{self.p.snap_file_mib // jobs}M", "direct": 0, "thread": True,
                "numjobs": jobs, "time_based": True, "runtime": self.p.snap_max_runtime_s,
                "group_reporting": 1}
        if jobs == 1:
            opts["filename"] = os.path.join(sub, "testfile")
        else:
            opts["directory"] = sub
        text = tools.fio_jobfile(self.name, opts)
        ctx.save_job(self, m.target, None, text)
        job = os.path.join(m.scratch, "job.fio")
        with open(job, "w") as f:
            f.write(text)
        log = open(os.path.join(m.scratch, "fio.out"), "wb")
        fio = subprocess.Popen(["fio", job], stdout=log, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL, process_group=0)
        log.close()
        try:
            time.sleep(self.p.snap_delay_s)
            if fio.poll() is not None:
                raise CmdError(["fio", job], fio.returncode, "",
                               read_tail(os.path.join(m.scratch, "fio.out")))
            dirty = _dirty_mib()
            argv = m.target.snapshot_argv(m, sub, os.path.join(m.path, "snap"))
            t0 = time.monotonic()
            run(argv, timeout=ctx.remaining())
            took = time.monotonic() - t0
            if fio.poll() is not None and fio.returncode != 0:
                raise CmdError(["fio", job], fio.returncode, "",
                               read_tail(os.path.join(m.scratch, "fio.out")))
        finally:
            kill_group(fio, grace=30)
        return {"snapshot_s": took, "dirty_MiB_at_snapshot": dirty}


class ReadWhileWrite(Workload):
    """Reads of one file, alone and then while other threads write with an fsync after
    every 64 KiB (so the filesystem commits, or logs, all the time): readers must not
    wait for writers or commits. O_DIRECT reads, so every read reaches the filesystem
    rather than the page cache; the file is written and synced first, caches dropped."""
    name, needs_fs = "read-while-write", True
    metrics = [Metric("busy_read_MiB_s", "read MiB/s while writing"),
               Metric("quiet_read_MiB_s", "read MiB/s alone"),
               Metric("read_kept", "busy / alone")]
    goal = ("oleo", "read_kept", 0.8, "absolute")   # the target, not a ratio to btrfs

    def image_bytes(self):
        p = self.p
        return max(4 * GiB, (p.rww_file_mib + p.rww_writers * p.fsync_job_mib + 2048) * MiB)

    def describe(self):
        p = self.p
        return {"file_MiB": p.rww_file_mib, "read_bs": "1M", "direct": 1,
                "writers": p.rww_writers, "write_bs": "64k", "fsync": 1,
                "runtime_s": p.rww_runtime_s}

    def _reader(self, path):
        return {"rw": "read", "bs": "1M", "ioengine": "psync", "direct": 1,
                "filename": path, "size": f"{self.p.rww_file_mib}M", "time_based": True,
                "runtime": self.p.rww_runtime_s}

    def run(self, ctx, m, _):
        p = self.p
        path = os.path.join(m.path, "read-me.bin")
        self.fio(ctx, m, {"rw": "write", "bs": "1M", "ioengine": "psync", "direct": 0,
                          "end_fsync": 1, "fallocate": "none", "filename": path,
                          "size": f"{p.rww_file_mib}M"}, timeout=ctx.remaining(), variant="layout")
        drop_caches()
        quiet = self.fio(ctx, m, self._reader(path), timeout=ctx.remaining(), variant="quiet")
        drop_caches()
        writers = {"new_group": True, "rw": "write", "fsync": 1, "fallocate": "none",
                   "bs": "64k", "ioengine": "sync", "direct": 0,
                   "size": f"{p.fsync_job_mib}M", "directory": m.path,
                   "numjobs": p.rww_writers, "thread": True, "group_reporting": 1,
                   "time_based": True, "runtime": p.rww_runtime_s}
        text = (tools.fio_jobfile("reader", self._reader(path))
                + tools.fio_jobfile("writers", writers))
        ctx.save_job(self, m.target, "busy", text)
        report = tools.run_fio(text, m.scratch, timeout=ctx.remaining())
        busy = tools.fio_totals({"jobs": [j for j in report["jobs"] if j["jobname"] == "reader"]})
        wrote = tools.fio_totals({"jobs": [j for j in report["jobs"] if j["jobname"] == "writers"]})
        q, b = quiet["read"]["MiB_s"], busy["read"]["MiB_s"]
        return {"busy_read_MiB_s": b, "quiet_read_MiB_s": q,
                "read_kept": b / q if q > 0 else 0.0,
                "write_MiB_s_meanwhile": wrote["write"]["MiB_s"]}


def _dirty_mib():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("Dirty:"):
                return int(line.split()[1]) / 1024
    return None


# ---------------------------------------------------------------- read workloads

class SeqRead(Workload):
    name, kind, needs_fs = "seq-read", "read", False
    metrics = [Metric("read_MiB_s", "read MiB/s")]

    def describe(self):
        return {"file_MiB": self.p.seq_file_mib, "bs": "1M", "cache": "cold"}

    def run(self, ctx, m, _):
        t = self.fio(ctx, m, {
            "rw": "read", "bs": "1M", "ioengine": "psync", "direct": 0,
            "filename": os.path.join(m.path, "data", "seq.bin"),
            "size": f"{self.p.seq_file_mib}M",
        }, timeout=ctx.remaining())
        return {"read_MiB_s": t["read"]["MiB_s"]}


class RandRead(Workload):
    name, kind, needs_fs = "rand-read", "read", False
    metrics = [Metric("iops", "IOPS"), Metric("read_MiB_s", "read MiB/s")]

    def describe(self):
        return {"file_MiB": self.p.seq_file_mib, "bs": "4k", "runtime_s": self.p.rand_runtime_s,
                "cache": "cold"}

    def run(self, ctx, m, _):
        t = self.fio(ctx, m, {
            "rw": "randread", "bs": "4k", "ioengine": "psync", "direct": 0,
            "filename": os.path.join(m.path, "data", "seq.bin"),
            "size": f"{self.p.seq_file_mib}M", "time_based": True,
            "runtime": self.p.rand_runtime_s,
        }, timeout=ctx.remaining())
        return {"iops": t["read"]["iops"], "read_MiB_s": t["read"]["MiB_s"]}


class MetaWalk(Workload):
    name, kind = "meta-walk", "read"
    metrics = [Metric("files_per_s", "files/s"), Metric("elapsed_s", "elapsed s", False)]

    def describe(self):
        return {"files": self.p.walk_files, "dirs": self.p.walk_dirs, "cache": "cold",
                "tool": "find -type f -printf (lstat per entry)"}

    def run(self, ctx, m, _):
        # find's -printf of inode and size forces an lstat of every entry.
        argv = ["find", os.path.join(m.path, "tree"), "-type", "f", "-printf", "%i %s\n"]
        t0 = time.monotonic()
        r = run(argv, timeout=ctx.remaining())
        took = time.monotonic() - t0
        n = r.stdout.count("\n")
        if n != self.p.walk_files:
            raise CmdError(argv, 0, "", f"found {n} files, expected {self.p.walk_files}")
        return {"files_per_s": n / took, "elapsed_s": took}


# ---------------------------------------------------------------- multi-device (issue 31)

# 2-device data sets: data profile per variant, metadata always raid1
RAID_MKFS = {"raid0": ["-d", "raid0", "-m", "raid1"], "raid1": ["-d", "raid1", "-m", "raid1"]}


def multi_dataset(profile, file_mib):
    """(key, devices, bytes per device image, mkfs.btrfs options, file MiB) of a 2-device
    data set for runner.Context.multi_golden; sets of the same key are built once."""
    return (f"{profile}-{file_mib}M", 2, max(2 * GiB, file_mib * MiB * 2 + GiB),
            RAID_MKFS[profile], file_mib)


class MultiDevice(Workload):
    """A workload on a 2-device btrfs the kernel filled once (runner.Context.multi_golden),
    on fresh copies of its image files: kernel btrfs on a loop device per image (`-o
    device=`), oleo on the image files themselves (`oleo mount IMG1 IMG2 MNT`)."""
    kind = "multi"

    def check(self, target):
        r = super().check(target)
        if r is None and not getattr(target, "multi_device", False):
            r = "a 2-device btrfs: runs on oleo (and oleo-devfuse) and kernel btrfs only"
        return r

    def multi_dataset(self, variant):
        raise NotImplementedError

    def multi_mode(self, target):
        return "ro"


class RaidSeqRead(MultiDevice):
    """Sequential 1 MiB reads of one file on 2-device raid0 and raid1, time based.
    O_DIRECT: the file is read over and over for the whole runtime, and a buffered pass
    after the first would come from the page cache; oleo reads its image files with
    O_DIRECT for a caller's O_DIRECT reads, the kernel through direct-IO loop devices,
    so every pass reaches the disk on both. Two depths: one read at a time (psync, what
    `cp` or `dd` does: each read waits for the last, so a FUSE round trip adds to every
    read), and eight in flight (libaio, what a database or `fio` does)."""
    name, variant_name = "raid-seq-read", "profile"
    DEPTHS = {"": 1, "-qd8": 8}
    metrics = [Metric("read_MiB_s", "read MiB/s")]
    goal = ("oleo", "read_MiB_s", 1.0)    # issue 31: at least the kernel's

    def variants(self):
        return [p + d for d in self.DEPTHS for p in RAID_MKFS]

    @staticmethod
    def split(variant):
        """(profile, depth) of a variant: `raid0`, `raid1-qd8`."""
        profile, _, depth = variant.partition("-")
        return profile, RaidSeqRead.DEPTHS["-" + depth if depth else ""]

    def multi_dataset(self, variant):
        return multi_dataset(self.split(variant)[0], self.p.raid_file_mib)

    def describe(self):
        return {"file_MiB": self.p.raid_file_mib, "runtime_s": self.p.raid_runtime_s,
                "bs": "1M", "direct": 1, "devices": 2, "metadata": "raid1", "cache": "cold",
                "depth": "1 (psync); -qd8: 8 (libaio)"}

    def run(self, ctx, m, profile):
        depth = self.split(profile)[1]
        t = self.fio(ctx, m, {
            "rw": "read", "bs": "1M", "direct": 1,
            "ioengine": "psync" if depth == 1 else "libaio", "iodepth": depth,
            "filename": os.path.join(m.path, "data", "seq.bin"),
            "size": f"{self.p.raid_file_mib}M", "time_based": True,
            "runtime": self.p.raid_runtime_s,
        }, timeout=min(ctx.remaining(), self.p.raid_runtime_s + 120), variant=profile)
        return {"read_MiB_s": t["read"]["MiB_s"], "read_MiB": t["read"]["io_MiB"]}


class Scrub(MultiDevice):
    """Scrub of a 2-device RAID1 (data and metadata): `btrfs scrub start -B` on the
    kernel's read-write mount, `oleo scrub start --image A --image B` on the unmounted
    images (read-write: it verifies every copy and would repair a bad one; its wall time
    includes opening and closing the filesystem, the kernel's excludes the mount). The
    rate is bytes scrubbed (both copies, data and tree blocks, as each tool counts them
    with -R) over the command's wall time. A scrub that finds errors on the clean copy,
    or does not cover both copies of the file, gets no number."""
    name = "scrub"
    metrics = [Metric("scrub_MiB_s", "scrub MiB/s (bytes scrubbed / wall s)"),
               Metric("scrubbed_MiB", "MiB scrubbed (all copies)"),
               Metric("wall_s", "wall s", False)]
    goal = ("oleo", "scrub_MiB_s", 1.0)   # issue 31: at least the kernel's
    ERRORS = ("read_errors", "csum_errors", "verify_errors", "super_errors", "malloc_errors",
              "uncorrectable_errors", "corrected_errors")

    def check(self, target):
        r = super().check(target)
        if r is None and target.name == "oleo-devfuse":
            r = "oleo scrub opens the images itself, without FUSE: the oleo row is its number"
        return r

    def multi_dataset(self, _):
        return multi_dataset("raid1", self.p.scrub_data_mib)

    def multi_mode(self, target):
        return target.scrub_mode

    def describe(self):
        return {"data_MiB": self.p.scrub_data_mib, "devices": 2, "profile": "raid1/raid1",
                "cache": "cold", "tool": "btrfs scrub start -B -R; oleo scrub start -B -R --image x2"}

    def run(self, ctx, m, _):
        argv = m.target.scrub_argv(m)
        t0 = time.monotonic()
        # oleo keeps the scrub's result per fsid under XDG_STATE_HOME: the scratch dir
        r = run(argv, timeout=ctx.remaining(), cwd=m.scratch,
                env=dict(os.environ, XDG_STATE_HOME=m.scratch))
        took = time.monotonic() - t0
        try:
            c = tools.parse_scrub_raw(r.stdout)
        except ValueError as e:
            raise CmdError(argv, r.returncode, r.stdout, f"{e}: {r.stderr.strip()}") from None
        errors = {k: c[k] for k in self.ERRORS if c.get(k)}
        if errors:
            raise NotApplicable(f"the scrub reported errors on a clean copy: {errors}")
        want = 2 * self.p.scrub_data_mib * MiB
        if c["data_bytes_scrubbed"] < want:
            raise NotApplicable(f"the scrub read {c['data_bytes_scrubbed'] / MiB:.0f} MiB of data, "
                                f"less than both copies of the {self.p.scrub_data_mib} MiB file")
        scrubbed = (c["data_bytes_scrubbed"] + c.get("tree_bytes_scrubbed", 0)) / MiB
        return {"scrub_MiB_s": scrubbed / took, "scrubbed_MiB": scrubbed, "wall_s": took,
                "data_MiB_scrubbed": c["data_bytes_scrubbed"] / MiB,
                "tree_MiB_scrubbed": c.get("tree_bytes_scrubbed", 0) / MiB}


def commit_all(m):
    """Makes what a write workload wrote durable: sync(2) pushes every page cache (FUSE's
    writeback cache into its server included), then btrfs's own sync ioctl commits the
    btrfs targets (syncfs never reaches a FUSE server; oleo answers BTRFS_IOC_SYNC)."""
    run(["sync"], timeout=600)
    if m.target.family == "btrfs" and which("btrfs"):
        run(["btrfs", "filesystem", "sync", m.path], timeout=600)


# A source-like tree: directories of small files, sizes skewed small as in a kernel tree.
_TREE_SCRIPT = r"""
import os, random, sys, tarfile, io
files, dirs, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
rng = random.Random(2026)
with tarfile.open(out + ".tmp", "w") as tar:
    for d in range(dirs):
        info = tarfile.TarInfo(f"src/d{d // 50:03d}/s{d:05d}")
        info.type, info.mode = tarfile.DIRTYPE, 0o755
        tar.addfile(info)
    for i in range(files):
        size = min(int(rng.expovariate(1 / 6000)), 256 * 1024)
        info = tarfile.TarInfo(f"src/d{(i % dirs) // 50:03d}/s{i % dirs:05d}/f{i:06d}.c")
        info.size, info.mode = size, 0o644
        tar.addfile(info, io.BytesIO(rng.randbytes(size)))
os.rename(out + ".tmp", out)
"""


class UntarCopy(Workload):
    """Unpack a source-like tree (tens of thousands of small files) from a tarball on the
    host, then `cp -a` it within the filesystem; each step ends when it is durable
    (`commit_all`). Wall time of each."""
    name = "untar-cp"
    metrics = [Metric("untar_s", "untar s", False), Metric("cp_s", "cp -a s", False)]

    def describe(self):
        return {"files": self.p.untar_files, "dirs": self.p.untar_dirs,
                "tool": "tar -xf; cp -a; sync + btrfs filesystem sync"}

    def image_bytes(self):
        return max(4 * GiB, self.p.untar_files * 64 * 1024)

    def tarball(self, ctx):
        path = os.path.join(ctx.work_dir, f"tree-{self.p.untar_files}-{self.p.untar_dirs}.tar")
        if not os.path.exists(path):
            run(["python3", "-c", _TREE_SCRIPT, self.p.untar_files, self.p.untar_dirs, path],
                timeout=ctx.remaining())
        return path

    def run(self, ctx, m, _):
        tar = self.tarball(ctx)
        r0 = requests.snapshot(m)
        t0 = time.monotonic()
        run(["tar", "-xf", tar, "-C", m.path], timeout=ctx.remaining())
        commit_all(m)
        t1 = time.monotonic()
        run(["cp", "-a", os.path.join(m.path, "src"), os.path.join(m.path, "copy")],
            timeout=ctx.remaining())
        commit_all(m)
        t2 = time.monotonic()
        r1 = requests.snapshot(m)
        n = run(["find", os.path.join(m.path, "copy"), "-type", "f"],
                timeout=ctx.remaining()).stdout.count("\n")
        if n != self.p.untar_files:
            raise NotApplicable(f"the copy holds {n} files, the tarball {self.p.untar_files}")
        return {"untar_s": t1 - t0, "cp_s": t2 - t1, "files": 2 * n, REQUESTS: (r0, r1)}


# One directory: `fill` makes its entries, `ops` times the operations on them (so that
# the FUSE requests of the timed phases can be counted apart from the fills).
_BIGDIR_SCRIPT = r"""
import json, os, sys, time
d, n, runtime, step = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
if step == "fill":
    os.mkdir(d)
    for i in range(n):
        os.close(os.open(os.path.join(d, f"entry-{i:07d}"), os.O_CREAT | os.O_WRONLY, 0o644))
else:
    # Renames, hard links and unlinks of entries spread over the directory.
    ops, i, t0 = 0, 0, time.monotonic()
    while time.monotonic() - t0 < runtime:
        a = os.path.join(d, f"entry-{(i * 7919) % n:07d}")
        b, c = a + ".renamed", a + ".link"
        os.rename(a, b); os.link(b, c); os.unlink(c); os.rename(b, a)
        ops, i = ops + 4, i + 1
    print(json.dumps({"ops": ops, "s": time.monotonic() - t0}))
"""


class BigDirOps(Workload):
    """Renames, hard links and unlinks in a directory of 100k entries and in one of 100,
    time based: the cost of one operation must not grow with the directory's size."""
    name = "bigdir-ops"
    metrics = [Metric("big_ops_s", "ops/s, big directory"),
               Metric("small_ops_s", "ops/s, 100 entries"),
               Metric("big_over_small", "big / small")]
    goal = ("oleo", "big_over_small", 0.8, "absolute")

    def describe(self):
        return {"entries": self.p.bigdir_entries, "runtime_s": self.p.bigdir_runtime_s,
                "ops": "rename, link, unlink, rename back"}

    def run(self, ctx, m, _):
        rates, counted, ops = {}, [], 0
        for label, n in (("big", self.p.bigdir_entries), ("small", 100)):
            d = os.path.join(m.path, label)
            argv = ["python3", "-c", _BIGDIR_SCRIPT, d, n, self.p.bigdir_runtime_s]
            run(argv + ["fill"], timeout=ctx.remaining())
            r0 = requests.snapshot(m)
            r = json.loads(run(argv + ["ops"], timeout=ctx.remaining()).stdout)
            counted.append((r0, requests.snapshot(m)))
            rates[label] = r["ops"] / r["s"]
            ops += r["ops"]
        out = {"big_ops_s": rates["big"], "small_ops_s": rates["small"],
               "big_over_small": rates["big"] / rates["small"], "ops": ops}
        # The requests of both timed phases, the fills left out.
        if all(a is not None and b is not None for a, b in counted):
            before = [0] * len(counted[0][0])
            after = [sum(b[i] - a[i] for a, b in counted) for i in range(len(before))]
            out[REQUESTS] = (before, after)
        return out


# send and receive (issue 32) live in sendrecv.py, which builds on Workload above
from .sendrecv import Receive, Send  # noqa: E402

ALL = [FsyncWrite, SeqWrite, FsmarkCreate, FsmarkFsync, UntarCopy, BigDirOps, UringRandrw,
       CompressWrite, Dbench,
       SnapshotUnderWrite, ReadWhileWrite, SeqRead, RandRead, MetaWalk, RaidSeqRead, Scrub,
       Send, Receive]
NAMES = [w.name for w in ALL]


# ---------------------------------------------------------------- read data set

def dataset_spec(p):
    return FsSpec(max(2 * GiB, p.seq_file_mib * MiB * 2 + GiB))
