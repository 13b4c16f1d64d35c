"""Running commands, mounts, loop devices, caches and clean teardown.

Everything the harness mounts, attaches or starts is registered on a Cleanup stack
right after it exists, so an exception, a timeout or Ctrl-C unwinds it in reverse
order. `reap_stale` handles what a killed harness (kill -9) left behind.
"""

import os
import signal
import subprocess
import time


class CmdError(Exception):
    """An external command failed: the target or tool could not do it (-> N/A)."""

    def __init__(self, argv, rc, out, err):
        self.argv, self.rc, self.out, self.err = argv, rc, out, err
        lines = [l.strip() for l in (err or out or "").strip().splitlines() if l.strip()]
        # The first line is often the real complaint, the last ones fio's summary.
        tail = lines if len(lines) <= 3 else [lines[0], "..."] + lines[-2:]
        super().__init__(f"{_cmd_name(argv)} exited {rc}: {' | '.join(tail)[:400]}")


class CmdTimeout(CmdError):
    def __init__(self, argv, timeout, out="", err=""):
        super().__init__(argv, None, out, err)
        self.args = (f"{_cmd_name(argv)} timed out after {timeout:.0f} s",)


def _cmd_name(argv):
    """Program and subcommand words, without paths: short enough for a table footnote."""
    words = [os.path.basename(str(argv[0]))] if argv else ["?"]
    for a in argv[1:3]:
        a = str(a)
        if a.startswith("-") or "/" in a:
            break
        words.append(a)
    return " ".join(words)


class NotApplicable(Exception):
    """The target cannot run this workload; the message is the recorded reason."""


class Interrupted(BaseException):
    """SIGTERM/SIGHUP turned into an exception so cleanups run like on Ctrl-C."""


def _raise_interrupted(signum, _frame):
    raise Interrupted(f"signal {signum}")


def install_signal_handlers():
    # SIGINT explicitly too: a harness started in the background from a script
    # inherits SIGINT ignored, and Ctrl-C must still tear everything down.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _raise_interrupted)


def run(argv, timeout=600, check=True, cwd=None, env=None, input=None, stdout=None):
    """Run a command to completion, capturing output. Kills its whole process group
    on timeout so a wedged fio/dbench does not outlive the measurement.

    Every child gets a process group of its own but stays in the harness's session, as
    FUSE servers do (see `spawn_fuse`): with sched_autogroup a session is a CPU group, and
    a workload in another group than the FUSE server it calls pays for every request
    hand-off between the groups (tar -x through oleo: 23 s instead of 10 s). A user's
    shell runs both in one session.

    STDOUT: a file to write the command's output to (e.g. /dev/null) instead of
    capturing it; the result's stdout is then empty."""
    argv = [str(a) for a in argv]
    p = subprocess.Popen(argv, stdout=subprocess.PIPE if stdout is None else stdout,
                         stderr=subprocess.PIPE,
                         stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
                         text=True, cwd=cwd, env=env, process_group=0)
    try:
        out, err = p.communicate(input=input, timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(p)
        try:
            out, err = p.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            # Still there after SIGKILL: stuck in the kernel, typically on a hung FUSE
            # daemon. Teardown aborts that connection, which lets it exit; the harness
            # must not wait for it here.
            out, err = "", "(did not exit after SIGKILL: blocked in the kernel, e.g. on a hung FUSE mount)"
        raise CmdTimeout(argv, timeout, out, err)
    except BaseException:
        kill_group(p)
        p.wait()
        raise
    out = "" if out is None else out
    if check and p.returncode != 0:
        raise CmdError(argv, p.returncode, out, err)
    return subprocess.CompletedProcess(argv, p.returncode, out, err)


def kill_group(p, grace=5.0):
    """Stop a child started with process_group=0, and everything it forked."""
    if p.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            return
        try:
            p.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def which(name):
    for d in os.environ.get("PATH", "").split(":") + ["/usr/sbin", "/sbin"]:
        f = os.path.join(d, name)
        if os.path.isfile(f) and os.access(f, os.X_OK):
            return f
    return None


class Cleanup:
    """LIFO stack of teardown callbacks. Each callback runs even if an earlier one
    failed; failures are collected so a bad unmount is reported, not hidden."""

    def __init__(self):
        self._stack = []
        self.errors = []

    def push(self, what, fn, *args):
        self._stack.append((what, fn, args))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def close(self):
        while self._stack:
            what, fn, args = self._stack.pop()
            try:
                fn(*args)
            except BaseException as e:  # keep unwinding even on a second Ctrl-C
                self.errors.append(f"{what}: {e}")


# ---------------------------------------------------------------- mounts
#
# The harness never touches a FUSE mount from its own process (no stat, no
# realpath through it): a daemon that stops answering would hang the harness in
# an uninterruptible wait. Paths are compared as strings against mountinfo, and
# anything that enters the mount runs in a child process with a timeout.

def _real(path):
    """Canonical path without resolving PATH itself (its parent is on the host)."""
    path = os.path.abspath(path)
    return os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))


