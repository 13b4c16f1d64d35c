"""Command line: parse options, run the plan with a progress line, write the report.

Exit status: 0 when the harness worked (targets may be N/A), 1 when the harness
itself failed somewhere (a bug, or a teardown that left something mounted),
2 for bad usage, 130 when interrupted.
"""

import argparse
import os
import subprocess
import sys
import time

from . import params as P
from . import plots, report, results, runner
from . import targets as T
from . import workloads as W
from .sysutil import Interrupted, install_signal_handlers, which

BENCH_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO_DIR = os.path.dirname(BENCH_DIR)


def parse_args(argv):
    ap = argparse.ArgumentParser(
        prog="bench/run",
        description="oleo benchmark harness: seed workloads and read workloads on oleo and its peers.",
        epilog="Examples: bench/run --setup;  bench/run --quick;  "
               "bench/run --workloads fsync-write --targets btrfs,xfs --reps 5;  "
               "bench/run --scale original --set fsync_jobs=1,16")
    ap.add_argument("--setup", action="store_true",
                    help="install the tools (apt-get, cargo install btrfs-fuse) and exit")
    ap.add_argument("--quick", action="store_true",
                    help="every workload for a few seconds on every target (same as --scale quick)")
    ap.add_argument("--scale", choices=list(P.PRESETS), default="full",
                    help="size preset: full (this 2-core machine, default), quick, original (the seeds' sizes)")
    ap.add_argument("--reps", type=int, help="repetitions per point (default 3; quick: 1)")
    ap.add_argument("--workloads", default=",".join(W.NAMES),
                    help=f"comma list, default all: {','.join(W.NAMES)}")
    ap.add_argument("--targets", default=",".join(T.NAMES),
                    help=f"comma list, default all: {','.join(T.NAMES)}")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a size parameter (see bench/oleobench/params.py), e.g. fsync_runtime_s=60")
    ap.add_argument("--results", help="results folder (default bench/results/<time>-<scale>)")
    ap.add_argument("--work-dir", default=os.path.join(BENCH_DIR, "work"),
                    help="where images and mounts live (default bench/work)")
    ap.add_argument("--oleo", default=os.environ.get("OLEO_BIN", os.path.join(REPO_DIR, "target", "release", "oleo")),
                    help="oleo binary (default target/release/oleo, or $OLEO_BIN)")
    ap.add_argument("--btrfs-fuse", default=os.environ.get("BTRFS_FUSE_BIN"),
                    help="btrfs-fuse binary (default: on PATH or ~/.cargo/bin)")
    ap.add_argument("--oleo-subvol-cmd", default="{oleo} subvolume create {path}",
                    help="template creating a subvolume on a mounted oleo ({oleo} {path} {mnt} {image}; "
                         "default: %(default)s; empty: seed 004 is N/A on oleo)")
    ap.add_argument("--oleo-snapshot-cmd", default="{oleo} subvolume snapshot -r {src} {dst}",
                    help="template taking a read-only snapshot on a mounted oleo ({oleo} {src} {dst} "
                         "{mnt} {image}; default: %(default)s)")
    ap.add_argument("--report", metavar="DIR", help="only rebuild report.md and plots from DIR/results.jsonl")
    ap.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    a = ap.parse_args(argv)
    # Absolute: some workloads run the binary from another directory.
    a.oleo = os.path.abspath(a.oleo)
    if a.quick:
        a.scale = "quick"
    for attr, names in (("workloads", W.NAMES), ("targets", T.NAMES)):
        chosen = [x.strip() for x in getattr(a, attr).split(",") if x.strip()]
        bad = [x for x in chosen if x not in names]
        if bad or not chosen:
            ap.error(f"--{attr}: unknown {', '.join(bad) or '(empty)'}; choose from {', '.join(names)}")
        setattr(a, attr, [n for n in names if n in chosen])  # canonical order
    return a


def find_btrfs_fuse(explicit):
    if explicit:
        return explicit if os.path.isfile(explicit) else None
    return which("btrfs-fuse") or next(
        (p for p in [os.path.expanduser("~/.cargo/bin/btrfs-fuse")] if os.path.isfile(p)), None)


class Progress:
    """One live line on a terminal (\\r-rewritten); plain lines otherwise."""

    def __init__(self, total):
        self.total, self.done, self.t0 = total, 0, time.time()
        self.tty = sys.stderr.isatty()
        self.current = ""

    def _eta(self):
        el = time.time() - self.t0
        left = el / self.done * (self.total - self.done) if self.done else None
        return f"{_dur(el)} elapsed" + (f", ~{_dur(left)} left" if left is not None else "")

    def start(self, rnd, w, v, t):
        line = (f"[{self.done + 1}/{self.total}] round {rnd} {w.name}"
                + (f" {w.variant_name}={v}" if v is not None else "") + f" on {t} ({self._eta()})")
        if self.tty:
            self.current = line[:200]
            sys.stderr.write("\r\033[K" + self.current)
            sys.stderr.flush()

    def finish(self, rec):
        self.done += 1
        if rec["status"] == "ok":
            what = ", ".join(f"{k} {report.fmt(v)}" for k, v in list(rec["metrics"].items())[:3])
            if rec.get("peak_rss_kib"):
                what += f", peak RSS {rec['peak_rss_kib'] // 1024} MiB"
        else:
            what = f"{'N/A' if rec['status'] == 'na' else 'ERROR'}: {rec['reason']}"
        line = (f"[{self.done}/{self.total}] {rec['workload']}"
                + (f" {rec['variant']}" if rec["variant"] else "") + f" {rec['target']}: {what}")
        self.current = ""
        sys.stderr.write(("\r\033[K" if self.tty else "") + line[:300] + "\n")
        sys.stderr.flush()

    def log(self, msg):
        """A message above the live line, which is then drawn again."""
        if self.tty:
            sys.stderr.write("\r\033[K" + msg + "\n" + self.current)
        else:
            sys.stderr.write(msg + "\n")
        sys.stderr.flush()


