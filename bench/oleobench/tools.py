"""Driving fio, fs_mark and dbench, and reading their output.

Parsers are plain functions over text so the unit tests can feed them captured
output without running anything.
"""

import json
import os
import re

from .sysutil import CmdError, run

MiB = 1 << 20


def fio_jobfile(name, opts):
    """An fio job file from a dict (True means a bare flag like `thread`). Written
    out for every run and copied into the results so each number can be re-run."""
    lines = [f"[{name}]"]
    for k, v in opts.items():
        if v is True:
            lines.append(k)
        elif v is not None and v is not False:
            lines.append(f"{k}={v}")
    return "\n".join(lines) + "\n"


def run_fio(jobtext, scratch, timeout, readonly=False):
    """Run one fio job file; return the parsed JSON report. A job that reports an
    error (EINVAL on O_DIRECT, io_uring refused, ENOSPC...) raises CmdError, which
    the runner records as N/A with fio's message."""
    job = os.path.join(scratch, "job.fio")
    out = os.path.join(scratch, "fio.json")
    with open(job, "w") as f:
        f.write(jobtext)
    argv = ["fio", "--output-format=json", f"--output={out}"] + (["--readonly"] if readonly else [])
    r = run(argv + [job], timeout=timeout, check=False, cwd=scratch)  # strays land in scratch
    try:
        with open(out) as f:
            report = parse_fio_json(f.read())
    except (OSError, ValueError):
        report = None
    if r.returncode != 0 or report is None:
        raise CmdError(r.args, r.returncode, r.stdout, r.stderr or _read(out))
    for j in report.get("jobs", []):
        if j.get("error"):
            raise CmdError(r.args, j["error"], "", f"fio job error {j['error']}: {os.strerror(j['error'])}"
                           + (f"; {r.stderr.strip()}" if r.stderr.strip() else ""))
    return report


def _read(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def parse_fio_json(text):
    """fio may print warnings before the JSON object even with --output; skip to it."""
    start = text.find("{")
    if start < 0:
        raise ValueError("no JSON in fio output")
    return json.loads(text[start:])


def fio_totals(report):
    """Aggregate bandwidth (MiB/s) and IOPS per direction over all jobs."""
    res = {}
    for d in ("read", "write"):
        bw = sum(j[d]["bw_bytes"] for j in report["jobs"])
        iops = sum(j[d]["iops"] for j in report["jobs"])
        io = sum(j[d]["io_bytes"] for j in report["jobs"])
        res[d] = {"MiB_s": bw / MiB, "iops": iops, "io_MiB": io / MiB}
    res["runtime_s"] = max(max(j["read"]["runtime"], j["write"]["runtime"]) for j in report["jobs"]) / 1000
    return res


# ---------------------------------------------------------------- fs_mark

_FSMARK_ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+(\d+)\s+([\d.]+)\s+(\d+)\s*$")


def parse_fs_mark(text):
    """Rows of fs_mark's table: FSUse% Count Size Files/sec App-Overhead.
    Returns a list of (count, files_per_s), one per loop."""
    rows = []
    for line in text.splitlines():
        m = _FSMARK_ROW.match(line)
        if m:
            rows.append((int(m.group(2)), float(m.group(4))))
    return rows


# ---------------------------------------------------------------- dbench

_DBENCH_TP = re.compile(r"Throughput\s+([\d.]+)\s+MB/sec.*?max_latency=([\d.]+)\s*ms")


def parse_dbench(text):
    """dbench's closing line: 'Throughput 123.4 MB/sec  8 clients  8 procs  max_latency=9.8 ms'."""
    m = None
    for m in _DBENCH_TP.finditer(text):
        pass
    if m is None:
        raise ValueError("no Throughput line in dbench output")
    return float(m.group(1)), float(m.group(2))


_DBENCH_OP = re.compile(r"^\s*([A-Za-z]+)\s+(\d+)\s+[\d.]+\s+[\d.]+\s*$", re.M)


def parse_dbench_ops(text):
    """The operations dbench counted (the sum of its closing Operation table: NTCreateX,
    Close, ReadX, ...), or None without the table."""
    counts = [int(m.group(2)) for m in _DBENCH_OP.finditer(text)]
    return sum(counts) if counts else None


def dbench_loadfile():
    for f in ("/usr/share/dbench/client.txt", "/usr/local/share/client.txt",
              "/usr/local/share/dbench/client.txt"):
        if os.path.exists(f):
            return f
    return None


# ---------------------------------------------------------------- scrub

_SCRUB_RAW = re.compile(r"^\s*([a-z_]+):\s*(\d+)\s*$")


def parse_scrub_raw(text):
    """The raw counters `btrfs scrub start -B -R` prints (`oleo scrub start -R` prints
    the same): {'data_bytes_scrubbed': N, ...}, summed if a counter appears per device."""
    out = {}
    for line in text.splitlines():
        m = _SCRUB_RAW.match(line)
        if m:
            out[m.group(1)] = out.get(m.group(1), 0) + int(m.group(2))
    if "data_bytes_scrubbed" not in out:
        raise ValueError("no data_bytes_scrubbed counter in the scrub's output")
    return out
