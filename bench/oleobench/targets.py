"""The filesystems under test and how each gets a fresh filesystem.

Every measurement gets its own filesystem in a scratch directory: either a new empty
one (`fresh`, for the write workloads) or a fresh copy of a prepared read data set
(`from_dataset`). Read data sets are built once per run per filesystem family and
shared: kernel btrfs, oleo and btrfs-fuse read byte-identical copies of one btrfs
image; ext4 and fuse2fs of one ext4 image.

A target that cannot do something raises NotApplicable with the reason.
"""

import os
import shlex
import subprocess
import time

from .sysutil import (NotApplicable, copy_sparse, kill_group, loop_attach, loop_detach,
                      make_sparse, mount, mount_options, peak_rss_kib, read_tail, run, umount,
                      wait_for_mount, which)

MiB = 1 << 20
GiB = 1 << 30

# No lazy init: otherwise a kernel thread (or fuse2fs) zeroes inode tables during
# the measurement.
MKFS_EXT4 = ["mkfs.ext4", "-F", "-q", "-E", "lazy_itable_init=0,lazy_journal_init=0"]


class FsSpec:
    """What a workload asks of a fresh filesystem. btrfs options follow each seed's
    script; the other filesystems use their mkfs defaults."""

    def __init__(self, size_bytes, btrfs_mkfs=(), btrfs_mount="ssd"):
        self.size_bytes = size_bytes
        self.btrfs_mkfs = list(btrfs_mkfs)
        self.btrfs_mount = btrfs_mount


class Mounted:
    """A mounted filesystem. `path` is where workloads work; `daemon` the FUSE
    process whose peak RSS is recorded (None for kernel filesystems and raw).
    A multi-device filesystem has all its image files in `images` (`image` is the
    first); an unmounted one (`Target.from_multi` with no mode) has no `path`."""

    def __init__(self, target, path, daemon=None, image=None, scratch=None, images=None):
        self.target, self.path, self.daemon = target, path, daemon
        self.image, self.scratch = image, scratch
        self.images = images if images is not None else ([image] if image else [])
        # Filled by teardown of a FUSE daemon: "unmount_s" (unmount until the daemon
        # exited: oleo commits then) and "warnings" (a daemon that had to be killed or
        # exited non-zero). The runner records it with the measurement.
        self.teardown = {}

    def peak_rss_kib(self):
        return peak_rss_kib(self.daemon.pid) if self.daemon is not None else None


class Target:
    name = "?"
    family = None          # which read data set it reads (None: reads are N/A)
    fuse_stats = False     # answers FUSE_STATS (oleo's transport): requests per operation
    writable = True
    snapshots = False
    raw = False            # fio only, on a host file with O_DIRECT
    only = None            # names of the only workloads it can run (None: any)
    needs = ()             # executables that must exist

    def __init__(self, ctx):
        self.ctx = ctx

    def unavailable(self):
        """Reason this target cannot run at all on this machine, or None."""
        for tool in self.needs:
            if not which(tool):
                return f"{tool} not installed (run bench/run --setup)"
        return None

    def fresh(self, cl, scratch, spec):
        raise NotApplicable(f"{self.name} is read-only")

    def from_dataset(self, cl, scratch, golden):
        raise NotApplicable(f"{self.name} has no read data set")

    # building the shared read data set: only the family's owner does this
    def build_golden(self, cl, scratch, spec):
        raise NotImplementedError

    def subvolume(self, m, name):
        raise NotApplicable(f"{self.name} has no subvolumes/snapshots")

    def snapshot_argv(self, m, src, dst):
        raise NotApplicable(f"{self.name} has no subvolumes/snapshots")

    # multi-device btrfs (issue 31): only oleo and kernel btrfs
    multi_device = False

    def scrub_argv(self, m):
        raise NotApplicable(f"{self.name} has no scrub")

    def from_multi(self, cl, scratch, goldens, mode):
        """Fresh copies of the device images GOLDENS (a multi-device btrfs the kernel
        built), mounted read-only (MODE "ro"), read-write ("rw"), or not at all (None:
        the workload opens the copies itself; `Mounted.images` lists them)."""
        raise NotApplicable(f"{self.name} has no multi-device btrfs")


