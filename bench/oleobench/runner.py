"""One measurement at a time: fresh filesystem, cold cache, workload, teardown.

The plan interleaves targets: every round runs each workload point on every target
(in an order rotated per round) before the next round starts, so slow drift of the
machine spreads over all targets instead of landing on one.
"""

import os
import shutil
import sys
import time
import traceback

from . import requests
from . import targets as T
from . import workloads as W
from .sysutil import (Cleanup, CmdError, NotApplicable, check_alive, drop_caches, reap_stale, run,
                      safe_rmtree)


class Context:
    def __init__(self, params, work_dir, results_dir, oleo_bin, btrfs_fuse_bin,
                 oleo_subvol_cmd, oleo_snapshot_cmd, log):
        self.p = params
        self.work_dir = os.path.realpath(work_dir)
        self.results_dir = results_dir
        self.oleo_bin = oleo_bin
        self.btrfs_fuse_bin = btrfs_fuse_bin
        self.oleo_subvol_cmd = oleo_subvol_cmd
        self.oleo_snapshot_cmd = oleo_snapshot_cmd
        self.log = log
        self.deadline = None
        self.targets = {cls.name: cls(self) for cls in T.ALL}
        self._unavailable = {}
        self._golden = {}
        self._saved_jobs = set()

    # --- time budget of the running measurement
    def remaining(self):
        if self.deadline is None:
            return 3600
        return max(1.0, self.deadline - time.time())

    def unavailable(self, target):
        if target.name not in self._unavailable:
            self._unavailable[target.name] = target.unavailable()
        return self._unavailable[target.name]

    def save_job(self, workload, target, variant, text):
        """Keep each distinct fio job file next to the results, for re-running."""
        key = (workload.name, target.name, variant)
        if key in self._saved_jobs or not self.results_dir:
            return
        self._saved_jobs.add(key)
        d = os.path.join(self.results_dir, "jobs")
        os.makedirs(d, exist_ok=True)
        suffix = f"-{variant}" if variant is not None else ""
        with open(os.path.join(d, f"{workload.name}{suffix}-{target.name}.fio"), "w") as f:
            f.write(text)

    # --- shared read data sets
    OWNERS = {"btrfs": "btrfs", "xfs": "xfs", "ext4": "ext4", "zfs": "zfs-fuse", "raw": "raw"}

    def golden(self, family):
        """Path of the prepared read data set for FAMILY (an image, a zfs vdev, or a
        directory for raw), built on first use. A failure is remembered and makes
        every read measurement of that family N/A with the same reason."""
        if family not in self._golden:
            self._golden[family] = self._build_golden(family)
        ok, val = self._golden[family]
        if not ok:
            raise NotApplicable(val)
        return val

    def _build_golden(self, family):
        owner = self.targets[self.OWNERS[family]]
        reason = self.unavailable(owner)
        if reason:
            return False, f"cannot build the {family} read data set: {reason}"
        scratch = os.path.join(self.work_dir, "golden", family)
        safe_rmtree(scratch)
        os.makedirs(scratch)
        self.log(f"preparing the {family} read data set ({self.p.seq_file_mib} MiB file"
                 + ("" if family == "raw" else f", {self.p.walk_files} files") + ")")
        t0 = time.time()
        cl = Cleanup()
        try:
            m = owner.build_golden(cl, scratch, W.dataset_spec(self.p))
            files = 0 if family == "raw" else self.p.walk_files
            run([sys.executable, "-m", "oleobench.populate", m.path, self.p.seq_file_mib, files,
                 self.p.walk_dirs], timeout=self.p.timeout_s,
                env=dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(__file__))))
            result = m.path if family == "raw" else m.image
        except (NotApplicable, CmdError, OSError) as e:
            return False, f"building the {family} read data set failed: {e}"
        finally:
            cl.close()
        if cl.errors:
            return False, f"tearing down the {family} data set build failed: {'; '.join(cl.errors)}"
        self.log(f"{family} read data set ready in {time.time() - t0:.0f} s")
        return True, result

    def multi_golden(self, key, n, size_bytes, mkfs_opts, file_mib):
        """Image paths of a prepared N-device btrfs (issue 31): kernel btrfs makes it
        (`mkfs.btrfs MKFS_OPTS` over N loop devices) and writes data/seq.bin, FILE_MIB
        of incompressible data, once per run per KEY; every measurement copies the
        images, so oleo and the kernel read byte-identical sets. A failure is
        remembered like a read data set's."""
        gkey = ("multi", key)
        if gkey not in self._golden:
            self._golden[gkey] = self._build_multi_golden(key, n, size_bytes, mkfs_opts, file_mib)
        ok, val = self._golden[gkey]
        if not ok:
            raise NotApplicable(val)
        return val

    def _build_multi_golden(self, key, n, size_bytes, mkfs_opts, file_mib):
        owner = self.targets["btrfs"]
        what = f"{n}-device btrfs data set {key}"
        reason = self.unavailable(owner)
        if reason:
            return False, f"cannot build the {what}: {reason}"
        scratch = os.path.join(self.work_dir, "golden", f"multi-{key}")
        safe_rmtree(scratch)
        os.makedirs(scratch)
        self.log(f"preparing the {what} (mkfs.btrfs {' '.join(mkfs_opts)}, {file_mib} MiB file)")
        t0 = time.time()
        cl = Cleanup()
        try:
            m = owner.build_multi(cl, scratch, n, size_bytes, mkfs_opts)
            run([sys.executable, "-m", "oleobench.populate", m.path, file_mib, 0, 1],
                timeout=self.p.timeout_s,
                env=dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(__file__))))
            result = list(m.images)
        except (NotApplicable, CmdError, OSError) as e:
            return False, f"building the {what} failed: {e}"
        finally:
            cl.close()
        if cl.errors:
            return False, f"tearing down the {what} build failed: {'; '.join(cl.errors)}"
        self.log(f"{what} ready in {time.time() - t0:.0f} s")
        return True, result

    def drop_golden(self):
        safe_rmtree(os.path.join(self.work_dir, "golden"))
        self._golden.clear()


