"""Workload sizes: one preset per scale, any field overridable with --set KEY=VALUE.

`full` is the seeds scaled to a 2-core / 24 GiB machine; `original` is the sizes the
seed patches used (for a bigger box); `quick` is a few seconds per workload, for the
test suite. Change a preset here, not in the workloads.
"""

import dataclasses
from dataclasses import dataclass, field, fields

# Seed 002's block-size mix, verbatim.
SEED_BSSPLIT = "4k/20:8k/20:16k/20:32k/10:64k/10:128k/5:256k/5:512k/5:1m/5"


@dataclass
class Params:
    reps: int = 3
    timeout_s: int = 300             # per measurement, including mkfs/mount/teardown
    # fsync-write and seq-write read their data back (fio verify_only, after sync and
    # drop_caches) and fsmark-create counts its files: no number for lost data
    verify_writes: bool = True

    # seed 000: fio 64 KiB sequential buffered writes, fsync after each write; time based
    # (steady state, as the seed), each job on a file too big to finish in that time
    fsync_jobs: list = field(default_factory=lambda: [1, 4, 16])
    fsync_runtime_s: int = 20
    fsync_job_mib: int = 8192        # per job: more than the fastest target writes in runtime

    # sequential buffered write of one file with a final fsync (dd bs=1M conv=fsync)
    seqw_file_mib: int = 4096
    seqw_max_runtime_s: int = 180    # cap, so a very slow target still finishes (fsync still runs)

    # seed 001: fs_mark -S 0 -s 0 -k, one thread per directory
    fsmark_threads: int = 2
    # fuse2fs slows down with directory size (20000 x 5 per thread took it over 30 minutes)
    fsmark_files: int = 50000        # files per thread per loop (fs_mark -n)
    fsmark_loops: int = 4            # fs_mark -L
    # fs_mark -S 1: an fsync per file, so fewer of them
    fsmark_sync_files: int = 2000
    fsmark_sync_loops: int = 3

    # unpack a source-like tree, then cp -a it (wall time, each step made durable)
    untar_files: int = 50000
    untar_dirs: int = 2500
    # renames/links/unlinks in a directory of bigdir_entries against one of 100
    bigdir_entries: int = 100000
    bigdir_runtime_s: int = 20       # per directory

    # seed 002: fio randrw, O_DIRECT, io_uring, one preallocated shared file
    uring_jobs: int = 2
    uring_file_mib: int = 1024
    uring_runtime_s: int = 20
    uring_iodepth: int = 64
    uring_bssplit: str = SEED_BSSPLIT

    # issue 14: sequential 1 MiB writes under compress=zstd, compressible and not
    compw_file_mib: int = 4096
    compw_runtime_s: int = 20
    compw_compress_percentage: int = 60

    # seed 003: dbench
    dbench_clients: list = field(default_factory=lambda: [1, 8, 32])
    dbench_runtime_s: int = 20

    # seed 004: buffered sequential fio writer in a subvolume, snapshot after a delay
    snap_delay_s: float = 5.0
    snap_file_mib: int = 8192
    snap_max_runtime_s: int = 120    # fio is killed as soon as the snapshot returns

    # readers never wait: O_DIRECT reads of one file alone, then beside fsyncing writers
    rww_file_mib: int = 1024
    rww_writers: int = 4
    rww_runtime_s: int = 20

    # read workloads, all on one prepared data set per filesystem family
    seq_file_mib: int = 1024
    rand_runtime_s: int = 8
    walk_files: int = 100000
    walk_dirs: int = 100

    # issue 31, multi-device: a 2-device btrfs (raid0 or raid1 data, raid1 metadata) the
    # kernel fills once; O_DIRECT sequential reads of one incompressible file, time based
    raid_file_mib: int = 1024
    raid_runtime_s: int = 20
    # scrub of a 2-device RAID1 holding one incompressible file of this size
    scrub_data_mib: int = 1024

    # issue 32, send/receive: one source image the kernel fills once (kept in the work dir
    # between runs, keyed by these): sr_files files in sr_dirs directories, all but
    # sr_large_files of them small (exponential sizes, mean sr_small_kib KiB), the large
    # ones sharing the rest of sr_total_mib; then a read-only snapshot
    sr_files: int = 100000
    sr_dirs: int = 1000
    sr_total_mib: int = 4096
    sr_large_files: int = 32
    sr_small_kib: int = 8
    sr_timeout_s: int = 1200         # per measurement (a 4 GiB receive is slow where it is slow)
    # which streams the receive workload applies: the kernel's send of the source and oleo's
    sr_recv_streams: str = "kernel,oleo"


PRESETS = {
    "full": {},
    "quick": dict(
        reps=1, timeout_s=300,
        fsync_jobs=[1, 4, 16], fsync_runtime_s=2, fsync_job_mib=64,
        seqw_file_mib=256, seqw_max_runtime_s=60,
        fsmark_files=500, fsmark_loops=2, fsmark_sync_files=100, fsmark_sync_loops=2,
        untar_files=2000, untar_dirs=100, bigdir_entries=2000, bigdir_runtime_s=1,
        uring_file_mib=128, uring_runtime_s=2,
        compw_file_mib=128, compw_runtime_s=2,
        dbench_clients=[1, 8, 32], dbench_runtime_s=2,
        snap_delay_s=2.0, snap_file_mib=512, snap_max_runtime_s=30,
        rww_file_mib=64, rww_runtime_s=2,
        seq_file_mib=64, rand_runtime_s=2, walk_files=2000, walk_dirs=20,
        raid_file_mib=64, raid_runtime_s=2, scrub_data_mib=128,
        sr_files=2000, sr_dirs=20, sr_total_mib=256, sr_large_files=4, sr_timeout_s=300,
    ),
    # What the seed patches ran (seed 000: 32 GiB per point on a 16 GiB box; seed 001:
    # 12 threads x 100k files x 10 loops; seed 002: 4 jobs, 8 GiB, 300 s; seed 003:
    # dbench -t 30; seed 004: 64 GiB file, 120 s). Needs a big disk and many cores.
    "original": dict(
        timeout_s=7200,
        fsync_jobs=[1, 2, 4, 8, 16, 32, 64], fsync_runtime_s=300, fsync_job_mib=32768,
        fsmark_threads=12, fsmark_files=100000, fsmark_loops=10,
        uring_jobs=4, uring_file_mib=8192, uring_runtime_s=300,
        dbench_clients=[1, 8, 16, 32, 128, 512], dbench_runtime_s=30,
        snap_file_mib=65536, snap_max_runtime_s=120,
    ),
}


def make_params(scale, overrides=()):
    """Preset for SCALE, then KEY=VALUE overrides (lists as 1,4,16)."""
    if scale not in PRESETS:
        raise ValueError(f"unknown scale {scale!r}; choose from {', '.join(PRESETS)}")
    p = dataclasses.replace(Params(), **PRESETS[scale])
    types = {f.name: f for f in fields(Params)}
    for item in overrides:
        key, sep, val = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or key not in types:
            raise ValueError(f"--set {item!r}: expected KEY=VALUE with KEY one of {', '.join(types)}")
        cur = getattr(p, key)
        try:
            if isinstance(cur, list):
                new = [int(x) for x in val.split(",") if x.strip()]
            elif isinstance(cur, bool):
                new = val.lower() in ("1", "true", "yes", "on")
            else:
                new = type(cur)(val)
        except ValueError as e:
            raise ValueError(f"--set {item!r}: {e}") from None
        setattr(p, key, new)
    return p