# ---------------------------------------------------------------- kernel filesystems

def mkfs_btrfs(spec, dev):
    return ["mkfs.btrfs", "-f", "-q"] + spec.btrfs_mkfs + [dev]


class KernelTarget(Target):
    """Kernel filesystem on a loop device (direct IO) over a sparse image file."""
    fstype = None

    def mkfs_argv(self, dev, spec):
        raise NotImplementedError

    def mount_opts(self, spec):
        return None

    def _attach_mount(self, cl, scratch, image, opts, spec=None):
        dev = loop_attach(image)
        cl.push(f"detach {dev}", loop_detach, dev)
        if spec is not None:
            run(self.mkfs_argv(dev, spec), timeout=600)
        mnt = os.path.join(scratch, "mnt")
        os.makedirs(mnt, exist_ok=True)
        mount(dev, mnt, self.fstype, opts)
        cl.push(f"umount {mnt}", umount, mnt)
        return Mounted(self, mnt, image=image, scratch=scratch)

    def fresh(self, cl, scratch, spec):
        image = os.path.join(scratch, f"{self.name}.img")
        make_sparse(image, spec.size_bytes)
        return self._attach_mount(cl, scratch, image, self.mount_opts(spec), spec)

    def build_golden(self, cl, scratch, spec):
        return self.fresh(cl, scratch, spec)

    def from_dataset(self, cl, scratch, golden):
        image = os.path.join(scratch, f"{self.name}.img")
        copy_sparse(golden, image)
        # Read-only: the read workloads must not change the copy, and oleo and
        # btrfs-fuse mount read-only too.
        return self._attach_mount(cl, scratch, image, "ro")


class Btrfs(KernelTarget):
    name, fstype, family, snapshots = "btrfs", "btrfs", "btrfs", True
    needs = ("mkfs.btrfs", "btrfs")

    def mkfs_argv(self, dev, spec):
        return mkfs_btrfs(spec, dev)

    def mount_opts(self, spec):
        return spec.btrfs_mount

    def subvolume(self, m, name):
        path = os.path.join(m.path, name)
        run(["btrfs", "subvolume", "create", path], timeout=60)
        return path

    def snapshot_argv(self, m, src, dst):
        return ["btrfs", "subvolume", "snapshot", "-r", src, dst]

    # Multi-device (issue 31): a loop device (direct IO) per image file, the first
    # mounted with `-o device=` naming the others.
    multi_device = True

    def _attach_mount_multi(self, cl, scratch, images, opts, mkfs_opts=None):
        devs = []
        for image in images:
            dev = loop_attach(image)
            cl.push(f"detach {dev}", loop_detach, dev)
            devs.append(dev)
        # The kernel keeps scanned btrfs devices registered by fsid; every copy of a
        # data set has the same fsid, so each measurement unregisters its own devices
        # (after the unmount, before the detach) rather than leaving stale paths.
        cl.push(f"forget {' '.join(devs)}", forget_btrfs_devices, devs)
        if mkfs_opts is not None:
            run(["mkfs.btrfs", "-f", "-q"] + list(mkfs_opts) + devs, timeout=600)
        mnt = os.path.join(scratch, "mnt")
        os.makedirs(mnt, exist_ok=True)
        mount(devs[0], mnt, "btrfs", ",".join([o for o in [opts] if o]
                                              + [f"device={d}" for d in devs[1:]]))
        cl.push(f"umount {mnt}", umount, mnt)
        return Mounted(self, mnt, image=images[0], scratch=scratch, images=images)

    def build_multi(self, cl, scratch, n, size_bytes, mkfs_opts):
        """A new N-device btrfs (mkfs.btrfs MKFS_OPTS over N sparse images), mounted."""
        images = [os.path.join(scratch, f"dev{i}.img") for i in range(n)]
        for image in images:
            make_sparse(image, size_bytes)
        return self._attach_mount_multi(cl, scratch, images, None, mkfs_opts)

    def from_multi(self, cl, scratch, goldens, mode):
        if mode is None:
            raise NotApplicable("kernel btrfs works on a mounted filesystem")
        images = []
        for i, golden in enumerate(goldens):
            images.append(os.path.join(scratch, f"{self.name}-{i}.img"))
            copy_sparse(golden, images[-1])
        return self._attach_mount_multi(cl, scratch, images, mode)

    scrub_mode = "rw"       # kernel scrub runs on a mount, read-write so it would repair

    def scrub_argv(self, m):
        return ["btrfs", "scrub", "start", "-B", "-R", m.path]