def make_plan(workloads, target_names, reps):
    """[(round, workload, variant, target_name)], targets rotated each round."""
    plan = []
    for r in range(reps):
        k = r % len(target_names)
        order = target_names[k:] + target_names[:k]
        for w in workloads:
            for v in w.variants():
                for t in order:
                    plan.append((r + 1, w, v, t))
    return plan


def measure(ctx, seq, rnd, w, variant, tname):
    """Run one measurement; always returns a result record (never raises, except on
    Ctrl-C/SIGTERM, after tearing down)."""
    target = ctx.targets[tname]
    rec = {"seq": seq, "round": rnd, "workload": w.name, "seed": w.seed,
           "variant": None if variant is None else f"{w.variant_name}={variant}",
           "target": tname, "status": "ok", "metrics": {}, "reason": None,
           "peak_rss_kib": None, "params": w.describe(),
           "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    reason = w.check(target) or ctx.unavailable(target)
    if reason:
        rec.update(status="na", reason=reason, elapsed_s=0.0)
        return rec
    scratch = os.path.join(ctx.work_dir, f"m{seq:04d}")
    safe_rmtree(scratch)
    os.makedirs(scratch)
    t0 = time.time()
    cl = Cleanup()
    cl.push("remove scratch", safe_rmtree, scratch)
    # Runs after the daemon has stopped (the stack unwinds in reverse), so its log is whole.
    cl.push("keep the logs of a failed measurement", keep_logs, ctx, scratch, rec)
    m = None
    try:
        if w.kind == "read":
            golden = ctx.golden(target.family)
            ctx.deadline = time.time() + ctx.p.timeout_s
            m = target.from_dataset(cl, scratch, golden)
        elif w.kind == "multi":
            # a multi-device data set (issue 31); the workload says which and how mounted
            goldens = ctx.multi_golden(*w.multi_dataset(variant))
            ctx.deadline = time.time() + ctx.p.timeout_s
            m = target.from_multi(cl, scratch, goldens, w.multi_mode(target))
        elif w.kind == "stream":
            # send/receive (issue 32): the shared source image is built (or found in the
            # work dir) before the clock starts; the workload sets up each target itself
            src = w.ready(ctx)
            ctx.deadline = time.time() + w.budget_s()
            m = w.prepare(ctx, cl, scratch, target, src)
        else:
            ctx.deadline = time.time() + ctx.p.timeout_s
            m = target.fresh(cl, scratch, w.spec())
        drop_caches()
        metrics = w.run(ctx, m, variant)
        counted = metrics.pop(W.REQUESTS, None)
        if counted:
            reqs = requests.per_operation(w.name, *counted, metrics, rec["params"])
            if reqs:
                rec["fuse_requests"] = reqs
        if m.daemon is not None:
            check_alive(m.path, m.daemon, tname)
        rec["metrics"] = metrics
        rec["peak_rss_kib"] = m.peak_rss_kib()
    except (NotApplicable, CmdError) as e:
        rec.update(status="na", reason=str(e))
    except Exception as e:  # a bug in the harness itself: recorded, and fails the run
        rec.update(status="error", reason=f"harness error: {type(e).__name__}: {e}",
                   traceback=traceback.format_exc(limit=6))
    finally:
        ctx.deadline = None
        cl.close()
        rec["elapsed_s"] = round(time.time() - t0, 2)
    teardown = getattr(m, "teardown", None)
    if teardown:
        # e.g. oleo's unmount (its final commit) time, or a daemon killed at unmount
        rec["teardown"] = dict(teardown)
    if cl.errors:
        # Something stayed mounted or attached: that is the harness failing.
        rec["teardown_errors"] = cl.errors
        if rec["status"] == "ok":
            rec["status"] = "error"
            rec["reason"] = "teardown failed: " + "; ".join(cl.errors)
    return rec


def keep_logs(ctx, scratch, rec):
    """A measurement that did not end ok keeps its daemon's log (oleo.log, zfs-fuse.log,
    ...) in RESULTS/logs/, named after its sequence number: its scratch dir is removed."""
    if rec["status"] == "ok" or not ctx.results_dir or not os.path.isdir(scratch):
        return
    d = os.path.join(ctx.results_dir, "logs")
    for name in sorted(os.listdir(scratch)):
        if name.endswith(".log") and os.path.isfile(os.path.join(scratch, name)):
            os.makedirs(d, exist_ok=True)
            shutil.copyfile(os.path.join(scratch, name),
                            os.path.join(d, f"m{rec['seq']:04d}-{rec['target']}-{name}"))
            rec.setdefault("logs", []).append(f"logs/m{rec['seq']:04d}-{rec['target']}-{name}")


def prepare_work_dir(work_dir, log):
    os.makedirs(work_dir, exist_ok=True)
    reap_stale(work_dir, log)
    for name in os.listdir(work_dir):
        p = os.path.join(work_dir, name)
        if name.startswith("m") and os.path.isdir(p) or name in ("golden", "zfs-mnt"):
            safe_rmtree(p)
