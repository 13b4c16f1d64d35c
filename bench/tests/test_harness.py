"""Tests of the benchmark harness itself. No performance assertions anywhere.

The unit tests run anywhere. test_quick_end_to_end runs `bench/run --quick` for real: it
needs root, loop devices and the tools from bench/setup.sh; it skips without them, and
fails under CI=true like the project's other privileged tests.
"""

import json
import os
import subprocess
import sys

import pytest

BENCH = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, BENCH)

from oleobench import params as P  # noqa: E402
from oleobench import report, runner, tools  # noqa: E402
from oleobench import targets as T  # noqa: E402
from oleobench import workloads as W  # noqa: E402

FIO_JSON = """fio: some warning before the JSON
{"fio version": "fio-3.33", "jobs": [
 {"jobname": "a", "error": 0,
  "read": {"bw_bytes": 1048576, "iops": 256.0, "io_bytes": 10485760, "runtime": 10000},
  "write": {"bw_bytes": 3145728, "iops": 48.0, "io_bytes": 31457280, "runtime": 10000}},
 {"jobname": "a", "error": 0,
  "read": {"bw_bytes": 1048576, "iops": 256.0, "io_bytes": 10485760, "runtime": 9000},
  "write": {"bw_bytes": 0, "iops": 0, "io_bytes": 0, "runtime": 0}}]}
"""

FSMARK_OUT = """
#  fs_mark  -S  0  -s  0  -k  -t  2  -n  500  -L  2  -d  /m/d1  -d  /m/d2
#	Version 3.3, 2 thread(s) starting at Sat Nov 21 12:21:44 2026

FSUse%        Count         Size    Files/sec     App Overhead
    71         1000            0      56705.4            11423
    71         2000            0      24980.9            15689
"""

DBENCH_OUT = """   8     12345   401.23 MB/sec  execute   2 sec  latency 3.210 ms
Operation      Count    AvgLat    MaxLat
 ----------------------------------------
 NTCreateX      12345     0.123    12.345

Throughput 402.345 MB/sec  8 clients  8 procs  max_latency=17.125 ms
"""


def test_fio_parse_and_totals():
    t = tools.fio_totals(tools.parse_fio_json(FIO_JSON))
    assert t["read"]["MiB_s"] == pytest.approx(2.0)
    assert t["write"]["MiB_s"] == pytest.approx(3.0)
    assert t["read"]["iops"] == pytest.approx(512.0)
    assert t["runtime_s"] == pytest.approx(10.0)


def test_fio_jobfile_flags_and_values():
    text = tools.fio_jobfile("x", {"rw": "write", "thread": True, "direct": 0, "skip": None})
    assert text.splitlines() == ["[x]", "rw=write", "thread", "direct=0"]


def test_fs_mark_rows():
    assert tools.parse_fs_mark(FSMARK_OUT) == [(1000, 56705.4), (2000, 24980.9)]


def test_dbench_closing_line():
    assert tools.parse_dbench(DBENCH_OUT) == (402.345, 17.125)
    with pytest.raises(ValueError):
        tools.parse_dbench("no result here")


def test_params_presets_and_overrides():
    p = P.make_params("quick", ["fsync_jobs=1,2", "uring_runtime_s=7", "snap_delay_s=1.5"])
    assert p.fsync_jobs == [1, 2] and p.uring_runtime_s == 7 and p.snap_delay_s == 1.5
    assert P.make_params("full").reps == 3
    assert P.make_params("original").fsmark_threads == 12
    with pytest.raises(ValueError):
        P.make_params("full", ["nonsense=1"])
    with pytest.raises(ValueError):
        P.make_params("huge")


def test_plan_interleaves_and_rotates_targets():
    p = P.make_params("quick", ["fsync_jobs=1,4"])
    ws = [W.FsyncWrite(p), W.SeqRead(p)]
    plan = runner.make_plan(ws, ["a", "b", "c"], 2)
    assert len(plan) == 2 * (2 + 1) * 3
    first = [t for r, w, v, t in plan if r == 1 and w.name == "fsync-write" and v == 1]
    second = [t for r, w, v, t in plan if r == 2 and w.name == "fsync-write" and v == 1]
    assert first == ["a", "b", "c"] and second == ["b", "c", "a"]
    # round 1 finishes before round 2 starts
    rounds = [r for r, *_ in plan]
    assert rounds == sorted(rounds)


class _FakeTarget:
    def __init__(self, name, raw=False, writable=True, family="btrfs", snapshots=False):
        self.name, self.raw, self.writable = name, raw, writable
        self.family, self.snapshots = family, snapshots
        self.only = None


def test_static_not_applicable_reasons():
    p = P.make_params("quick")
    raw = _FakeTarget("raw", raw=True, family="raw")
    ro = _FakeTarget("btrfs-fuse", writable=False)
    assert W.FsyncWrite(p).check(raw) is None          # fio data workloads run on raw
    assert "raw" in W.Dbench(p).check(raw)
    assert "read-only" in W.FsyncWrite(p).check(ro)
    assert W.SeqRead(p).check(ro) is None
    assert "snapshots" in W.SnapshotUnderWrite(p).check(_FakeTarget("xfs", family="xfs"))


class _OleoCtx:
    def __init__(self, subvol=None, snap=None):
        self.oleo_bin = "/nonexistent/oleo"
        self.oleo_subvol_cmd, self.oleo_snapshot_cmd = subvol, snap


def test_fuse_floor_runs_only_fs_mark_and_dbench_and_names_its_binary():
    p = P.make_params("quick")
    floor = T.FuseFloor(_OleoCtx())
    assert "fsmark-create" in floor.only and "dbench" in floor.only
    for cls in (W.FsmarkFsync, W.FsyncWrite, W.SeqRead):
        assert "FUSE transport alone" in cls(p).check(floor), cls.name
    for cls in (W.FsmarkCreate, W.Dbench):
        if cls(p).check(T.Btrfs(None)) is None:
            assert cls(p).check(floor) is None, cls.name
    assert floor.unavailable() == ("/nonexistent/examples/nullfs not built (cargo build "
                                   "--release -p oleo-fuse --example nullfs)")
    assert T.FuseFloorDevFuse(_OleoCtx()).transport == ["devfuse"]