def forget_btrfs_devices(devs):
    """Unregister DEVS from the kernel's btrfs device list (`btrfs device scan
    --forget`); a device it does not know is not an error."""
    run(["btrfs", "device", "scan", "--forget"] + list(devs), check=False, timeout=60)


class Xfs(KernelTarget):
    name, fstype, family = "xfs", "xfs", "xfs"
    needs = ("mkfs.xfs",)

    def mkfs_argv(self, dev, spec):
        return ["mkfs.xfs", "-f", "-q", dev]


class Ext4(KernelTarget):
    name, fstype, family = "ext4", "ext4", "ext4"
    needs = ("mkfs.ext4",)

    def mkfs_argv(self, dev, spec):
        return MKFS_EXT4 + [dev]


# ---------------------------------------------------------------- FUSE daemons

def spawn_fuse(cl, argv, mnt, log, what, timeout=60.0, grace=15.0, teardown=None):
    """Start a FUSE daemon in the foreground (so we own its pid for peak RSS and
    can always stop it), in a process group of its own but in the harness's session like
    the workloads (see `run`), and wait until its mount appears. At teardown the daemon
    gets GRACE seconds to exit after the unmount; what happened goes in the dict
    TEARDOWN (see Mounted)."""
    os.makedirs(mnt, exist_ok=True)
    logf = open(log, "ab")
    proc = subprocess.Popen([str(a) for a in argv], stdout=logf, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, process_group=0)
    logf.close()
    cl.push(f"stop {what}", stop_fuse, proc, mnt, grace, teardown, log)
    wait_for_mount(mnt, proc, timeout, what, log)
    return proc


def stop_fuse(proc, mnt, grace=15.0, teardown=None, log=None):
    teardown = {} if teardown is None else teardown
    was_running = proc.poll() is None
    t0 = time.monotonic()
    aborted = False
    try:
        aborted = umount(mnt, fuse=True)
    finally:
        if aborted:
            # a hung daemon whose connection was aborted has nothing to commit
            teardown.setdefault("warnings", []).append("unmount hung: FUSE connection aborted")
            grace = min(grace, 10.0)
        try:
            proc.wait(timeout=grace)
            if was_running:
                teardown["unmount_s"] = round(time.monotonic() - t0, 2)
                if proc.returncode != 0:
                    teardown.setdefault("warnings", []).append(
                        f"daemon exited with status {proc.returncode} after unmount"
                        + (f": {read_tail(log)}" if log else ""))
        except subprocess.TimeoutExpired:
            kill_group(proc)
            teardown.setdefault("warnings", []).append(
                f"daemon still running {grace:.0f} s after unmount; killed")