def _mountinfo():
    """[(mount point, device 'major:minor', per-mount options, fstype)] in mount order."""
    res = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            parts = line.split()
            fstype = parts[parts.index("-") + 1]
            res.append((parts[4].encode().decode("unicode_escape"), parts[2], parts[5].split(","),
                        fstype))
    return res


def mountpoints():
    return [e[0] for e in _mountinfo()]


def _entry(path):
    real, found = _real(path), None
    for e in _mountinfo():  # the last entry wins: it is the one on top
        if e[0] == real:
            found = e
    return found


def mount_options(path):
    e = _entry(path)
    return e[2] if e else []


def is_mounted(path):
    return _entry(path) is not None


def fuse_abort(path):
    """Abort the FUSE connection of the mount at PATH: every pending and future
    request fails at once, which unblocks anything waiting on a hung daemon."""
    e = _entry(path)
    if e is None or not e[3].startswith("fuse"):
        return False
    conn = f"/sys/fs/fuse/connections/{e[1].split(':')[1]}/abort"
    try:
        with open(conn, "w") as f:
            f.write("1\n")
        return True
    except OSError:
        return False


def umount(path, fuse=False):
    """Unmount, retrying briefly (a just-killed fio may still hold files). A FUSE
    mount that will not go gets its connection aborted; the last resort is a lazy
    unmount, so teardown never hangs the harness. Returns True if a FUSE connection
    had to be aborted (its daemon then has nothing left to do)."""
    if not is_mounted(path):
        return False
    cmd = ["fusermount3", "-u", path] if fuse and which("fusermount3") else ["umount", path]
    err, aborted = "", False
    for attempt in range(20):
        try:
            r = run(cmd, check=False, timeout=60)
            err = r.stderr.strip()
            if r.returncode == 0 or not is_mounted(path):
                return aborted
        except CmdTimeout:
            err = "unmount timed out"
            if fuse:  # the daemon does not answer: abort rather than wait again
                aborted = fuse_abort(path) or aborted
        if fuse and attempt >= 3:
            aborted = fuse_abort(path) or aborted
        time.sleep(0.5)
    if fuse:
        aborted = fuse_abort(path) or aborted
    run(["umount", "-l", path], check=False, timeout=60)
    if is_mounted(path):
        raise RuntimeError(f"could not unmount {path}: {err}")
    return aborted


def mount(src, mnt, fstype=None, opts=None):
    argv = ["mount"]
    if fstype:
        argv += ["-t", fstype]
    if opts:
        argv += ["-o", opts]
    run(argv + [src, mnt], timeout=120)


def wait_for_mount(mnt, proc, timeout=60.0, what="daemon", log=None, probe_s=20):
    """Poll until MNT is a mount point that answers. If the daemon exits first, its
    output is the reason (that is how oleo's refusal of rw mounts reaches the
    results). Then a child process stats the root: a mount that is there but does
    not answer is N/A rather than a harness that hangs in the workload."""
    deadline = time.time() + timeout
    while time.time() < deadline and not is_mounted(mnt):
        if proc is not None and proc.poll() is not None:
            break
        time.sleep(0.05)
    if not is_mounted(mnt):
        msg = read_tail(log) if log else ""
        if proc is not None and proc.poll() is not None:
            raise NotApplicable(f"{what} exited with status {proc.returncode} without mounting"
                                + (f": {msg}" if msg else ""))
        raise NotApplicable(f"{what} did not mount within {timeout:.0f} s" + (f": {msg}" if msg else ""))
    try:
        run(["stat", "-c", "%i", mnt + "/"], timeout=probe_s)
    except CmdTimeout:
        raise NotApplicable(f"{what}: the mount appeared but a stat of its root did not return "
                            f"within {probe_s} s (daemon hung)") from None
    except CmdError as e:
        raise NotApplicable(f"{what}: the mount appeared but a stat of its root failed: {e}") from None


def check_alive(mnt, proc, what, probe_s=20):
    """After a workload on a FUSE mount: the daemon still runs and the mount still
    answers. A tool may report numbers even though the daemon died or its
    connection was aborted under it; those numbers are not a measurement."""
    if proc is not None and proc.poll() is not None:
        raise NotApplicable(f"{what} exited with status {proc.returncode} during the workload")
    if not is_mounted(mnt):
        raise NotApplicable(f"{what}: the mount went away during the workload")
    try:
        run(["stat", "-c", "%i", mnt + "/"], timeout=probe_s)
    except CmdTimeout:
        raise NotApplicable(f"{what}: after the workload a stat of the root did not return "
                            f"within {probe_s} s (daemon hung)") from None
    except CmdError as e:
        raise NotApplicable(f"{what}: after the workload a stat of the root failed: {e}") from None


