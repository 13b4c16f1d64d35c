//! The transport's request counters (`oleo_fuse::transport::counts`) against what the kernel
//! must send: N files made with open(O_CREAT), a 4 KiB write and close, and the counts
//! read through `oleo mount-stats` before and after must show at least N LOOKUPs (the
//! kernel looks a new name up before it creates it), N CREATEs, N WRITEs (the writeback
//! cache writes a closed file's pages out at its close) and N RELEASEs, and nothing that
//! went down. The FUSE_STATS ioctl that answers them is root's only: a user gets EPERM.
//! FUSE_STATS_TIME, the server's time per opcode, grows by the CREATEs' time: more than
//! nothing, less than a second each; `oleo mount-stats` prints its mean per request.
//! Over /dev/fuse and over io_uring. A direct write drops its range from the kernel's
//! page cache only where the kernel may hold pages: no GETATTR follows the writes to a file
//! nothing read through the cache. A snapshot under a writer makes the daemon hold the
//! writer's pages through whole writeback WRITEs, not one dropped folio at a time.
//!
//! Needs root and FUSE (io_uring: Linux 6.14+): a skip elsewhere, a failure under CI=true.

use oleo_fuse::subvol_ioctl as cmd;
use oleo_fuse::transport::counts;
use oleo_testkit::syscalls::as_user;
use oleo_testkit::*;
use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

const OLEO: &str = env!("CARGO_BIN_EXE_oleo");
const FILES: u64 = 200;

/// `oleo mount-stats --oneline MNT`: the counts by opcode name.
fn counts_of(mnt: &Path) -> BTreeMap<String, u64> {
    let out = Command::new(OLEO)
        .args(["mount-stats", "--oneline"])
        .arg(mnt)
        .output()
        .unwrap();
    assert!(out.status.success(), "oleo mount-stats: {out:?}");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or_else(|| panic!("{kv:?}"));
            (k.to_string(), v.parse().unwrap())
        })
        .collect()
}

/// `ioctl` (FUSE_STATS or FUSE_STATS_TIME) on `mnt` by the calling thread: the slots, or
/// the errno.
fn slots_ioctl(mnt: &Path, ioctl: u32) -> Result<[u64; counts::SLOTS], i32> {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(mnt).map_err(|e| e.raw_os_error().unwrap_or(-1))?;
    let mut b = vec![0u8; cmd::FUSE_STATS_SIZE];
    // SAFETY: the ioctl writes FUSE_STATS_SIZE bytes (its encoded size) into `b`.
    let r = unsafe { libc::ioctl(f.as_raw_fd(), ioctl as _, b.as_mut_ptr()) };
    if r == 0 {
        Ok(counts::parse(&b))
    } else {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(-1))
    }
}

/// FUSE_STATS_TIME on `mnt`: nanoseconds by slot, or the errno.
fn nanos_of(mnt: &Path) -> Result<[u64; counts::SLOTS], i32> {
    slots_ioctl(mnt, cmd::FUSE_STATS_TIME)
}

/// FUSE_STATS on `mnt` by the calling thread: the errno, 0 for success.
fn stats_ioctl(mnt: &Path) -> i32 {
    match slots_ioctl(mnt, cmd::FUSE_STATS) {
        Ok(c) => {
            assert!(c.iter().sum::<u64>() > 0, "no request counted");
            0
        }
        Err(e) => e,
    }
}