class Fuse2fs(Target):
    name, family = "fuse2fs", "ext4"
    needs = ("fuse2fs", "mkfs.ext4", "fusermount3")

    def fresh(self, cl, scratch, spec):
        image = os.path.join(scratch, "fuse2fs.img")
        make_sparse(image, spec.size_bytes)
        run(MKFS_EXT4 + [image], timeout=600)
        return self._mount(cl, scratch, image, [])

    def from_dataset(self, cl, scratch, golden):
        image = os.path.join(scratch, "fuse2fs.img")
        copy_sparse(golden, image)
        return self._mount(cl, scratch, image, ["-o", "ro"])

    def _mount(self, cl, scratch, image, opts):
        mnt = os.path.join(scratch, "mnt")
        m = Mounted(self, mnt, image=image, scratch=scratch)
        m.daemon = spawn_fuse(cl, ["fuse2fs", image, mnt, "-f"] + opts, mnt,
                              os.path.join(scratch, "fuse2fs.log"), "fuse2fs", teardown=m.teardown)
        return m


class BtrfsFuse(Target):
    """rustutils' btrfs-fuse: read-only, so only the read workloads."""
    name, family, writable = "btrfs-fuse", "btrfs", False

    def unavailable(self):
        if not self.ctx.btrfs_fuse_bin:
            return "btrfs-fuse not installed (bench/run --setup runs cargo install btrfs-fuse)"
        return None

    def from_dataset(self, cl, scratch, golden):
        image = os.path.join(scratch, "btrfs-fuse.img")
        copy_sparse(golden, image)
        mnt = os.path.join(scratch, "mnt")
        argv = [self.ctx.btrfs_fuse_bin, "-f", image, mnt]  # -f: foreground, we own the pid
        m = Mounted(self, mnt, image=image, scratch=scratch)
        m.daemon = spawn_fuse(cl, argv, mnt, os.path.join(scratch, "btrfs-fuse.log"), "btrfs-fuse",
                              teardown=m.teardown)
        return m