def test_oleo_is_writable_and_snapshots_through_its_cli():
    p = P.make_params("quick")
    oleo = T.Oleo(_OleoCtx())
    assert oleo.writable and not oleo.raw
    for cls in (W.FsyncWrite, W.SeqWrite, W.FsmarkCreate, W.UringRandrw, W.Dbench):
        if cls in (W.FsmarkCreate, W.Dbench) and cls(p).check(T.Btrfs(None)):
            continue  # the tool is missing on this machine: that is another N/A
        assert cls(p).check(oleo) is None, cls.name
    # Without command templates seed 004 is N/A; bench/run passes oleo's own by default.
    reason = W.SnapshotUnderWrite(p).check(oleo)
    assert reason and "--oleo-snapshot-cmd" in reason
    assert W.SnapshotUnderWrite(p).check(T.Oleo(_OleoCtx("{oleo} sub {path}", "{oleo} snap {src} {dst}"))) is None
    assert "read-only" in W.SeqWrite(p).check(T.BtrfsFuse(None))


def test_oleo_fresh_mounts_rw_mkfs_btrfs_image(tmp_path, monkeypatch):
    """A write workload on oleo: mkfs.btrfs on a sparse image of the workload's size,
    then `oleo mount -f -o rw,<the kernel target's options>,fuse_uring=on` (io_uring turned
    on in the kernel first); oleo-devfuse the same with fuse_uring=off."""
    calls, spawned, enabled = [], [], []
    monkeypatch.setattr(T, "enable_fuse_uring", lambda: enabled.append(True))
    monkeypatch.setattr(T, "run", lambda argv, **kw: calls.append([str(a) for a in argv]))
    monkeypatch.setattr(T, "mount_options", lambda mnt: ["rw", "nosuid", "nodev"])

    def fake_spawn(cl, argv, mnt, log, what, **kw):
        spawned.append((argv, kw))
        return "proc"
    monkeypatch.setattr(T, "spawn_fuse", fake_spawn)
    p = P.make_params("quick")
    w = W.UringRandrw(p)
    m = T.Oleo(_OleoCtx()).fresh(None, str(tmp_path), w.spec())
    image = str(tmp_path / "oleo.img")
    assert os.path.getsize(image) == w.image_bytes()
    assert calls == [["mkfs.btrfs", "-f", "-q", "-R", "free-space-tree", "-O", "no-holes", image]]
    argv, kw = spawned[0]
    assert argv == ["/nonexistent/oleo", "mount", "-f", "-o", "rw,ssd,nodatacow,fuse_uring=on",
                    image, str(tmp_path / "mnt")]
    assert enabled == [True]
    assert kw["grace"] >= 60          # oleo commits at unmount: give it time
    assert m.daemon == "proc" and m.path == str(tmp_path / "mnt") and m.image == image
    T.OleoDevFuse(_OleoCtx()).fresh(None, str(tmp_path), w.spec())
    assert spawned[1][0][4] == "rw,ssd,nodatacow,fuse_uring=off"
    assert enabled == [True], "the /dev/fuse target leaves the kernel parameter alone"
    # A mount that came up read-only anyway is not a write measurement.
    monkeypatch.setattr(T, "mount_options", lambda mnt: ["ro", "nosuid"])
    with pytest.raises(T.NotApplicable, match="read-only"):
        T.Oleo(_OleoCtx()).fresh(None, str(tmp_path), W.SeqWrite(p).spec())


SEQ_WRITE_JSON = """{"jobs": [{"jobname": "seq-write", "error": 0,
  "read": {"bw_bytes": 0, "iops": 0, "io_bytes": 0, "runtime": 0},
  "write": {"bw_bytes": 209715200, "iops": 200.0, "io_bytes": 4294967296, "runtime": 20480}}]}"""


def test_seq_write_sizes_fio_job_and_read_back(tmp_path, monkeypatch):
    full, quick = P.make_params("full"), P.make_params("quick")
    assert full.seqw_file_mib == 4096 and quick.seqw_file_mib == 256
    for p in (full, quick):
        w = W.SeqWrite(p)
        # the file fits with room for btrfs metadata and chunk allocation
        assert w.image_bytes() >= p.seqw_file_mib * (1 << 20) + (1 << 30)
        assert w.check(_FakeTarget("raw", raw=True, family="raw")) is None  # disk limit too
    jobs, dropped = [], []
    verify_fails = []

    def fake_run_fio(text, scratch, timeout, readonly=False):
        jobs.append(text.splitlines())
        report = tools.parse_fio_json(SEQ_WRITE_JSON)
        if "verify_only=1" in text:
            if verify_fails == ["bad"]:
                raise tools.CmdError(["fio"], 84, "", "verify: bad magic header 0, wanted acca at file x offset 6291456")
            j = report["jobs"][0]
            j["read"], j["write"] = dict(j["write"]), dict(j["read"])
            if verify_fails == ["short"]:   # the file is shorter than what was written
                j["read"]["io_bytes"] //= 2
        return report
    monkeypatch.setattr(tools, "run_fio", fake_run_fio)
    monkeypatch.setattr(W, "drop_caches", lambda: dropped.append(len(jobs)))

    class Ctx:
        def save_job(self, *a):
            pass

        def remaining(self):
            return 100

    w = W.SeqWrite(full)
    m = T.Mounted(_FakeTarget("btrfs"), str(tmp_path / "mnt"), scratch=str(tmp_path))
    res = w.run(Ctx(), m, None)
    write, verify = jobs
    for want in ("rw=write", "bs=1M", "direct=0", "end_fsync=1", "fallocate=none", "size=4096M",
                 f"filename={tmp_path}/mnt/seq-write.bin", "verify=crc32c", "do_verify=0"):
        assert want in write, (want, write)
    assert res["write_MiB_s"] == pytest.approx(200.0) and res["written_MiB"] == pytest.approx(4096)
    # the read-back: same file, what was written, after sync + drop_caches
    assert dropped == [1]
    for want in ("verify_only=1", "do_verify=1", "verify=crc32c",
                 f"filename={tmp_path}/mnt/seq-write.bin"):
        assert want in verify, (want, verify)
    assert not [l for l in verify if l.startswith(("end_fsync", "runtime", "size"))]
    # data that does not read back: no number, the speed goes into the reason
    verify_fails.append("bad")
    with pytest.raises(W.NotApplicable, match=r"did not read back.*200\.0 MiB/s.*bad magic"):
        w.run(Ctx(), m, None)
    verify_fails[:] = ["short"]
    with pytest.raises(W.NotApplicable, match=r"only 2048 MiB verified"):
        w.run(Ctx(), m, None)
    # raw stands for the disk: O_DIRECT, the read-back too
    jobs.clear(); verify_fails.clear()
    m = T.Mounted(_FakeTarget("raw", raw=True, family="raw"), str(tmp_path), scratch=str(tmp_path))
    w.run(Ctx(), m, None)
    assert all("direct=1" in j for j in jobs) and len(jobs) == 2
    # --set verify_writes=0: one fio run, no read-back
    jobs.clear()
    W.SeqWrite(P.make_params("quick", ["verify_writes=0"])).run(Ctx(), m, None)
    assert len(jobs) == 1 and "verify=crc32c" not in jobs[0]


