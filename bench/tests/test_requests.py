"""FUSE requests per operation (issue 41): parsing, per-operation arithmetic and the report
table, without root or a mount."""

import os
import re
import sys

import pytest

BENCH = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO = os.path.dirname(BENCH)
sys.path.insert(0, BENCH)

from oleobench import report, requests, tools  # noqa: E402
from oleobench import targets as T  # noqa: E402
from oleobench import workloads as W  # noqa: E402

DBENCH_OUT = """   1      6524    52.62 MB/sec  execute   1 sec  latency 95.878 ms
   0  cleanup   2 sec

 Operation      Count    AvgLat    MaxLat
 ----------------------------------------
 NTCreateX       1950     0.062    24.967
 Close           1453     0.001     0.030
 ReadX           2951     0.008    17.726
 Flush            148    11.055   122.247

Throughput 52.6235 MB/sec  1 clients  1 procs  max_latency=95.878 ms
"""


def counts(**by_name):
    c = [0] * requests.SLOTS
    ids = {v: k for k, v in requests.NAMES.items()}
    for name, n in by_name.items():
        c[ids[name]] = n
    return c


def test_dbench_operations_are_summed():
    assert tools.parse_dbench_ops(DBENCH_OUT) == 1950 + 1453 + 2951 + 148
    assert tools.parse_dbench_ops("Throughput 1 MB/sec  1 clients  1 procs  max_latency=1 ms") is None
    # the throughput is still read from the same output
    assert tools.parse_dbench(DBENCH_OUT) == (pytest.approx(52.6235), pytest.approx(95.878))


def test_requests_per_file_created():
    before = counts(INIT=1, GETATTR=1, OPENDIR=1, IOCTL=1)
    after = counts(INIT=1, GETATTR=4, OPENDIR=1, IOCTL=2, LOOKUP=20002, CREATE=10000,
                   RELEASE=10000, MKDIR=2)
    params = {"threads": 2, "files_per_thread": 5000, "loops": 1}
    r = requests.per_operation("fsmark-create", before, after, {}, params)
    assert r["operation"] == "file created" and r["ops"] == 10000
    assert r["requests"] == {"LOOKUP": 20002, "CREATE": 10000, "RELEASE": 10000, "MKDIR": 2,
                             "GETATTR": 3, "IOCTL": 1}
    assert r["per_op"]["LOOKUP"] == pytest.approx(2.0002)
    assert r["total_per_op"] == pytest.approx(40008 / 10000)


def test_operations_per_workload():
    c0, c1 = counts(), counts(WRITE=512, FSYNC=256)
    r = requests.per_operation("fsync-write", c0, c1, {"written_MiB": 16}, {})
    assert (r["operation"], r["ops"]) == ("4 KiB written", 4096)
    assert r["per_op"] == {"WRITE": 0.125, "FSYNC": 0.0625}
    r = requests.per_operation("dbench", c0, c1, {"ops": 768}, {})
    assert r["operation"] == "dbench op" and r["total_per_op"] == pytest.approx(1.0)
    r = requests.per_operation("uring-randrw", c0, c1, {"read_MiB": 1, "written_MiB": 1}, {})
    assert r["ops"] == 512
    # no counts, no operations, or a workload without a definition: nothing
    assert requests.per_operation("fsync-write", None, c1, {"written_MiB": 1}, {}) is None
    assert requests.per_operation("dbench", c0, c1, {"ops": None}, {}) is None
    assert requests.per_operation("meta-walk", c0, c1, {}, {}) is None
    # every workload with a definition exists
    assert set(requests.OPERATIONS) <= {w.name for w in W.ALL}


def test_only_oleo_transport_targets_are_asked():
    asked = {cls.name for cls in T.ALL if cls.fuse_stats}
    assert asked == {"oleo", "oleo-devfuse", "fuse-floor", "fuse-floor-devfuse"}

    class M:
        target, path = T.Btrfs(None), "/nonexistent"
    assert requests.snapshot(M()) is None