class Oleo(Target):
    """oleo: reads the same btrfs image as the kernel (`-o ro`). Write workloads
    mount a fresh mkfs.btrfs image read-write (`-o rw` explicitly, so an image oleo
    cannot write fails the mount with oleo's reason instead of falling back to
    read-only) with the kernel target's mount options; oleo ignores the btrfs options
    it does not implement (ssd) and honours the rest (nodatacow). Snapshots: through
    the commands --oleo-subvol-cmd and --oleo-snapshot-cmd give (by default `oleo
    subvolume create` and `oleo subvolume snapshot`)."""
    name, family = "oleo", "btrfs"
    fuse_stats = True
    # FUSE over io_uring (the kernel offers it once the fuse module's enable_uring is
    # set, which _mount does); oleo-devfuse is the same server on /dev/fuse alone.
    transport_opts = ["fuse_uring=on"]
    no_snapshots_reason = ("no oleo subvolume/snapshot command templates given "
                           "(--oleo-subvol-cmd, --oleo-snapshot-cmd)")
    unmount_grace_s = 120   # the daemon commits the running transaction at unmount

    @property
    def snapshots(self):
        return bool(self.ctx.oleo_subvol_cmd and self.ctx.oleo_snapshot_cmd)

    def unavailable(self):
        b = self.ctx.oleo_bin
        if not (os.path.isfile(b) and os.access(b, os.X_OK)):
            return f"oleo binary not found at {b} (cargo build --release -p oleo-cli, or --oleo PATH)"
        return None

    def _mount(self, cl, scratch, image, opts, more_images=()):
        if "fuse_uring=on" in self.transport_opts:
            enable_fuse_uring()
        opts = ",".join([opts] + self.transport_opts)
        mnt = os.path.join(scratch, "mnt")
        # a multi-device filesystem: every image file, then the mount point
        argv = [self.ctx.oleo_bin, "mount", "-f", "-o", opts, image, *more_images, mnt]
        m = Mounted(self, mnt, image=image, scratch=scratch, images=[image, *more_images])
        m.daemon = spawn_fuse(cl, argv, mnt, os.path.join(scratch, "oleo.log"),
                              f"oleo mount -o {opts}", grace=self.unmount_grace_s,
                              teardown=m.teardown)
        if opts.startswith("rw") and "ro" in mount_options(mnt):
            raise NotApplicable("oleo mount -o rw gave a read-only mount")
        return m

    def fresh(self, cl, scratch, spec):
        image = os.path.join(scratch, "oleo.img")
        make_sparse(image, spec.size_bytes)
        run(mkfs_btrfs(spec, image), timeout=600)
        opts = ["rw"] + [o for o in spec.btrfs_mount.split(",") if o]
        return self._mount(cl, scratch, image, ",".join(opts))

    def from_dataset(self, cl, scratch, golden):
        image = os.path.join(scratch, "oleo.img")
        copy_sparse(golden, image)
        return self._mount(cl, scratch, image, "ro")

    # Multi-device (issue 31): oleo opens the image files themselves, no loop devices:
    # `oleo mount -o ro IMG1 IMG2 MNT`, or no mount (oleo scrub takes the images).
    multi_device = True

    def from_multi(self, cl, scratch, goldens, mode):
        images = []
        for i, golden in enumerate(goldens):
            images.append(os.path.join(scratch, f"oleo-{i}.img"))
            copy_sparse(golden, images[-1])
        if mode is None:
            return Mounted(self, None, image=images[0], scratch=scratch, images=images)
        return self._mount(cl, scratch, images[0], mode, more_images=images[1:])

    # `oleo scrub start` takes the unmounted image files (read-write: it verifies every
    # copy and would rewrite a bad one), not a mount
    scrub_mode = None

    def scrub_argv(self, m):
        argv = [self.ctx.oleo_bin, "scrub", "start", "-B", "-R"]
        for image in m.images:
            argv += ["--image", image]
        return argv

    # Subvolumes through oleo's own CLI (FUSE cannot pass btrfs's ioctls; `oleo subvolume`
    # talks to the daemon); the command lines are templates (bench/run's defaults).
    def subvolume(self, m, name):
        path = os.path.join(m.path, name)
        run(self._cmd(self.ctx.oleo_subvol_cmd, path=path, mnt=m.path, image=m.image), timeout=60)
        return path

    def snapshot_argv(self, m, src, dst):
        return self._cmd(self.ctx.oleo_snapshot_cmd, src=src, dst=dst, mnt=m.path, image=m.image)

    def _cmd(self, template, **kw):
        return shlex.split(template.format(oleo=shlex.quote(self.ctx.oleo_bin),
                                           **{k: shlex.quote(v) for k, v in kw.items()}))


class OleoDevFuse(Oleo):
    """oleo serving /dev/fuse only (`fuse_uring=off`): the transport FUSE had before
    io_uring, and what a kernel without it (before 6.14) gets."""
    name = "oleo-devfuse"
    transport_opts = ["fuse_uring=off"]


ENABLE_URING = "/sys/module/fuse/parameters/enable_uring"


def enable_fuse_uring():
    """Lets the kernel offer FUSE over io_uring to new mounts (Linux 6.14+); a no-op
    where the parameter is missing (oleo then serves /dev/fuse, which its log says)."""
    try:
        with open(ENABLE_URING) as f:
            if f.read().strip() == "Y":
                return
        with open(ENABLE_URING, "w") as f:
            f.write("Y")
    except OSError:
        pass