def test_stop_fuse_records_unmount_time_and_bad_exits(monkeypatch):
    monkeypatch.setattr(T, "umount", lambda mnt, fuse=False: None)
    td = {}
    T.stop_fuse(subprocess.Popen(["sh", "-c", "sleep 0.5; exit 0"]), "/x", grace=10, teardown=td)
    assert "unmount_s" in td and "warnings" not in td
    td = {}
    T.stop_fuse(subprocess.Popen(["sh", "-c", "sleep 0.5; exit 3"]), "/x", grace=10, teardown=td)
    assert td["warnings"] == ["daemon exited with status 3 after unmount"]
    td = {}
    hung = subprocess.Popen(["sleep", "60"], start_new_session=True)
    T.stop_fuse(hung, "/x", grace=0.2, teardown=td)
    assert hung.poll() is not None
    assert "killed" in td["warnings"][0]


def _rec(w, v, t, status, metrics=None, reason=None, rss=None):
    return {"workload": w, "variant": v, "target": t, "status": status,
            "metrics": metrics or {}, "reason": reason, "peak_rss_kib": rss}


def test_report_median_ratio_and_na_footnote():
    recs = [
        _rec("dbench", "clients=1", "btrfs", "ok", {"MB_s": 100.0, "max_latency_ms": 10.0}),
        _rec("dbench", "clients=1", "btrfs", "ok", {"MB_s": 300.0, "max_latency_ms": 30.0}),
        _rec("dbench", "clients=1", "btrfs", "ok", {"MB_s": 200.0, "max_latency_ms": 20.0}),
        _rec("dbench", "clients=1", "zfs-fuse", "ok", {"MB_s": 50.0, "max_latency_ms": 40.0}, rss=204800),
        _rec("dbench", "clients=1", "oleo", "na", reason="oleo: read-write mounts are not supported yet"),
    ]
    md = report.render(recs, {"targets": T.NAMES})
    assert "## dbench (seed 003)" in md
    row_btrfs = next(l for l in md.splitlines() if l.startswith("| btrfs |"))
    assert "200 (100–300)" in row_btrfs and "| 1.00 |" in row_btrfs
    row_zfs = next(l for l in md.splitlines() if l.startswith("| zfs-fuse |"))
    assert "| 0.25 |" in row_zfs and "| 2.00 |" in row_zfs and "| 200 |" in row_zfs
    row_oleo = next(l for l in md.splitlines() if l.startswith("| oleo |"))
    assert "N/A [1]" in row_oleo
    assert "[1] oleo: oleo: read-write mounts are not supported yet" in md
    # oleo listed first: the target order of the run, not alphabetical
    lines = md.splitlines()
    assert lines.index(row_oleo) < lines.index(row_btrfs)


def test_report_seq_write_goal_and_teardown_warning():
    recs = [
        _rec("seq-write", None, "btrfs", "ok", {"write_MiB_s": 400.0}),
        _rec("seq-write", None, "oleo", "ok", {"write_MiB_s": 260.0}),
        _rec("seq-write", None, "oleo", "ok", {"write_MiB_s": 300.0}),
        _rec("seq-write", None, "oleo", "ok", {"write_MiB_s": 320.0}),
    ]
    recs[1]["teardown"] = {"unmount_s": 120.5, "warnings": ["daemon still running 120 s after unmount; killed"]}
    md = report.render(recs, {"targets": T.NAMES})
    assert "## seq-write" in md
    row = next(l for l in md.splitlines() if l.startswith("| oleo |"))
    assert "300 (260–320)" in row and "| 0.75 |" in row and "[1]" in row
    assert "[1] oleo: at teardown: daemon still running 120 s after unmount; killed" in md
    assert "Goal: oleo ≥ 0.70× btrfs on write MiB/s (incl. final fsync): 0.75× — met." in md
    recs[2]["metrics"]["write_MiB_s"] = 100.0   # median now 260: 0.65x
    assert "0.65× — NOT met" in report.render(recs, {"targets": T.NAMES})
    recs = [r for r in recs if r["target"] == "btrfs"] + [
        _rec("seq-write", None, "oleo", "na", reason="oleo mount -o rw exited with status 1")]
    assert "not measured" in report.render(recs, {"targets": T.NAMES})


def test_plots_written_when_matplotlib_present(tmp_path):
    pytest.importorskip("matplotlib")
    from oleobench import plots
    recs = [_rec("seq-read", None, "btrfs", "ok", {"read_MiB_s": 500.0}),
            _rec("seq-read", None, "oleo", "na", reason="x")]
    out = plots.write(str(tmp_path), recs, {"targets": T.NAMES, "scale": "quick", "reps": 1})
    assert [os.path.basename(p) for p in out] == ["seq-read.png"]
    assert os.path.getsize(out[0]) > 1000


def _e2e_prereqs():
    if os.geteuid() != 0:
        return "needs root"
    missing = [t for t in ("fio", "dbench", "fs_mark", "mkfs.btrfs", "mkfs.xfs", "losetup")
               if subprocess.run(["sh", "-c", f"command -v {t}"], capture_output=True).returncode]
    if missing:
        return f"missing tools {missing} (run bench/run --setup)"
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse"
    return None


