"""Send and receive (issue 32): a full `btrfs send` of a read-only snapshot and the
`btrfs receive` of that stream, oleo against kernel btrfs.

One source image is built by the kernel (mkfs.btrfs on a direct-IO loop device): a
subvolume `vol` of many small files in many directories plus some large ones, all
incompressible, then a read-only snapshot `snap` of it. It is expensive (4 GiB at full
scale), so it is kept in the work dir between runs, keyed by its parameters
(`send-src-<key>/`), together with the stream the kernel's send makes of it and a
manifest (file count and bytes).

- send, kernel: the image on a read-only direct-IO loop device, mounted read-only, cold
  cache, wall time of `btrfs send -q WORK/mnt/snap > /dev/null`.
- send, oleo: cold cache, wall time of `oleo send --image IMG /snap > /dev/null` on the
  unmounted image (oleo opens it read-only).
- receive, kernel: a fresh mkfs.btrfs image of the same size on a direct-IO loop
  device, mounted; wall time of `btrfs receive -f STREAM MNT` plus `sync -f MNT` (syncfs
  of that filesystem alone, so other jobs' dirty data is not counted: durable, as oleo's
  receive commits and fdatasyncs its image at its end).
- receive, oleo: a fresh mkfs.btrfs image; wall time of `oleo receive --image IMG -f
  STREAM /`.

Sanity checks, so a broken run gets no number: oleo's stream (counted once per run,
untimed, through a pipe) must be within 5% of the kernel's in size, and a received tree
must hold the source's file count and bytes (a `find` over the kernel's mount, or over
an `oleo mount -o ro` of oleo's image after its receive).
"""

import json
import os
import resource
import subprocess
import sys
import time

from .sysutil import (Cleanup, CmdError, NotApplicable, drop_caches, loop_attach, loop_detach,
                      make_sparse, mount, run, safe_rmtree, umount)
from .targets import GiB, MiB, FsSpec, Mounted, forget_btrfs_devices, mkfs_btrfs
from .workloads import Metric, Workload

SNAP = "snap"            # the read-only snapshot, at the source's top level
FORMAT = 1               # bump when the source's layout changes: a new cache key

# Fills vol/ with FILES files in DIRS directories (two levels, as a source tree): all
# but LARGE of them small (exponential sizes, mean SMALL_KIB KiB, at most 1 MiB), the
# LARGE rest share what is left of TOTAL_MIB (tens to hundreds of MiB each at full
# scale), in vol/big/. Incompressible bytes from numpy's PCG64 (GB/s), or Python's
# Mersenne Twister where numpy is missing. Prints the manifest as JSON.
_FILL_SCRIPT = r"""
import json, os, sys
root, files, dirs, total_mib, large, small_kib = sys.argv[1], *map(int, sys.argv[2:7])
try:
    import numpy as np
    rng = np.random.default_rng(2026)
    randbytes = rng.bytes
    small = [min(int(x) + 1, 1 << 20) for x in rng.exponential(small_kib * 1024, files - large)]
    weights = list(rng.uniform(0.2, 1.8, large))
except ImportError:
    import random
    rng = random.Random(2026)
    randbytes = rng.randbytes
    small = [min(int(rng.expovariate(1 / (small_kib * 1024))) + 1, 1 << 20) for _ in range(files - large)]
    weights = [rng.uniform(0.2, 1.8) for _ in range(large)]
rest = max(0, total_mib * (1 << 20) - sum(small))
big = [int(rest * w / sum(weights)) for w in weights] if large else []
paths = []
for d in range(dirs):
    p = os.path.join(root, f"t{d // 32:02d}", f"d{d:04d}")
    os.makedirs(p, exist_ok=True)
    paths.append(p)
def write(path, size):
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o644)
    try:
        left = size
        while left:
            n = min(left, 8 << 20)
            os.write(fd, randbytes(n))
            left -= n
    finally:
        os.close(fd)
for i, size in enumerate(small):
    write(os.path.join(paths[i % dirs], f"f{i:06d}.dat"), size)
if big:
    os.makedirs(os.path.join(root, "big"))
for i, size in enumerate(big):
    write(os.path.join(root, "big", f"large{i:03d}.bin"), size)
os.sync()
print(json.dumps({"files": len(small) + len(big), "bytes": sum(small) + sum(big),
                  "dirs": dirs + (dirs + 31) // 32 + (1 if big else 0),
                  "small_bytes": sum(small), "large_bytes": sum(big)}))
"""