class ZfsFuse(Target):
    """zfs-fuse with a pool on a file vdev. The daemon is a per-system singleton
    and is started and stopped for every measurement, which also empties its ARC
    (cold cache). The pool always mounts at WORK/zfs-mnt."""
    name, family, snapshots = "zfs-fuse", "zfs", True
    needs = ("zfs-fuse", "zpool", "zfs", "fusermount3")
    pool = "oleobench"

    def unavailable(self):
        r = super().unavailable()
        if r:
            return r
        mine = self._pidfile()
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                try:
                    comm = open(f"/proc/{pid}/comm").read().strip()
                except OSError:
                    continue
                if comm == "zfs-fuse" and not (os.path.exists(mine) and open(mine).read().strip() == pid):
                    return f"a zfs-fuse daemon not started by the harness is running (pid {pid})"
        return None

    def _pidfile(self):
        return os.path.join(self.ctx.work_dir, "zfs-fuse.pid")

    def _mnt(self):
        return os.path.join(self.ctx.work_dir, "zfs-mnt")

    def _daemon(self, cl, scratch):
        log = os.path.join(scratch, "zfs-fuse.log")
        logf = open(log, "ab")
        proc = subprocess.Popen(["zfs-fuse", "--no-daemon", "--no-kstat-mount"], stdout=logf,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                process_group=0)
        logf.close()
        with open(self._pidfile(), "w") as f:
            f.write(str(proc.pid))
        cl.push("stop zfs-fuse", self._stop_daemon, proc)
        deadline = time.time() + 30
        while True:  # ready when zpool can talk to it
            if proc.poll() is not None:
                raise NotApplicable(f"zfs-fuse exited with status {proc.returncode}: {read_tail(log)}")
            r = run(["zpool", "list", "-H", "-o", "name"], check=False, timeout=30)
            if r.returncode == 0:
                # A pool left in zfs-fuse's cache by an older harness or a manual
                # run would block the name; ours are made with cachefile=none.
                if self.pool in r.stdout.split():
                    self._export()
                return proc
            if time.time() > deadline:
                raise NotApplicable("zfs-fuse daemon did not answer zpool within 30 s")
            time.sleep(0.2)

    def _stop_daemon(self, proc):
        try:
            umount(self._mnt(), fuse=True)
        finally:
            kill_group(proc, grace=20)
            try:
                os.unlink(self._pidfile())
            except OSError:
                pass

    def _export(self):
        if run(["zpool", "export", self.pool], check=False, timeout=300).returncode != 0:
            run(["zpool", "export", "-f", self.pool], check=False, timeout=300)

    def fresh(self, cl, scratch, spec):
        vdir = os.path.join(scratch, "vdev")
        os.makedirs(vdir, exist_ok=True)
        vdev = os.path.join(vdir, "vdev.img")
        make_sparse(vdev, spec.size_bytes)
        proc = self._daemon(cl, scratch)
        os.makedirs(self._mnt(), exist_ok=True)
        run(["zpool", "create", "-f", "-o", "cachefile=none", "-m", self._mnt(), self.pool, vdev],
            timeout=300)
        cl.push("export pool", self._export)
        wait_for_mount(self._mnt(), None, 30, "zfs pool")
        return Mounted(self, self._mnt(), daemon=proc, image=vdev, scratch=scratch)

    def build_golden(self, cl, scratch, spec):
        return self.fresh(cl, scratch, spec)

    def from_dataset(self, cl, scratch, golden):
        # `zpool import -d DIR` scans DIR, so the copy sits alone in its own dir.
        vdir = os.path.join(scratch, "vdev")
        os.makedirs(vdir, exist_ok=True)
        vdev = os.path.join(vdir, "vdev.img")
        copy_sparse(golden, vdev)
        proc = self._daemon(cl, scratch)
        os.makedirs(self._mnt(), exist_ok=True)
        run(["zpool", "import", "-o", "cachefile=none", "-d", vdir, self.pool], timeout=300)
        cl.push("export pool", self._export)
        wait_for_mount(self._mnt(), None, 30, "zfs pool")
        return Mounted(self, self._mnt(), daemon=proc, image=vdev, scratch=scratch)

    def subvolume(self, m, name):
        run(["zfs", "create", f"{self.pool}/{name}"], timeout=120)
        path = os.path.join(m.path, name)
        wait_for_mount(path, None, 30, "zfs dataset")
        return path

    def snapshot_argv(self, m, src, dst):
        # zfs snapshots are always read-only; src is the dataset's mount path
        return ["zfs", "snapshot", f"{self.pool}/{os.path.basename(src)}@{os.path.basename(dst)}"]