def test_quick_end_to_end(tmp_path):
    why = _e2e_prereqs()
    if why:
        if os.environ.get("CI") == "true":
            pytest.fail(f"bench quick run cannot run under CI: {why}")
        pytest.skip(why)
    results = tmp_path / "results"
    work = tmp_path / "work"
    r = subprocess.run([os.path.join(BENCH, "run"), "--quick", "--results", str(results),
                        "--work-dir", str(work)], capture_output=True, text=True, timeout=3600)
    assert r.returncode == 0, r.stderr[-4000:]

    recs = [json.loads(l) for l in (results / "results.jsonl").read_text().splitlines() if l.strip()]
    p = P.make_params("quick")
    expected = {(w.name, None if v is None else f"{w.variant_name}={v}", t)
                for w in (cls(p) for cls in W.ALL) for v in w.variants() for t in T.NAMES}
    got = {(x["workload"], x["variant"], x["target"]) for x in recs}
    assert got == expected
    assert len(recs) == len(expected)
    for x in recs:
        assert x["status"] in ("ok", "na"), x
        if x["status"] == "na":
            assert x["reason"], x
        else:
            assert x["metrics"] and all(isinstance(v, (int, float)) for v in x["metrics"].values()), x

    # Kernel btrfs is the reference: it must produce a number wherever it applies.
    have_oleo = os.access(os.path.join(os.path.dirname(BENCH), "target", "release", "oleo"), os.X_OK)
    btrfs = [x for x in recs if x["target"] == "btrfs"]
    # (the kernel's receive of oleo's stream needs an oleo binary)
    assert all(x["status"] == "ok" for x in btrfs
               if have_oleo or (x["workload"], x["variant"]) != ("receive", "stream=oleo")), \
        [x for x in btrfs if x["status"] != "ok"]
    # Static N/As carry their reason.
    na = {(x["workload"], x["target"]): x["reason"] for x in recs if x["status"] == "na"}
    assert "read-only" in na[("fsync-write", "btrfs-fuse")]
    assert "read-only" in na[("seq-write", "btrfs-fuse")]
    assert "snapshots" in na[("snapshot-under-write", "xfs")]
    # seq-write wrote the whole file (the runtime cap is for slow targets only).
    sw = next(x for x in btrfs if x["workload"] == "seq-write")
    assert sw["metrics"]["written_MiB"] == pytest.approx(p.seqw_file_mib)
    # oleo is a writable target: every write workload ran on an rw mount of a fresh
    # mkfs.btrfs image (its daemon ran and was stopped: teardown says how); seed 004 too,
    # through oleo's own subvolume commands.
    # Whether oleo then produced a number is oleo's business, not the harness's; a
    # number it did produce passed the read-back check and left a live mount.
    oleo = {(x["workload"], x["variant"]): x for x in recs if x["target"] == "oleo"}
    if os.access(os.path.join(os.path.dirname(BENCH), "target", "release", "oleo"), os.X_OK):
        snaps = [x for (w, _), x in oleo.items() if w == "snapshot-under-write"]
        assert len(snaps) == 2 and all(x["status"] != "na" for x in snaps), snaps
        writes = [x for (w, _), x in oleo.items()
                  if w in ("fsync-write", "seq-write", "fsmark-create", "uring-randrw",
                           "compress-write", "dbench")]
        # uring-randrw: the seed's mix, 4 KiB random writes, 1 MiB sequential writes;
        # compress-write: compressible and incompressible data.
        assert len(writes) == 3 + 1 + 1 + 3 + 2 + 3
        for x in writes:
            assert "read-only" not in (x["reason"] or ""), x
            assert x["teardown"] and ("unmount_s" in x["teardown"] or x["teardown"]["warnings"]), x
            if x["status"] == "ok":
                assert x["peak_rss_kib"] and "unmount_s" in x["teardown"], x
    else:
        assert all("oleo binary not found" in x["reason"] for x in oleo.values())
    # FUSE daemons report peak RSS when they ran (oleo's scrub, send and receive run no
    # daemon).
    for x in recs:
        if x["workload"] in ("scrub", "send", "receive"):
            continue
        if x["status"] == "ok" and x["target"] in ("fuse2fs", "zfs-fuse", "btrfs-fuse", "oleo"):
            assert x["peak_rss_kib"], x

    meta = json.loads((results / "meta.json").read_text())
    for tool in ("kernel", "fio", "dbench", "fs_mark"):
        assert meta["versions"].get(tool), tool
    md = (results / "report.md").read_text()
    for cls in W.ALL:
        assert f"## {cls.name}" in md
    try:
        import matplotlib  # noqa: F401
        have_mpl = True
    except ImportError:
        have_mpl = subprocess.run(["/usr/bin/python3", "-c", "import matplotlib"]).returncode == 0
    if have_mpl:
        assert sorted(os.listdir(results / "plots")) == sorted(f"{c.name}.png" for c in W.ALL)

    # Nothing left mounted or attached under the work dir.
    real = os.path.realpath(work)
    with open("/proc/self/mountinfo") as f:
        assert not [l for l in f if real in l.split()[4]]
    loops = subprocess.run(["losetup", "-l", "-n", "-O", "BACK-FILE"], capture_output=True, text=True).stdout
    assert real not in loops
    assert not [n for n in os.listdir(work) if n.startswith("m")]


class _Ctx:
    """Just enough of runner.Context for runner.measure."""

    def __init__(self, work_dir, p):
        self.work_dir, self.p, self.deadline = str(work_dir), p, None
        self.results_dir = None

    def unavailable(self, target):
        return None


class _Mounted:
    def __init__(self, path, daemon=None):
        self.path, self.scratch, self.daemon = path, path, daemon
        self.teardown = {}

    def peak_rss_kib(self):
        return 1234


class _ScriptedTarget(_FakeTarget):
    def __init__(self, torn_down, daemon=None):
        super().__init__("btrfs")
        self.torn_down, self.daemon = torn_down, daemon

    def fresh(self, cl, scratch, spec):
        cl.push("teardown", self.torn_down.append, scratch)
        return _Mounted(scratch, self.daemon)


def _measure_with(tmp_path, monkeypatch, behaviour, daemon=None):
    from oleobench.sysutil import CmdError, NotApplicable
    monkeypatch.setattr(runner, "drop_caches", lambda: None)
    p = P.make_params("quick")
    torn_down = []
    ctx = _Ctx(tmp_path, p)
    ctx.targets = {"btrfs": _ScriptedTarget(torn_down, daemon)}

    class W1(W.FsyncWrite):
        def run(self, ctx, m, variant):
            if behaviour == "ok":
                return {"write_MiB_s": 1.0}
            if behaviour == "na":
                raise NotApplicable("cannot")
            if behaviour == "cmd":
                raise CmdError(["fio", "--output=x", "/w/job.fio"], 1, "", "fio: bad things")
            raise ZeroDivisionError("bug")

    rec = runner.measure(ctx, 1, 1, W1(p), 4, "btrfs")
    return rec, torn_down


@pytest.mark.parametrize("behaviour,status", [("ok", "ok"), ("na", "na"), ("cmd", "na"), ("bug", "error")])
def test_measure_statuses_and_teardown(tmp_path, monkeypatch, behaviour, status):
    rec, torn_down = _measure_with(tmp_path, monkeypatch, behaviour)
    assert rec["status"] == status
    assert rec["variant"] == "jobs=4"
    assert len(torn_down) == 1                       # the cleanup stack ran in every case
    assert not os.path.exists(torn_down[0])          # and the scratch dir is gone
    if status == "ok":
        assert rec["metrics"] == {"write_MiB_s": 1.0} and rec["peak_rss_kib"] == 1234
    else:
        assert rec["reason"]
    if behaviour == "cmd":
        assert rec["reason"].startswith("fio exited 1: fio: bad things")