def read_tail(path, lines=4, limit=400):
    try:
        with open(path, errors="replace") as f:
            text = f.read()
    except OSError:
        return ""
    kept = [l.strip() for l in text.strip().splitlines() if l.strip()][-lines:]
    return " | ".join(kept)[:limit]


# ---------------------------------------------------------------- loop devices

def loop_attach(image, direct_io=True):
    """Attach IMAGE to a free loop device. Direct IO on the loop device makes the
    filesystem's flushes reach the disk instead of the host's page cache."""
    argv = ["losetup", "--show", "-f"]
    if direct_io:
        argv.append("--direct-io=on")
    return run(argv + [image], timeout=60).stdout.strip()


def loop_detach(dev):
    for _ in range(10):
        if run(["losetup", "-d", dev], check=False, timeout=60).returncode == 0:
            return
        time.sleep(0.5)


# ---------------------------------------------------------------- caches, memory

def disk_counters(path):
    """(bytes written, cache flushes) so far on the block device holding `path`, from
    /sys/dev/block/MAJ:MIN/stat (its whole disk if `path` is on a partition); None if
    the kernel does not say (flush counts came in Linux 5.5)."""
    st = os.stat(path)
    base = f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
    for stat in (os.path.join(base, "stat"), os.path.join(base, "..", "stat")):
        try:
            fields = open(stat).read().split()
        except OSError:
            continue
        # Documentation/block/stat.rst: sectors written is field 7, flush requests 16.
        if len(fields) >= 17:
            return int(fields[6]) * 512, int(fields[15])
    return None


def cpu_busy_seconds():
    """CPU time all CPUs spent busy so far (user, nice, system, irq, softirq, steal from
    /proc/stat): the same ruler for kernel filesystems, whose work runs in the caller's
    threads and in kernel workers, and for FUSE servers, whose work runs in their own."""
    with open("/proc/stat") as f:
        fields = f.readline().split()
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def drop_caches(timeout=600):
    """Cold cache for the next measurement: write back, then drop page, dentry
    and inode caches (FUSE targets additionally get a fresh mount). In a child:
    sync waits on every filesystem, a hung FUSE daemon included."""
    run(["sh", "-c", "sync && echo 3 > /proc/sys/vm/drop_caches"], timeout=timeout)


def peak_rss_kib(pid):
    """VmHWM: the process's peak resident set since it started."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def safe_rmtree(path):
    """rmtree that refuses to descend into anything still mounted under PATH (a
    hung FUSE mount would hang it, a live one would lose its files instead)."""
    import shutil
    real = _real(path)
    busy = [mp for mp in mountpoints() if mp == real or mp.startswith(real + "/")]
    if busy:
        raise RuntimeError(f"not removing {path}: still mounted: {', '.join(busy)}")
    shutil.rmtree(path, ignore_errors=True)


def make_sparse(path, size_bytes):
    with open(path, "wb") as f:
        f.truncate(size_bytes)


def copy_sparse(src, dst):
    run(["cp", "--sparse=always", src, dst], timeout=3600)


# ---------------------------------------------------------------- stale state

def reap_stale(work_dir, log=print):
    """Tear down mounts and loop devices under WORK_DIR left by a harness that was
    killed without running its cleanups, and a zfs-fuse daemon it started."""
    work_dir = os.path.realpath(work_dir)
    for mp in sorted(mountpoints(), key=len, reverse=True):
        if mp.startswith(work_dir + "/"):
            log(f"reaping stale mount {mp}")
            fuse_abort(mp)  # a no-op unless it is a FUSE mount
            run(["umount", "-l", mp], check=False, timeout=60)
    r = run(["losetup", "-l", "-n", "-O", "NAME,BACK-FILE"], check=False, timeout=30)
    for line in r.stdout.splitlines():
        parts = line.split(None, 1)
        if len(parts) == 2 and parts[1].strip().startswith(work_dir + "/"):
            log(f"reaping stale loop device {parts[0]}")
            loop_detach(parts[0])
    pidfile = os.path.join(work_dir, "zfs-fuse.pid")
    if os.path.exists(pidfile):
        try:
            pid = int(open(pidfile).read().strip())
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip() == "zfs-fuse":
                    log(f"reaping stale zfs-fuse daemon {pid}")
                    os.kill(pid, signal.SIGTERM)
                    for _ in range(100):
                        if not os.path.exists(f"/proc/{pid}"):
                            break
                        time.sleep(0.1)
        except (OSError, ValueError):
            pass
        try:
            os.unlink(pidfile)
        except OSError:
            pass