class FuseOverlay(Target):
    """The FUSE layer alone: fuse-overlayfs (libfuse, multithreaded, /dev/fuse) passing
    everything through to kernel xfs on a loop device. A FUSE filesystem cannot beat
    this by much: its figures are the ceiling a workload has through FUSE here."""
    name, family = "fuse-overlayfs", None
    needs = ("fuse-overlayfs", "mkfs.xfs", "fusermount3")

    def fresh(self, cl, scratch, spec):
        lower = Xfs(self.ctx)._attach_mount(cl, os.path.join(scratch, "xfs"),
                                            _image(scratch, spec), None, spec)
        dirs = {d: os.path.join(lower.path, d) for d in ("lower", "upper", "work")}
        for d in dirs.values():
            os.makedirs(d, exist_ok=True)
        mnt = os.path.join(scratch, "mnt")
        opts = ",".join(f"{k}dir={v}" for k, v in dirs.items())
        m = Mounted(self, mnt, image=lower.image, scratch=scratch)
        m.daemon = spawn_fuse(cl, ["fuse-overlayfs", "-f", "-o", opts, mnt], mnt,
                              os.path.join(scratch, "fuse-overlayfs.log"), "fuse-overlayfs",
                              teardown=m.teardown)
        return m


class FuseFloor(Target):
    """The FUSE transport alone: `nullfs` (crates/fuse/examples/nullfs.rs) serves names
    and contents from hash maps over oleo's own transport with oleo's INIT and open flags,
    and writes nothing to any disk (its fsync returns at once). What fs_mark or dbench
    reaches on it is the most any FUSE filesystem can reach here over that transport;
    oleo's distance to it is what oleo itself costs."""
    name, family = "fuse-floor", None
    fuse_stats = True
    only = ("fsmark-create", "dbench", "bigdir-ops", "untar-cp")
    transport = []

    def _bin(self):
        return os.path.join(os.path.dirname(self.ctx.oleo_bin), "examples", "nullfs")

    def unavailable(self):
        if not os.access(self._bin(), os.X_OK):
            return (f"{self._bin()} not built (cargo build --release -p oleo-fuse "
                    "--example nullfs)")
        return None

    def fresh(self, cl, scratch, spec):
        if not self.transport:
            enable_fuse_uring()
        mnt = os.path.join(scratch, "mnt")
        m = Mounted(self, mnt, scratch=scratch)
        m.daemon = spawn_fuse(cl, [self._bin(), mnt] + self.transport, mnt,
                              os.path.join(scratch, "nullfs.log"), "nullfs",
                              teardown=m.teardown)
        return m


class FuseFloorDevFuse(FuseFloor):
    """The same over /dev/fuse alone (oleo-devfuse's transport)."""
    name = "fuse-floor-devfuse"
    transport = ["devfuse"]


def _image(scratch, spec):
    os.makedirs(os.path.join(scratch, "xfs"), exist_ok=True)
    image = os.path.join(scratch, "xfs", "xfs.img")
    make_sparse(image, spec.size_bytes)
    return image


class Raw(Target):
    """The physical limit: fio with O_DIRECT on a plain file in the work dir."""
    name, family, raw = "raw", "raw", True
    needs = ("fio",)

    def fresh(self, cl, scratch, spec):
        path = os.path.join(scratch, "raw")
        os.makedirs(path, exist_ok=True)
        return Mounted(self, path, scratch=scratch)

    build_golden = fresh

    def from_dataset(self, cl, scratch, golden):
        # O_DIRECT reads bypass the page cache, so the prepared file is read in
        # place rather than copied.
        return Mounted(self, golden, scratch=scratch)


ALL = [Oleo, OleoDevFuse, Btrfs, Xfs, Ext4, Fuse2fs, ZfsFuse, BtrfsFuse, FuseOverlay,
       FuseFloor, FuseFloorDevFuse, Raw]
NAMES = [t.name for t in ALL]