@pytest.mark.parametrize("behaviour", ["ok", "na"])
def test_a_failed_measurement_keeps_its_daemon_log(tmp_path, monkeypatch, behaviour):
    from oleobench.sysutil import NotApplicable
    monkeypatch.setattr(runner, "drop_caches", lambda: None)
    p = P.make_params("quick")
    ctx = _Ctx(tmp_path / "work", p)
    ctx.results_dir = str(tmp_path / "results")

    class Logging(_ScriptedTarget):
        def fresh(self, cl, scratch, spec):
            with open(os.path.join(scratch, "oleo.log"), "w") as f:
                f.write("transaction 7 aborted: why\n")
            return super().fresh(cl, scratch, spec)
    ctx.targets = {"btrfs": Logging([])}

    class W1(W.FsyncWrite):
        def run(self, ctx, m, variant):
            if behaviour == "na":
                raise NotApplicable("dbench exited 1: Read-only file system")
            return {"write_MiB_s": 1.0}

    rec = runner.measure(ctx, 1, 1, W1(p), 4, "btrfs")
    assert rec["status"] == behaviour
    if behaviour == "ok":
        assert "logs" not in rec and not (tmp_path / "results").exists()
    else:
        assert rec["logs"] == ["logs/m0001-btrfs-oleo.log"]
        assert "aborted: why" in (tmp_path / "results" / rec["logs"][0]).read_text()
    assert not (tmp_path / "work" / "m0001").exists()


def test_measure_discards_numbers_of_a_daemon_that_died(tmp_path, monkeypatch):
    """A tool can print a result even though the FUSE daemon died (or its connection
    was aborted) under it: that is not a measurement."""
    dead = subprocess.Popen(["sh", "-c", "exit 7"])
    dead.wait()
    rec, torn_down = _measure_with(tmp_path, monkeypatch, "ok", daemon=dead)
    assert rec["status"] == "na" and rec["metrics"] == {}
    assert "exited with status 7 during the workload" in rec["reason"]
    assert len(torn_down) == 1


def test_read_while_write_jobs_and_ratio(tmp_path, monkeypatch):
    p = P.make_params("full")
    jobs, dropped = [], []

    def job(name, rbw, wbw):
        return {"jobname": name, "error": 0,
                "read": {"bw_bytes": rbw, "iops": 0, "io_bytes": rbw * 20, "runtime": 20000},
                "write": {"bw_bytes": wbw, "iops": 0, "io_bytes": wbw * 20, "runtime": 20000}}

    def fake_run_fio(text, scratch, timeout, readonly=False):
        jobs.append(text)
        if "[writers]" in text:
            return {"jobs": [job("reader", 300 << 20, 0), job("writers", 0, 50 << 20)]}
        if "rw=read" in text:
            return {"jobs": [job("read-while-write", 400 << 20, 0)]}
        return {"jobs": [job("read-while-write", 0, 100 << 20)]}
    monkeypatch.setattr(tools, "run_fio", fake_run_fio)
    monkeypatch.setattr(W, "drop_caches", lambda: dropped.append(len(jobs)))

    class Ctx:
        def save_job(self, *a):
            pass

        def remaining(self):
            return 100

    w = W.ReadWhileWrite(p)
    assert w.check(_FakeTarget("raw", raw=True, family="raw")) is not None
    m = T.Mounted(_FakeTarget("btrfs"), str(tmp_path / "mnt"), scratch=str(tmp_path))
    res = w.run(Ctx(), m, None)
    layout, quiet, busy = jobs
    assert "end_fsync=1" in layout and "size=1024M" in layout
    # cold: caches dropped after the layout and before the busy run
    assert dropped == [1, 2]
    for text in (quiet, busy):
        assert "direct=1" in text and "time_based" in text and "runtime=20" in text
    assert "new_group" in busy and "fsync=1" in busy and "numjobs=4" in busy
    assert res["quiet_read_MiB_s"] == pytest.approx(400.0)
    assert res["busy_read_MiB_s"] == pytest.approx(300.0)
    assert res["read_kept"] == pytest.approx(0.75)
    assert res["write_MiB_s_meanwhile"] == pytest.approx(50.0)
    recs = [_rec("read-while-write", None, "oleo", "ok", {"read_kept": k}) for k in (0.7, 0.85, 0.9)]
    md = report.render(recs, {"targets": T.NAMES})
    assert "Goal: oleo read MiB/s" not in md
    assert "Goal: oleo busy / alone ≥ 0.80: 0.85 — met." in md


# ---------------------------------------------------------------- multi-device (issue 31)

SCRUB_RAW = """scrub done for 59a1d4a0-206c-459f-a271-f783576c0b5a
Scrub started:    Fri Nov 27 19:23:32 2026
Status:           finished
Duration:         0:00:00
\tdata_extents_scrubbed: 1600
\ttree_extents_scrubbed: 26
\tdata_bytes_scrubbed: 268435456
\ttree_bytes_scrubbed: 425984
\tread_errors: 0
\tcsum_errors: 0
\tverify_errors: 0
\tno_csum: 0
\tcsum_discards: 0
\tsuper_errors: 0
\tmalloc_errors: 0
\tuncorrectable_errors: 0
\tunverified_errors: 0
\tcorrected_errors: 0
\tlast_physical: 169213952
"""


def test_multi_device_params_and_targets():
    full, quick = P.make_params("full"), P.make_params("quick")
    assert (full.raid_file_mib, full.raid_runtime_s, full.scrub_data_mib) == (1024, 20, 1024)
    assert (quick.raid_file_mib, quick.raid_runtime_s, quick.scrub_data_mib) == (64, 2, 128)
    rsr, scrub = W.RaidSeqRead(quick), W.Scrub(quick)
    assert rsr.variants() == ["raid0", "raid1", "raid0-qd8", "raid1-qd8"]
    assert rsr.multi_dataset("raid0")[3] == ["-d", "raid0", "-m", "raid1"]
    assert rsr.multi_dataset("raid1-qd8")[3] == ["-d", "raid1", "-m", "raid1"]
    assert rsr.split("raid1-qd8") == ("raid1", 8) and rsr.split("raid0") == ("raid0", 1)
    assert rsr.multi_dataset("raid1")[3] == scrub.multi_dataset(None)[3] == ["-d", "raid1", "-m", "raid1"]
    # at full scale scrub and raid1 reads share one data set
    assert W.RaidSeqRead(full).multi_dataset("raid1") == W.Scrub(full).multi_dataset(None)
    for w in (rsr, scrub):
        assert w.check(T.Btrfs(None)) is None and w.check(T.Oleo(_OleoCtx())) is None
        for t in (T.Xfs(None), T.Fuse2fs(None), T.BtrfsFuse(None), T.FuseFloor(_OleoCtx()),
                  T.Raw(None), _FakeTarget("ext4", family="ext4")):
            assert w.check(t), (w.name, t.name)
    assert rsr.check(T.OleoDevFuse(_OleoCtx())) is None
    assert "without FUSE" in scrub.check(T.OleoDevFuse(_OleoCtx()))
    assert scrub.multi_mode(T.Btrfs(None)) == "rw" and scrub.multi_mode(T.Oleo(_OleoCtx())) is None
    assert rsr.multi_mode(T.Oleo(_OleoCtx())) == "ro"