fn run(name: &str, transport: &str) {
    if !require_fuse_mount(name) {
        return;
    }
    if transport == "fuse_uring=on" {
        let param = Path::new("/sys/module/fuse/parameters/enable_uring");
        let on = std::fs::read_to_string(param).is_ok_and(|v| v.trim() == "Y")
            || std::fs::write(param, "Y").is_ok();
        if !on {
            let why = format!("{name}: skipped: this kernel has no FUSE over io_uring (6.14+)");
            assert!(std::env::var("CI").as_deref() != Ok("true"), "{why}");
            eprintln!("{why}");
            return;
        }
    }
    let dir = TempDir::new(name).unwrap();
    oleo_testkit::tempdir::open_to_others(dir.path());
    let img = dir.join("oleo.img");
    empty_image(&img, 256, &[]).unwrap();
    let mnt = dir.subdir("mnt").unwrap();
    let m = OleoMount::mount_rw(Path::new(OLEO), &img, &mnt, &[transport]).unwrap();
    let rings = m
        .server_threads()
        .iter()
        .filter(|t| t.starts_with("oleo-uring"))
        .count();
    assert_eq!(
        rings > 0,
        transport == "fuse_uring=on",
        "{transport}: {rings} ring threads"
    );
    let work = m.path().join("d");
    std::fs::create_dir(&work).unwrap();

    let before = counts_of(m.path());
    let nanos_before = nanos_of(m.path()).unwrap();
    let page = vec![0x5au8; 4096];
    for i in 0..FILES {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o644)
            .open(work.join(format!("f{i}")))
            .unwrap();
        f.write_all(&page).unwrap();
    }
    // RELEASE goes out in the background after close: wait for it.
    let delta = |after: &BTreeMap<String, u64>, op: &str| {
        after.get(op).copied().unwrap_or(0) - before.get(op).copied().unwrap_or(0)
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    let after = loop {
        let after = counts_of(m.path());
        if delta(&after, "RELEASE") >= FILES || Instant::now() > deadline {
            break after;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    for (op, n) in &before {
        assert!(after.get(op).copied().unwrap_or(0) >= *n, "{op} went down");
    }
    for op in ["LOOKUP", "CREATE", "WRITE", "RELEASE"] {
        assert!(
            delta(&after, op) >= FILES,
            "{transport}: {} {op} for {FILES} files created and written ({before:?} -> {after:?})",
            delta(&after, op)
        );
    }
    // Not more than the kernel needs either: one CREATE per file.
    assert_eq!(delta(&after, "CREATE"), FILES, "{after:?}");

    // The server's time on them: each CREATE took something, and less than a second.
    let create = 35;
    let spent = nanos_of(m.path()).unwrap()[create] - nanos_before[create];
    assert!(
        (FILES * 100..FILES * 1_000_000_000).contains(&spent),
        "{transport}: {spent} ns for {FILES} CREATEs"
    );
    assert_eq!(
        as_user(|| nanos_of(m.path()).err().unwrap_or(0)),
        libc::EPERM,
        "a user's FUSE_STATS_TIME"
    );
    let table = Command::new(OLEO)
        .arg("mount-stats")
        .arg(m.path())
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&table.stdout);
    let row = table
        .lines()
        .find(|l| l.starts_with("CREATE "))
        .unwrap_or_else(|| panic!("no CREATE row in {table}"));
    let mean: f64 = row.split_whitespace().nth(2).unwrap().parse().unwrap();
    assert!(mean > 0.0, "{row}");

    // Root only, as the other ioctls that read the server's state.
    assert_eq!(stats_ioctl(m.path()), 0);
    assert_eq!(
        as_user(|| stats_ioctl(m.path())),
        libc::EPERM,
        "a user's FUSE_STATS"
    );
    m.unmount().unwrap();
}

#[test]
fn requests_are_counted_over_dev_fuse() {
    run("fuse_requests_devfuse", "fuse_uring=off");
}

#[test]
fn requests_are_counted_over_io_uring() {
    run("fuse_requests_uring", "fuse_uring=on");
}

/// A fresh 256 MiB image mounted read-write: (its folder, the image, the mount).
fn fresh_mount(name: &str) -> (TempDir, std::path::PathBuf, OleoMount) {
    let dir = TempDir::new(name).unwrap();
    let img = dir.join("oleo.img");
    empty_image(&img, 256, &[]).unwrap();
    let mnt = dir.subdir("mnt").unwrap();
    let m = OleoMount::mount_rw(Path::new(OLEO), &img, &mnt, &[]).unwrap();
    (dir, img, m)
}

/// `p` opened O_DIRECT for reading and writing (made if missing).
fn open_direct(p: &Path) -> std::fs::File {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .custom_flags(libc::O_DIRECT)
        .open(p)
        .unwrap()
}

/// Requests of opcode `op` between two `counts_of`.
fn delta(before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>, op: &str) -> u64 {
    after.get(op).copied().unwrap_or(0) - before.get(op).copied().unwrap_or(0)
}

/// An asynchronous O_DIRECT write's page drop (NOTIFY_INVAL_INODE, docs/fuse-limits.md) is
/// made only where the kernel may hold pages: writes to a file nothing read or wrote back
/// through the cache cost none, seen as no GETATTR (a drop takes the attributes along and
/// the kernel asks for them again at the next write: one per write before). That a file
/// a buffered reader caches still gets its drops is `fuse_promises::
/// buffered_read_after_async_direct_write` (readers racing the writes: stale at once
/// without them).
#[test]
fn direct_writes_drop_pages_only_where_the_kernel_may_hold_them() {
    let name = "fuse_requests_direct_drops";
    if !require_fuse_mount(name) {
        return;
    }
    let (_dir, _img, m) = fresh_mount(name);
    let f = open_direct(&m.path().join("direct"));
    const LEN: usize = 8192;
    let mut raw = vec![0u8; LEN + 4096];
    let at = raw.as_ptr().align_offset(4096);
    let buf = &mut raw[at..at + LEN];
    let aio = oleo_testkit::aio::Aio::new(4).unwrap();
    assert_eq!(aio.write(&f, buf, 0), LEN as i64);
    let before = counts_of(m.path());
    const N: u64 = 64;
    for i in 0..N {
        buf.fill(i as u8);
        assert_eq!(aio.write(&f, buf, (i % 4) * LEN as u64), LEN as i64);
    }
    let after = counts_of(m.path());
    let delta = |op: &str| delta(&before, &after, op);
    assert!(delta("WRITE") >= N, "{before:?} -> {after:?}");
    assert!(
        delta("GETATTR") < N / 4,
        "{} GETATTRs for {N} direct writes to a file never cached: its pages were dropped",
        delta("GETATTR")
    );

    drop(aio);
    drop(f);
    m.unmount().unwrap();
}

/// seed 002's shape: a file laid out through the page cache (fio writes it with write(2),
/// then drops its pages), then O_DIRECT reads and asynchronous O_DIRECT writes mixed. The
/// kernel's direct reads never fill its cache (they carry a lock owner, its page-cache
/// reads never do), and once a drop of the whole file finished with nothing filling the
/// cache since, the file is known to hold no pages: its writes cost no more drops, seen as
/// no GETATTR each (before: a drop, and with it a GETATTR, for every write). A buffered
/// read after that marks the file again: the next direct write drops what it cached, so a
/// buffered read after it sees the new bytes.
#[test]
fn direct_reads_and_writes_of_a_file_laid_out_through_the_cache_stop_its_drops() {
    use std::os::unix::fs::FileExt;
    let name = "fuse_requests_mixed_direct";
    if !require_fuse_mount(name) {
        return;
    }
    let (dir, img, m) = fresh_mount(name);
    let p = m.path().join("laid-out");
    const LEN: usize = 8192;
    const SPAN: usize = 16 * LEN;
    {
        let mut f = std::fs::File::create(&p).unwrap();
        f.write_all(&vec![0x11; SPAN]).unwrap();
        f.sync_all().unwrap();
        // SAFETY: fadvise on an open descriptor.
        let r = unsafe {
            libc::posix_fadvise(
                std::os::fd::AsRawFd::as_raw_fd(&f),
                0,
                0,
                libc::POSIX_FADV_DONTNEED,
            )
        };
        assert_eq!(r, 0);
    }
    let f = open_direct(&p);
    let mut raw = vec![0u8; LEN + 4096];
    let at = raw.as_ptr().align_offset(4096);
    let buf = &mut raw[at..at + LEN];
    let aio = oleo_testkit::aio::Aio::new(4).unwrap();
    let before = counts_of(m.path());
    const N: u64 = 64;
    for i in 0..N {
        let off = (i % (SPAN / LEN) as u64) * LEN as u64;
        assert_eq!(
            f.read_at(buf, (off + LEN as u64) % SPAN as u64).unwrap(),
            LEN
        );
        buf.fill(i as u8);
        assert_eq!(aio.write(&f, buf, off), LEN as i64);
    }
    let after = counts_of(m.path());
    let delta = |op: &str| delta(&before, &after, op);
    assert!(
        delta("WRITE") >= N && delta("READ") >= N,
        "{before:?} -> {after:?}"
    );
    assert!(
        delta("GETATTR") < N / 8,
        "{} GETATTRs for {N} direct writes mixed with direct reads: pages dropped for each",
        delta("GETATTR")
    );
    // A buffered reader caches the file again; the direct write after must drop its pages.
    let cached = std::fs::read(&p).unwrap();
    assert_eq!(cached.len(), SPAN);
    buf.fill(0xee);
    assert_eq!(aio.write(&f, buf, 0), LEN as i64);
    let again = std::fs::read(&p).unwrap();
    assert_eq!(
        &again[..LEN],
        &buf[..],
        "a buffered read after the direct write is stale"
    );
    assert_eq!(&again[LEN..], &cached[LEN..]);

    drop(aio);
    drop(f);
    m.unmount().unwrap();
    let m = OleoMount::mount_rw(Path::new(OLEO), &img, &dir.join("mnt"), &[]).unwrap();
    assert_eq!(std::fs::read(m.path().join("laid-out")).unwrap(), again);
    m.unmount().unwrap();
}

/// `oleo subvolume snapshot` first makes the daemon hold what the kernel's page cache
/// holds for files open under the source: a file being written goes out in its
/// writeback's whole WRITEs (up to 1 MiB each). Opened for reading, under relatime, the
/// server would tell the kernel to drop the file's pages so that the next read reaches it,
/// and the kernel writes a dropped dirty page back on its own, one 4 KiB WRITE each: 8 s
/// instead of 0.06 s for seed 004's sequential writer (bench snapshot-under-write).
#[test]
fn a_snapshot_pushes_a_file_being_written_in_whole_writes() {
    let name = "fuse_requests_snapshot_push";
    if !require_fuse_mount(name) {
        return;
    }
    let dir = TempDir::new(name).unwrap();
    let img = dir.join("oleo.img");
    empty_image(&img, 512, &[]).unwrap();
    let mnt = dir.subdir("mnt").unwrap();
    let m = OleoMount::mount_rw(Path::new(OLEO), &img, &mnt, &[]).unwrap();
    let oleo = |args: &[&str]| {
        let out = Command::new(OLEO).args(args).output().unwrap();
        assert!(out.status.success(), "oleo {args:?}: {out:?}");
    };
    let sub = m.path().join("sub");
    oleo(&["subvolume", "create", sub.to_str().unwrap()]);
    // A writer that goes on through the snapshot, as seed 004's: 4 KiB buffered writes
    // over the first 64 MiB of its file, again and again, never synced.
    const SPAN: u64 = 64 << 20;
    const ALLOCATED: u64 = 256 << 20;
    let page: Vec<u8> = (0..4096).map(|i| (i % 251) as u8).collect();
    let stop = std::sync::atomic::AtomicBool::new(false);
    let written = std::sync::atomic::AtomicU64::new(0);
    let path = sub.join("f");
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    // Laid out as fio lays out its file: allocated first, then written (each writeback
    // WRITE then fills preallocated space, the slower path that made the drop cost 8 s).
    assert_eq!(
        unsafe { libc::fallocate(std::os::fd::AsRawFd::as_raw_fd(&f), 0, 0, ALLOCATED as i64) },
        0
    );
    for _ in 0..SPAN / 4096 {
        f.write_all(&page).unwrap();
    }
    let (before, after) = std::thread::scope(|scope| {
        scope.spawn(|| {
            use std::os::unix::fs::FileExt;
            let mut at = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                f.write_all_at(&page, at).unwrap();
                at = (at + 4096) % SPAN;
                written.fetch_add(4096, std::sync::atomic::Ordering::Relaxed);
            }
        });
        std::thread::sleep(Duration::from_millis(300));
        let before = counts_of(m.path());
        let w0 = written.load(std::sync::atomic::Ordering::Relaxed);
        let snap = m.path().join("snap");
        oleo(&[
            "subvolume",
            "snapshot",
            "-r",
            sub.to_str().unwrap(),
            snap.to_str().unwrap(),
        ]);
        let after = counts_of(m.path());
        let w1 = written.load(std::sync::atomic::Ordering::Relaxed);
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        (before, (after, w1 - w0))
    });
    let (after, bytes) = after;
    let writes = delta(&before, &after, "WRITE");
    // A close pushes the pages; an fsync would push them too, and then write a log tree
    // and flush the device ahead of the snapshot's own commit.
    assert_eq!(
        delta(&before, &after, "FSYNC"),
        0,
        "the snapshot fsynced the files it pushed"
    );
    // Whole WRITEs of the writer's writeback carry hundreds of KiB each; pages dropped
    // from the cache go one folio at a time (1,017 WRITEs where this takes 66).
    assert!(
        writes <= (bytes + SPAN) / (512 << 10),
        "{writes} WRITEs while {bytes} bytes were written: pages written back piecemeal"
    );
    // The snapshot is whole: every page the writer wrote, then the allocated tail.
    let got = std::fs::read(m.path().join("snap").join("f")).unwrap();
    assert_eq!(got.len() as u64, ALLOCATED);
    let (head, tail) = got.split_at(SPAN as usize);
    assert!(head.chunks(4096).all(|c| c == page.as_slice()));
    assert!(tail.iter().all(|&b| b == 0));
    drop(f);
    m.unmount().unwrap();
}