def _dur(s):
    s = int(s)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def finish_report(results_dir, recs, meta, log):
    path = report.write(results_dir, recs, meta)
    pngs = plots.write(results_dir, recs, meta)
    log(f"report: {path}")
    log(f"plots: {len(pngs)} in {os.path.join(results_dir, 'plots')}" if isinstance(pngs, list)
        else f"plots: {pngs}")


def main(argv=None):
    a = parse_args(sys.argv[1:] if argv is None else argv)
    log = lambda m: (sys.stderr.write(m + "\n"), sys.stderr.flush())

    if a.setup:
        return subprocess.call(["bash", os.path.join(BENCH_DIR, "setup.sh")])

    if a.report:
        recs, meta = results.load(a.report)
        finish_report(a.report, recs, meta, log)
        return 0

    try:
        p = P.make_params(a.scale, a.set)
    except ValueError as e:
        log(f"bench/run: {e}")
        return 2
    if a.reps is not None:
        p.reps = a.reps

    workloads = [cls(p) for cls in W.ALL if cls.name in a.workloads]
    plan = runner.make_plan(workloads, a.targets, p.reps)
    if a.dry_run:
        for rnd, w, v, t in plan:
            print(f"round {rnd} {w.name}" + (f" {w.variant_name}={v}" if v is not None else "") + f" {t}")
        print(f"{len(plan)} measurements")
        return 0

    if os.geteuid() != 0:
        log("bench/run: must run as root (it creates loop devices and mounts filesystems)")
        return 2

    run_id = time.strftime("%Y%m%d-%H%M%S")
    results_dir = a.results or os.path.join(BENCH_DIR, "results", f"{run_id}-{a.scale}")
    if os.path.exists(os.path.join(results_dir, "results.jsonl")):
        log(f"bench/run: {results_dir} already holds results; choose another --results")
        return 2
    os.makedirs(results_dir, exist_ok=True)
    btrfs_fuse = find_btrfs_fuse(a.btrfs_fuse)
    meta = {"run_id": run_id, "scale": a.scale, "reps": p.reps, "targets": a.targets,
            "workloads": a.workloads, "params": results.params_dict(p),
            "versions": results.versions(a.oleo, btrfs_fuse), "machine": results.machine(),
            "oleo_bin": a.oleo, "btrfs_fuse_bin": btrfs_fuse, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "metrics": {w.name: {m.key: {"label": m.label, "higher_is_better": m.higher}
                                 for m in w.metrics} for w in workloads}}
    results.write_meta(results_dir, meta)

    prog = Progress(len(plan))
    install_signal_handlers()
    ctx = runner.Context(p, a.work_dir, results_dir, a.oleo, btrfs_fuse,
                         a.oleo_subvol_cmd, a.oleo_snapshot_cmd, prog.log)
    runner.prepare_work_dir(ctx.work_dir, prog.log)
    writer = results.Writer(results_dir)
    recs, status = [], 0
    prog.log(f"{len(plan)} measurements ({len(workloads)} workloads x {len(a.targets)} targets x "
             f"{p.reps} rep(s), scale {a.scale}); results in {results_dir}")
    try:
        for seq, (rnd, w, v, t) in enumerate(plan, 1):
            prog.start(rnd, w, v, t)
            rec = runner.measure(ctx, seq, rnd, w, v, t)
            rec["run"] = run_id
            writer.write(rec)
            recs.append(rec)
            prog.finish(rec)
            if rec["status"] == "error":
                status = 1
    except (KeyboardInterrupt, Interrupted) as e:
        prog.log(f"interrupted ({str(e) or 'Ctrl-C'}): everything mounted has been torn down; "
                 f"{len(recs)} measurements kept")
        status = 130
    finally:
        writer.close()
        ctx.drop_golden()
        meta["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        meta["harness_errors"] = sum(r["status"] == "error" for r in recs)
        results.write_meta(results_dir, meta)
    finish_report(results_dir, recs, meta, prog.log)
    na = sum(r["status"] == "na" for r in recs)
    ok = sum(r["status"] == "ok" for r in recs)
    prog.log(f"done: {ok} measured, {na} N/A, {meta['harness_errors']} harness errors "
             f"in {_dur(time.time() - prog.t0)}")
    return status