def test_scrub_raw_counters():
    c = tools.parse_scrub_raw(SCRUB_RAW)
    assert c["data_bytes_scrubbed"] == 268435456 and c["tree_bytes_scrubbed"] == 425984
    assert c["csum_errors"] == 0 and "Duration" not in c
    with pytest.raises(ValueError):
        tools.parse_scrub_raw("scrub done\nDuration: 0:00:01\n")


def test_oleo_multi_device_mounts_every_image_or_none(tmp_path, monkeypatch):
    spawned, copied = [], []
    monkeypatch.setattr(T, "enable_fuse_uring", lambda: None)
    monkeypatch.setattr(T, "copy_sparse", lambda a, b: copied.append((a, b)))
    monkeypatch.setattr(T, "spawn_fuse", lambda cl, argv, *a, **kw: spawned.append(argv) or "proc")
    oleo = T.Oleo(_OleoCtx())
    m = oleo.from_multi(None, str(tmp_path), ["/g/dev0.img", "/g/dev1.img"], "ro")
    imgs = [str(tmp_path / "oleo-0.img"), str(tmp_path / "oleo-1.img")]
    assert copied == list(zip(["/g/dev0.img", "/g/dev1.img"], imgs))
    assert spawned == [["/nonexistent/oleo", "mount", "-f", "-o", "ro,fuse_uring=on"] + imgs
                       + [str(tmp_path / "mnt")]]
    assert m.images == imgs and m.image == imgs[0] and m.daemon == "proc"
    # scrub: copies, no mount; the CLI gets every image
    m = oleo.from_multi(None, str(tmp_path), ["/g/dev0.img", "/g/dev1.img"], None)
    assert len(spawned) == 1 and m.path is None and m.daemon is None
    assert oleo.scrub_argv(m) == ["/nonexistent/oleo", "scrub", "start", "-B", "-R",
                                  "--image", imgs[0], "--image", imgs[1]]


def test_kernel_multi_device_loops_mount_device_option_and_forget(tmp_path, monkeypatch):
    from oleobench.sysutil import Cleanup
    events, loops = [], iter(["/dev/loop7", "/dev/loop8"])
    monkeypatch.setattr(T, "copy_sparse", lambda a, b: None)
    monkeypatch.setattr(T, "loop_attach", lambda image: next(loops))
    monkeypatch.setattr(T, "loop_detach", lambda dev: events.append(("detach", dev)))
    monkeypatch.setattr(T, "mount", lambda dev, mnt, fstype, opts: events.append(("mount", dev, fstype, opts)))
    monkeypatch.setattr(T, "umount", lambda mnt: events.append(("umount",)))
    monkeypatch.setattr(T, "run", lambda argv, **kw: events.append(tuple(argv)))
    cl = Cleanup()
    m = T.Btrfs(None).from_multi(cl, str(tmp_path), ["/g/dev0.img", "/g/dev1.img"], "ro")
    assert events == [("mount", "/dev/loop7", "btrfs", "ro,device=/dev/loop8")]
    assert m.images == [str(tmp_path / "btrfs-0.img"), str(tmp_path / "btrfs-1.img")]
    assert T.Btrfs(None).scrub_argv(m) == ["btrfs", "scrub", "start", "-B", "-R", m.path]
    cl.close()
    assert events[1:] == [("umount",), ("btrfs", "device", "scan", "--forget", "/dev/loop7", "/dev/loop8"),
                          ("detach", "/dev/loop8"), ("detach", "/dev/loop7")]


def test_raid_seq_read_job_and_scrub_rate(tmp_path, monkeypatch):
    jobs = []

    def fake_run_fio(text, scratch, timeout, readonly=False):
        jobs.append((text.splitlines(), readonly))
        return {"jobs": [{"jobname": "x", "error": 0,
                          "read": {"bw_bytes": 500 << 20, "iops": 500, "io_bytes": 1000 << 20, "runtime": 2000},
                          "write": {"bw_bytes": 0, "iops": 0, "io_bytes": 0, "runtime": 0}}]}
    monkeypatch.setattr(tools, "run_fio", fake_run_fio)

    class Ctx:
        def save_job(self, *a):
            pass

        def remaining(self):
            return 100

    p = P.make_params("quick")
    m = T.Mounted(_FakeTarget("btrfs"), str(tmp_path / "mnt"), scratch=str(tmp_path))
    res = W.RaidSeqRead(p).run(Ctx(), m, "raid1")
    (lines, readonly), = jobs
    for want in ("rw=read", "bs=1M", "direct=1", "time_based", "runtime=2", "size=64M",
                 f"filename={tmp_path}/mnt/data/seq.bin"):
        assert want in lines, (want, lines)
    assert readonly and res["read_MiB_s"] == pytest.approx(500.0)

    outs = [SCRUB_RAW]

    class Tgt(_FakeTarget):
        def scrub_argv(self, m):
            return ["scrub"]

    def fake_run(argv, **kw):
        assert kw["env"]["XDG_STATE_HOME"] == str(tmp_path)
        return subprocess.CompletedProcess(argv, 0, outs[0], "")
    monkeypatch.setattr(W, "run", fake_run)
    m = T.Mounted(Tgt("btrfs"), str(tmp_path / "mnt"), scratch=str(tmp_path))
    res = W.Scrub(p).run(Ctx(), m, None)   # 2 x 128 MiB of data: both copies
    assert res["scrubbed_MiB"] == pytest.approx(256 + 425984 / (1 << 20))
    assert res["scrub_MiB_s"] == pytest.approx(res["scrubbed_MiB"] / res["wall_s"])
    outs[0] = SCRUB_RAW.replace("csum_errors: 0", "csum_errors: 3")
    with pytest.raises(W.NotApplicable, match="errors on a clean copy.*csum_errors"):
        W.Scrub(p).run(Ctx(), m, None)
    outs[0] = SCRUB_RAW.replace("268435456", "134217728")
    with pytest.raises(W.NotApplicable, match="less than both copies"):
        W.Scrub(p).run(Ctx(), m, None)