def source_key(p):
    return (f"{p.sr_files}f-{p.sr_dirs}d-{p.sr_total_mib}M-{p.sr_large_files}L-"
            f"{p.sr_small_kib}k-v{FORMAT}")


def source_image_bytes(p):
    # the data, metadata (DUP) for the small files, and room for chunk allocation
    return max(4 * GiB, p.sr_total_mib * MiB * 3 // 2 + 2 * GiB)


def count_tree(path, timeout):
    """(regular files, their bytes) under PATH, through `find` in a child."""
    r = run(["find", path, "-type", "f", "-printf", "%s\n"], timeout=timeout)
    sizes = [int(x) for x in r.stdout.split()]
    return len(sizes), sum(sizes)


def loop_attach_ro(image):
    """A read-only direct-IO loop device: the cached source must never change."""
    return run(["losetup", "--show", "-f", "-r", "--direct-io=on", image], timeout=60).stdout.strip()


def mount_source_ro(cl, scratch, image):
    """IMAGE on a read-only loop device, mounted read-only at SCRATCH/mnt."""
    dev = loop_attach_ro(image)
    cl.push(f"detach {dev}", loop_detach, dev)
    cl.push(f"forget {dev}", forget_btrfs_devices, [dev])
    mnt = os.path.join(scratch, "mnt")
    os.makedirs(mnt, exist_ok=True)
    mount(dev, mnt, "btrfs", "ro")
    cl.push(f"umount {mnt}", umount, mnt)
    return mnt


class Source:
    """The cached source image, its snapshot, the kernel's stream of it, the manifest."""

    def __init__(self, d, manifest):
        self.dir = d
        self.image = os.path.join(d, "src.img")
        self.stream = os.path.join(d, "kernel.stream")
        self.m = manifest

    @property
    def stream_bytes(self):
        return self.m["kernel_stream_bytes"]


def source(ctx, p):
    """The Source for P, built (by kernel btrfs) once and kept in the work dir; a failure
    is remembered for the run, like a read data set's."""
    key = ("send-src", source_key(p))
    if key not in ctx._golden:
        ctx._golden[key] = _build_source(ctx, p)
    ok, val = ctx._golden[key]
    if not ok:
        raise NotApplicable(val)
    return val


def _build_source(ctx, p):
    d = os.path.join(ctx.work_dir, f"send-src-{source_key(p)}")
    done = os.path.join(d, "manifest.json")
    if os.path.exists(done):
        with open(done) as f:
            return True, Source(d, json.load(f))
    btrfs = ctx.targets["btrfs"]
    reason = ctx.unavailable(btrfs)
    if reason:
        return False, f"cannot build the send source: {reason}"
    safe_rmtree(d)
    os.makedirs(d)
    src = Source(d, {})
    ctx.log(f"building the send source ({p.sr_files} files, {p.sr_total_mib} MiB) in {d}")
    t0 = time.time()
    budget = max(3600, p.sr_timeout_s * 4)
    cl = Cleanup()
    try:
        make_sparse(src.image, source_image_bytes(p))
        dev = loop_attach(src.image)
        cl.push(f"detach {dev}", loop_detach, dev)
        cl.push(f"forget {dev}", forget_btrfs_devices, [dev])
        run(mkfs_btrfs(FsSpec(0), dev), timeout=600)
        mnt = os.path.join(d, "mnt")
        os.makedirs(mnt, exist_ok=True)
        mount(dev, mnt, "btrfs", None)
        cl.push(f"umount {mnt}", umount, mnt)
        run(["btrfs", "subvolume", "create", os.path.join(mnt, "vol")], timeout=60)
        r = run([sys.executable, "-c", _FILL_SCRIPT, os.path.join(mnt, "vol"), p.sr_files,
                 p.sr_dirs, p.sr_total_mib, p.sr_large_files, p.sr_small_kib], timeout=budget)
        manifest = json.loads(r.stdout)
        run(["btrfs", "subvolume", "snapshot", "-r", os.path.join(mnt, "vol"),
             os.path.join(mnt, SNAP)], timeout=120)
        run(["sync"], timeout=600)
        files, nbytes = count_tree(os.path.join(mnt, SNAP), budget)
        if (files, nbytes) != (manifest["files"], manifest["bytes"]):
            raise CmdError(["find"], 0, "", f"the snapshot holds {files} files, {nbytes} bytes; "
                           f"{manifest['files']} files, {manifest['bytes']} bytes were written")
        cl.close()
        if cl.errors:
            raise CmdError(["umount"], 0, "", "; ".join(cl.errors))
        # The kernel's stream, from a read-only mount as the send workload mounts it.
        cl = Cleanup()
        mnt = mount_source_ro(cl, d, src.image)
        run(["btrfs", "send", "-q", "-f", src.stream, os.path.join(mnt, SNAP)], timeout=budget)
        cl.close()
        manifest["kernel_stream_bytes"] = os.path.getsize(src.stream)
        manifest["image_bytes"] = source_image_bytes(p)
        manifest["built_s"] = round(time.time() - t0, 1)
        src.m = manifest
        with open(done + ".tmp", "w") as f:
            json.dump(manifest, f)
        os.rename(done + ".tmp", done)
    except (NotApplicable, CmdError, OSError, ValueError) as e:
        cl.close()
        return False, f"building the send source failed: {e}"
    except BaseException:     # Ctrl-C, SIGTERM: unmount and detach, then go on unwinding
        cl.close()
        raise
    if cl.errors:
        return False, f"tearing down the send source build failed: {'; '.join(cl.errors)}"
    ctx.log(f"send source ready in {time.time() - t0:.0f} s: {manifest['files']} files, "
            f"{manifest['bytes'] / MiB:.0f} MiB, kernel stream {manifest['kernel_stream_bytes'] / MiB:.0f} MiB")
    return True, src


def oleo_send_argv(ctx, image):
    return [ctx.oleo_bin, "send", "--image", image, "/" + SNAP]


def oleo_stream(ctx, src, to_file=False):
    """oleo's stream of the source, made once per run and untimed: its size in bytes
    (counted through a pipe, as `| wc -c`), or with TO_FILE the path of a file holding
    it (in WORK/golden/, which goes at the end of the run)."""
    key = ("oleo-stream", src.dir, to_file)
    if key not in ctx._golden:
        argv = oleo_send_argv(ctx, src.image)
        try:
            if to_file:
                os.makedirs(os.path.join(ctx.work_dir, "golden"), exist_ok=True)
                path = os.path.join(ctx.work_dir, "golden", "oleo.stream")
                run(argv + ["-f", path], timeout=max(3600, ctx.p.sr_timeout_s * 2))
                ctx._golden[key] = (True, path)
            else:
                ctx._golden[key] = (True, _count_stdout(argv, max(3600, ctx.p.sr_timeout_s * 2)))
        except (CmdError, OSError) as e:
            ctx._golden[key] = (False, f"oleo's untimed send failed: {e}")
    ok, val = ctx._golden[key]
    if not ok:
        raise NotApplicable(val)
    return val


def _count_stdout(argv, timeout):
    """Bytes ARGV writes to its standard output (a pipe, as `| wc -c`)."""
    with open(os.devnull, "rb") as null:
        p = subprocess.Popen([str(a) for a in argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             stdin=null, process_group=0)
    n, t0 = 0, time.monotonic()
    try:
        while True:
            chunk = p.stdout.read(1 << 20)
            if not chunk:
                break
            n += len(chunk)
            if time.monotonic() - t0 > timeout:
                raise CmdError(argv, None, "", f"timed out after {timeout} s")
        err = p.stderr.read().decode(errors="replace")
        p.wait()
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    if p.returncode != 0:
        raise CmdError(argv, p.returncode, "", err)
    return n


class StreamWorkload(Workload):
    """Common parts of send and receive: oleo and kernel btrfs only, the cached source,
    their own time budget (`sr_timeout_s`)."""
    kind = "stream"
    TARGETS = ("oleo", "btrfs")

    def check(self, target):
        if target.name == "oleo-devfuse":
            return ("oleo send/receive open the image themselves, without FUSE: the oleo row "
                    "is their number")
        if target.name not in self.TARGETS:
            return "send/receive: runs on oleo and kernel btrfs only"
        return None

    def budget_s(self):
        return max(self.p.timeout_s, self.p.sr_timeout_s)

    def ready(self, ctx):
        """Builds (or finds) the shared source before the measurement's clock starts."""
        return source(ctx, self.p)

    def describe(self):
        return {"files": self.p.sr_files, "dirs": self.p.sr_dirs, "total_MiB": self.p.sr_total_mib,
                "large_files": self.p.sr_large_files, "small_mean_KiB": self.p.sr_small_kib,
                "cache": "cold"}

    def rates(self, stream_bytes, src, took, cpu):
        return {"stream_MiB_s": stream_bytes / MiB / took,
                "data_MiB_s": src.m["bytes"] / MiB / took,
                "files_per_s": src.m["files"] / took, "wall_s": took, "cpu_s": cpu,
                "stream_MiB": stream_bytes / MiB}


def child_cpu_s():
    """User + system CPU seconds of the harness's waited-for children so far."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def timed(argvs, timeout, stdout_path=None, cwd=None):
    """(wall seconds, CPU seconds) of the commands ARGVS, one after the other (stdout of
    the first to STDOUT_PATH, e.g. /dev/null, if given). The CPU seconds are the
    commands' own, user and system, their threads included (oleo's io_uring workers; the
    kernel's send ioctl runs in btrfs's process), kernel worker threads (writeback, loop
    devices) not: steadier than wall time on a shared machine, and a cost of its own."""
    t0, c0 = time.monotonic(), child_cpu_s()
    for i, argv in enumerate(argvs):
        if stdout_path is None or i > 0:
            run(argv, timeout=max(1.0, timeout - (time.monotonic() - t0)), cwd=cwd)
        else:
            with open(stdout_path, "wb") as out:
                run(argv, timeout=timeout, cwd=cwd, stdout=out)
    return time.monotonic() - t0, child_cpu_s() - c0


class Send(StreamWorkload):
    """Full send of the source's read-only snapshot to /dev/null (see the module)."""
    name = "send"
    metrics = [Metric("stream_MiB_s", "stream MiB/s"), Metric("files_per_s", "files/s"),
               Metric("wall_s", "wall s", False), Metric("cpu_s", "CPU s", False),
               Metric("stream_MiB", "stream MiB")]
    goal = ("oleo", "stream_MiB_s", 1.0)     # issue 32: at least the kernel's

    def prepare(self, ctx, cl, scratch, target, src):
        if target.name == "btrfs":
            return Mounted(target, mount_source_ro(cl, scratch, src.image), image=src.image,
                           scratch=scratch)
        # oleo: the unmounted image itself (oleo send opens it read-only). Its stream is
        # counted once per run, untimed, before the caches are dropped.
        n = oleo_stream(ctx, src)
        if abs(n - src.stream_bytes) > 0.05 * src.stream_bytes:
            raise NotApplicable(f"oleo's stream is {n} bytes, the kernel's {src.stream_bytes}: "
                                "more than 5% apart")
        m = Mounted(target, None, image=src.image, scratch=scratch)
        m.stream_bytes = n
        return m

    def run(self, ctx, m, _):
        src = source(ctx, self.p)
        if m.target.name == "btrfs":
            argv, n = ["btrfs", "send", "-q", os.path.join(m.path, SNAP)], src.stream_bytes
        else:
            argv, n = oleo_send_argv(ctx, m.image), m.stream_bytes
        took, cpu = timed([argv], ctx.remaining(), stdout_path=os.devnull, cwd=m.scratch)
        return self.rates(n, src, took, cpu)


class Receive(StreamWorkload):
    """Receive of a full stream of the source into a fresh filesystem, made durable (see
    the module). Variants: the kernel's stream, and oleo's own (`sr_recv_streams`)."""
    name, variant_name = "receive", "stream"
    metrics = [Metric("stream_MiB_s", "stream MiB/s"), Metric("files_per_s", "files/s"),
               Metric("wall_s", "wall s", False), Metric("cpu_s", "CPU s", False)]
    goal = ("oleo", "stream_MiB_s", 0.8)     # issue 32: at least 0.8x the kernel's

    def variants(self):
        return [s.strip() for s in self.p.sr_recv_streams.split(",") if s.strip()]

    def stream(self, ctx, src, which):
        if which == "kernel":
            return src.stream, src.stream_bytes
        if which == "oleo":
            reason = ctx.unavailable(ctx.targets["oleo"])
            if reason:
                raise NotApplicable(f"no oleo stream to receive: {reason}")
            path = oleo_stream(ctx, src, to_file=True)
            return path, os.path.getsize(path)
        raise NotApplicable(f"unknown stream {which!r} (sr_recv_streams: kernel, oleo)")

    def prepare(self, ctx, cl, scratch, target, src):
        spec = FsSpec(src.m.get("image_bytes", source_image_bytes(self.p)))
        if target.name == "btrfs":
            return target.fresh(cl, scratch, spec)
        image = os.path.join(scratch, "oleo.img")
        make_sparse(image, spec.size_bytes)
        run(mkfs_btrfs(spec, image), timeout=600)
        return Mounted(target, None, image=image, scratch=scratch)

    def run(self, ctx, m, which):
        src = source(ctx, self.p)
        path, n = self.stream(ctx, src, which)
        if which != "kernel":
            drop_caches()     # the stream was just written: cold, as the kernel's
        if m.target.name == "btrfs":
            took, cpu = timed([["btrfs", "receive", "-q", "-f", path, m.path], ["sync", "-f", m.path]],
                              ctx.remaining())
            got = count_tree(os.path.join(m.path, SNAP), ctx.remaining())
        else:
            took, cpu = timed([[ctx.oleo_bin, "receive", "--image", m.image, "-f", path, "/"]],
                              ctx.remaining(), cwd=m.scratch)
            got = self.count_oleo(ctx, m)
        want = (src.m["files"], src.m["bytes"])
        if got != want:
            raise NotApplicable(f"the received tree holds {got[0]} files, {got[1]} bytes; the "
                                f"source {want[0]} files, {want[1]} bytes")
        return self.rates(n, src, took, cpu)

    def count_oleo(self, ctx, m):
        """Files and bytes of oleo's received tree, through a read-only oleo mount."""
        cl = Cleanup()
        try:
            mm = m.target._mount(cl, m.scratch, m.image, "ro")
            return count_tree(os.path.join(mm.path, SNAP), ctx.remaining())
        finally:
            cl.close()
            if cl.errors:
                raise CmdError(["umount"], 0, "", "; ".join(cl.errors))