def test_names_and_ioctl_number_match_the_transport():
    rust = open(os.path.join(REPO, "crates/fuse/src/transport/counts.rs")).read()
    names = {int(n): s for n, s in re.findall(r'^\s*(\d+) => "([A-Z_0-9]+)",$', rust, re.M)}
    assert names == requests.NAMES
    assert f"pub const SLOTS: usize = {requests.SLOTS};" in rust
    ioctl = open(os.path.join(REPO, "crates/fuse/src/subvol_ioctl.rs")).read()
    assert "pub const FUSE_STATS: u32 = ioc(READ, 18, FUSE_STATS_SIZE);" in ioctl
    assert requests.FUSE_STATS == 0x8200_6F12
    assert "pub const FUSE_STATS_TIME: u32 = ioc(READ, 19, FUSE_STATS_SIZE);" in ioctl
    assert requests.FUSE_STATS_TIME == 0x8200_6F13


def test_server_time_per_operation():
    # counts then nanoseconds by slot, as snapshot() reads them from oleo's transport
    c0 = counts() + [0] * requests.SLOTS
    c1 = counts(LOOKUP=200, CREATE=100) + [0] * requests.SLOTS
    c1[requests.SLOTS + 1] = 300_000      # 300 µs on LOOKUPs
    c1[requests.SLOTS + 35] = 700_000     # 700 µs on CREATEs
    params = {"threads": 1, "files_per_thread": 100, "loops": 1}
    r = requests.per_operation("fsmark-create", c0, c1, {}, params)
    assert r["requests"] == {"LOOKUP": 200, "CREATE": 100}
    assert r["server_us_per_op"] == pytest.approx(10.0)
    # a server without the time ioctl: counts only, no time
    r = requests.per_operation("fsmark-create", c0[:requests.SLOTS], c1[:requests.SLOTS],
                               {}, params)
    assert "server_us_per_op" not in r
    recs = [rec("oleo", {"LOOKUP": 2.0, "CREATE": 1.0}, 3.0),
            rec("fuse-floor", {"LOOKUP": 2.0, "CREATE": 1.0}, 3.0)]
    recs[0]["fuse_requests"]["server_us_per_op"] = 10.0
    text = report.render(recs, {"targets": ["oleo", "fuse-floor"]})
    table = text[text.index("FUSE requests per file created"):]
    assert "| target | LOOKUP | CREATE | others | total | server µs per op |" in table
    assert "| oleo | 2.00 | 1.00 | 0.00 | 3.00 | 10.0 |" in table
    assert "| fuse-floor | 2.00 | 1.00 | 0.00 | 3.00 |  |" in table


def rec(target, per_op, total, variant=None):
    return {"workload": "fsmark-create", "variant": variant, "target": target, "status": "ok",
            "metrics": {"files_per_s": 1000.0}, "params": {},
            "fuse_requests": {"operation": "file created", "ops": 10, "requests": {},
                              "per_op": per_op, "total_per_op": total}}


def test_report_tables_requests_per_operation():
    recs = [rec("oleo", {"LOOKUP": 2.0, "CREATE": 1.0, "RELEASE": 1.0, "MKDIR": 0.0002}, 4.0002),
            rec("oleo", {"LOOKUP": 2.0, "CREATE": 1.0, "RELEASE": 1.0}, 4.0),
            rec("fuse-floor", {"LOOKUP": 2.0, "CREATE": 1.0, "RELEASE": 1.0,
                               "GETATTR": 0.5}, 4.5),
            {"workload": "fsmark-create", "variant": None, "target": "btrfs", "status": "ok",
             "metrics": {"files_per_s": 2000.0}, "params": {}}]
    text = report.render(recs, {"targets": ["oleo", "fuse-floor", "btrfs"]})
    assert "FUSE requests per file created" in text
    table = text[text.index("FUSE requests per file created"):]
    head = next(line for line in table.splitlines() if line.startswith("| target"))
    assert head == "| target | LOOKUP | CREATE | RELEASE | GETATTR | others | total |"
    assert "| oleo | 2.00 | 1.00 | 1.00 | 0.00 | 0.00 | 4.00 |" in table
    assert "| fuse-floor | 2.00 | 1.00 | 1.00 | 0.50 | 0.00 | 4.50 |" in table
    assert "| btrfs |" not in table