def test_report_multi_device_goals():
    recs = [_rec("raid-seq-read", "profile=raid0", "btrfs", "ok", {"read_MiB_s": 800.0}),
            _rec("raid-seq-read", "profile=raid0", "oleo", "ok", {"read_MiB_s": 400.0}),
            _rec("raid-seq-read", "profile=raid1", "btrfs", "ok", {"read_MiB_s": 500.0}),
            _rec("raid-seq-read", "profile=raid1", "oleo", "ok", {"read_MiB_s": 600.0}),
            _rec("scrub", None, "btrfs", "ok", {"scrub_MiB_s": 1000.0, "scrubbed_MiB": 2048.0, "wall_s": 2.0}),
            _rec("scrub", None, "oleo", "ok", {"scrub_MiB_s": 250.0, "scrubbed_MiB": 2048.0, "wall_s": 8.0})]
    md = report.render(recs, {"targets": T.NAMES})
    assert "## raid-seq-read" in md and "## scrub" in md
    assert "Goal (profile=raid0): oleo ≥ 1.00× btrfs on read MiB/s: 0.50× — NOT met." in md
    assert "Goal (profile=raid1): oleo ≥ 1.00× btrfs on read MiB/s: 1.20× — met." in md
    assert "Goal: oleo ≥ 1.00× btrfs on scrub MiB/s (bytes scrubbed / wall s): 0.25× — NOT met." in md


# ---------------------------------------------------------------- send / receive (issue 32)

from oleobench import sendrecv as SR  # noqa: E402


def test_send_receive_params_plan_and_targets():
    full, quick = P.make_params("full"), P.make_params("quick")
    assert (full.sr_files, full.sr_dirs, full.sr_total_mib) == (100000, 1000, 4096)
    assert (quick.sr_files, quick.sr_dirs, quick.sr_total_mib) == (2000, 20, 256)
    assert P.make_params("original").sr_total_mib == 4096
    assert W.Receive(full).variants() == ["kernel", "oleo"]
    assert W.Receive(P.make_params("full", ["sr_recv_streams=kernel"])).variants() == ["kernel"]
    assert W.Send(full).variants() == [None]
    # the cache key changes with every parameter of the source, not with the rest
    assert SR.source_key(full) != SR.source_key(P.make_params("full", ["sr_files=99999"]))
    assert SR.source_key(full) == SR.source_key(P.make_params("full", ["sr_timeout_s=5"]))
    assert SR.source_image_bytes(full) >= 6 * T.GiB
    plan = runner.make_plan([W.Send(quick), W.Receive(quick)], ["oleo", "btrfs"], 1)
    assert [(w.name, v, t) for _, w, v, t in plan] == [
        ("send", None, "oleo"), ("send", None, "btrfs"),
        ("receive", "kernel", "oleo"), ("receive", "kernel", "btrfs"),
        ("receive", "oleo", "oleo"), ("receive", "oleo", "btrfs")]
    for w in (W.Send(quick), W.Receive(quick)):
        assert w.kind == "stream" and w.budget_s() == 300
        assert w.check(T.Btrfs(None)) is None and w.check(T.Oleo(_OleoCtx())) is None
        assert "without FUSE" in w.check(T.OleoDevFuse(_OleoCtx()))
        for t in (T.Xfs(None), T.Fuse2fs(None), T.BtrfsFuse(None), T.Raw(None)):
            assert "oleo and kernel btrfs only" in w.check(t), (w.name, t.name)
    assert W.Send(full).budget_s() == 1200


class _SrcCtx:
    def __init__(self, tmp_path, p, src):
        self.p, self.oleo_bin, self.work_dir = p, "/o/oleo", str(tmp_path)
        self._golden = {("send-src", SR.source_key(p)): (True, src)}
        self.targets = {"oleo": T.Oleo(self)}

    def remaining(self):
        return 100

    def unavailable(self, target):
        return None


def _source(tmp_path, **more):
    m = {"files": 10, "bytes": 10 << 20, "kernel_stream_bytes": 11 << 20, "image_bytes": 4 << 30}
    m.update(more)
    return SR.Source(str(tmp_path / "src"), m)


def test_send_argv_rates_and_stream_size_check(tmp_path, monkeypatch):
    p = P.make_params("quick")
    src = _source(tmp_path)
    ctx = _SrcCtx(tmp_path, p, src)
    calls = []
    monkeypatch.setattr(SR, "timed", lambda argvs, timeout, stdout_path=None, cwd=None:
                        calls.append((argvs[0], stdout_path)) or (2.0, 1.5))
    w = W.Send(p)
    m = T.Mounted(T.Btrfs(None), str(tmp_path / "mnt"), image=src.image, scratch=str(tmp_path))
    res = w.run(ctx, m, None)
    assert calls[-1] == (["btrfs", "send", "-q", str(tmp_path / "mnt" / "snap")], os.devnull)
    assert res["stream_MiB_s"] == pytest.approx(5.5) and res["files_per_s"] == pytest.approx(5.0)
    assert res["data_MiB_s"] == pytest.approx(5.0) and res["wall_s"] == 2.0 and res["cpu_s"] == 1.5
    # oleo: the unmounted image; its stream was counted (untimed) and compared first
    monkeypatch.setattr(SR, "_count_stdout", lambda argv, timeout: calls.append((argv, "count")) or (11 << 20) + 100)
    m = w.prepare(ctx, None, str(tmp_path), T.Oleo(ctx), src)
    assert calls[-1] == (["/o/oleo", "send", "--image", src.image, "/snap"], "count")
    res = w.run(ctx, m, None)
    assert calls[-1] == (["/o/oleo", "send", "--image", src.image, "/snap"], os.devnull)
    assert res["stream_MiB"] == pytest.approx(11 + 100 / (1 << 20))
    # a stream 10% off the kernel's gets no number
    ctx._golden[("oleo-stream", src.dir, False)] = (True, 10 << 20)
    with pytest.raises(W.NotApplicable, match="more than 5% apart"):
        w.prepare(ctx, None, str(tmp_path), T.Oleo(ctx), src)


def test_receive_argv_and_received_tree_check(tmp_path, monkeypatch):
    p = P.make_params("quick")
    src = _source(tmp_path)
    ctx = _SrcCtx(tmp_path, p, src)
    cmds, counted = [], [(10, 10 << 20)]
    monkeypatch.setattr(SR, "run", lambda argv, **kw: cmds.append([str(a) for a in argv]))
    monkeypatch.setattr(SR, "timed", lambda argvs, timeout, stdout_path=None, cwd=None:
                        cmds.extend(argvs) or (4.0, 3.0))
    monkeypatch.setattr(SR, "count_tree", lambda path, timeout: counted[0])
    w = W.Receive(p)
    m = T.Mounted(T.Btrfs(None), str(tmp_path / "mnt"), scratch=str(tmp_path))
    res = w.run(ctx, m, "kernel")
    assert cmds == [["btrfs", "receive", "-q", "-f", src.stream, str(tmp_path / "mnt")],
                    ["sync", "-f", str(tmp_path / "mnt")]]
    assert res["stream_MiB_s"] > 0 and res["files_per_s"] > 0
    # oleo: a fresh mkfs.btrfs image of the source's size, then oleo receive into its top
    cmds.clear()
    monkeypatch.setattr(SR, "make_sparse", lambda path, size: cmds.append(["sparse", size]))
    m = w.prepare(ctx, None, str(tmp_path), T.Oleo(ctx), src)
    assert cmds == [["sparse", 4 << 30], ["mkfs.btrfs", "-f", "-q", str(tmp_path / "oleo.img")]]
    monkeypatch.setattr(W.Receive, "count_oleo", lambda self, ctx, m: counted[0])
    res = w.run(ctx, m, "kernel")
    assert cmds[-1] == ["/o/oleo", "receive", "--image", str(tmp_path / "oleo.img"), "-f",
                        src.stream, "/"]
    assert res["wall_s"] == 4.0 and res["stream_MiB_s"] == pytest.approx(11 / 4)
    assert res["cpu_s"] == 3.0
    counted[0] = (9, 9 << 20)
    with pytest.raises(W.NotApplicable, match="received tree holds 9 files"):
        w.run(ctx, m, "kernel")


def test_run_can_send_stdout_to_a_file(tmp_path):
    from oleobench.sysutil import run
    with open(tmp_path / "out", "w") as f:
        r = run(["echo", "hello"], stdout=f)
    assert r.stdout == "" and (tmp_path / "out").read_text() == "hello\n"
    # timed: the first command's output to the file, wall and CPU seconds of all
    wall, cpu = SR.timed([["sh", "-c", "echo one"], ["true"]], 10, stdout_path=str(tmp_path / "o2"))
    assert (tmp_path / "o2").read_text() == "one\n" and wall > 0 and cpu >= 0


def test_report_send_receive_goals():
    recs = [_rec("send", None, "btrfs", "ok", {"stream_MiB_s": 400.0}),
            _rec("send", None, "oleo", "ok", {"stream_MiB_s": 500.0}),
            _rec("receive", "stream=kernel", "btrfs", "ok", {"stream_MiB_s": 200.0}),
            _rec("receive", "stream=kernel", "oleo", "ok", {"stream_MiB_s": 100.0})]
    md = report.render(recs, {"targets": T.NAMES})
    assert "## send" in md and "## receive" in md
    assert "Goal: oleo ≥ 1.00× btrfs on stream MiB/s: 1.25× — met." in md
    assert "Goal (stream=kernel): oleo ≥ 0.80× btrfs on stream MiB/s: 0.50× — NOT met." in md


def test_offline_fill_script(tmp_path):
    """bench/offline-fill.sh on a small tree: four rows, each with both times and a ratio,
    and oleo's image accepted by btrfs check (the script fails otherwise)."""
    oleo = os.path.join(os.path.dirname(BENCH), "target", "release", "oleo")
    why = None
    if os.geteuid() != 0:
        why = "needs root (the kernel side mounts a loop device)"
    elif not os.access(oleo, os.X_OK):
        why = "no target/release/oleo (cargo build --release -p oleo-cli)"
    else:
        missing = [t for t in ("mkfs.btrfs", "losetup", "zstd", "gzip", "bc")
                   if subprocess.run(["sh", "-c", f"command -v {t}"],
                                     capture_output=True).returncode]
        if missing:
            why = f"missing tools {missing}"
    if why:
        if os.environ.get("CI") == "true":
            pytest.fail(f"offline-fill cannot run under CI: {why}")
        pytest.skip(why)
    report_md = tmp_path / "report.md"
    env = dict(os.environ, ROUNDS="1", FILES="300", DIRS="10", TMPDIR=str(tmp_path))
    r = subprocess.run(["bash", os.path.join(BENCH, "offline-fill.sh"), str(report_md)],
                       capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr[-4000:]
    rows = [l for l in report_md.read_text().splitlines() if l.startswith("| ") and "x |" in l]
    assert [l.split("|")[1].strip() for l in rows] == [
        "tar -x of .tar", "tar -x of .tar.zst", "tar -x of .tar.gz", "cp -a of the tree"]
    for l in rows:
        kernel, oleo_s, ratio = (c.strip() for c in l.split("|")[2:5])
        assert float(kernel) > 0 and float(oleo_s) > 0 and float(ratio.rstrip("x")) > 0, l
    assert "btrfs check --check-data-csum clean" in report_md.read_text()


def test_offcpu_weighs_each_wait_until_the_next_switch():
    """bench/offcpu.py: a thread's switch-out counts until its next one, under the kernel
    reason and the first frame of the program's own code (locks and std skipped)."""
    sys.path.insert(0, BENCH)
    import offcpu
    text = """w-1 10/11 [000] 1.000000: sched:sched_switch: prev_comm=w-1
\tffff __schedule+0x1 ([kernel.kallsyms])
\tffff futex_do_wait+0x2 ([kernel.kallsyms])
\t1234 parking_lot::raw_rwlock::RawRwLock::lock_shared_slow+0x9 (/bin/oleo)
\t1235 oleo::filesystem::Filesystem::core_read+0x3 (/bin/oleo)
\t1236 oleo_fuse::ops::write+0x3 (/bin/oleo)

w-1 10/11 [001] 1.250000: sched:sched_switch: prev_comm=w-1
\tffff __schedule+0x1 ([kernel.kallsyms])
\tffff io_cqring_wait+0x2 ([kernel.kallsyms])
\t1237 oleo_fuse::transport::uring::exchange+0x5 (/bin/oleo)

w-1 10/11 [001] 2.250000: sched:sched_switch: prev_comm=w-1
\tffff __schedule+0x1 ([kernel.kallsyms])
"""
    spent = offcpu.weigh(offcpu.events(text.splitlines(True), ["oleo"]))
    assert spent[("futex_do_wait", "oleo::filesystem::Filesystem::core_read")] == pytest.approx(0.25)
    assert spent[("io_cqring_wait", "oleo_fuse::transport::uring::exchange")] == pytest.approx(1.0)
    assert len(spent) == 2
