//! ENOSPC reaches the writer through a FUSE mount: write(2) fails once data cannot fit,
//! a file's size is exactly what write(2) accepted, and nothing accepted is lost. Checked
//! after unmount by `btrfs check` and the kernel's view of the image.

use oleo_testkit::*;
use std::io::{ErrorKind, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{Duration, Instant};

const OLEO: &str = env!("CARGO_BIN_EXE_oleo");
const MIB: usize = 1 << 20;

/// One MiB of data that names its index, so misplaced or lost chunks show.
fn chunk(i: usize) -> Vec<u8> {
    let mut v = vec![0u8; MIB];
    for (j, b) in v.iter_mut().enumerate() {
        *b = ((i * 131 + j * 7) % 251) as u8;
    }
    v
}

/// Appends MiB chunks (each write(2) a whole chunk) until write(2) fails; returns the bytes
/// write(2) accepted and the error. Fails the test if the filesystem never fills.
fn fill(path: &Path, limit: usize) -> (u64, std::io::Error) {
    let mut f = std::fs::File::create(path).unwrap();
    let mut written = 0u64;
    let until = Instant::now() + Duration::from_secs(300);
    for i in 0..limit {
        assert!(Instant::now() < until, "{}: still writing", path.display());
        let data = chunk(i);
        let mut at = 0;
        while at < data.len() {
            match f.write(&data[at..]) {
                Ok(n) => {
                    at += n;
                    written += n as u64;
                }
                Err(e) => {
                    // Everything write(2) accepted is in the kernel's cache or on disk: the
                    // close must not report a loss.
                    f.sync_all()
                        .unwrap_or_else(|e| panic!("{}: fsync after ENOSPC: {e}", path.display()));
                    return (written, e);
                }
            }
        }
    }
    panic!(
        "{}: {limit} MiB written to a smaller filesystem without an error",
        path.display()
    );
}

fn check_contents(path: &Path, len: u64) {
    let f = std::fs::File::open(path).unwrap();
    assert_eq!(f.metadata().unwrap().len(), len, "{}", path.display());
    let mut buf = vec![0u8; MIB];
    let mut at = 0u64;
    while at < len {
        let n = ((len - at) as usize).min(MIB);
        f.read_exact_at(&mut buf[..n], at).unwrap();
        let want = chunk((at / MIB as u64) as usize);
        assert!(
            buf[..n] == want[..n],
            "{}: MiB {} differs",
            path.display(),
            at / MIB as u64
        );
        at += n as u64;
    }
}

#[test]
fn writes_to_a_full_filesystem_fail_in_write_and_lose_nothing() {
    let name = "enospc_dd";
    if !(require_root(name) && require_fuse(name)) {
        return;
    }
    let dir = TempDir::new(name).unwrap();
    let image = dir.join("image");
    let mnt = dir.subdir("mnt").unwrap();
    let kmnt = dir.subdir("kmnt").unwrap();
    empty_image(&image, 1024, &[]).unwrap();

    let m = OleoMount::mount_rw(Path::new(OLEO), &image, &mnt, &[]).unwrap();
    // A file opened while space is plentiful writes through the page cache: it must still
    // stop with ENOSPC in write(2), not run on (the kernel would accept writes for ever).
    let (first, e) = fill(&mnt.join("fill"), 4096);
    assert_eq!(e.kind(), ErrorKind::StorageFull, "fill: {e}");
    assert!(first > 256 << 20, "stopped early: {first} bytes");
    check_contents(&mnt.join("fill"), first);
    // A file opened near full writes to the last block and stops exactly there.
    let (second, e) = fill(&mnt.join("fill2"), 4096);
    assert_eq!(e.kind(), ErrorKind::StorageFull, "fill2: {e}");
    check_contents(&mnt.join("fill2"), second);
    let free = nix_statvfs_avail(&mnt);
    assert!(
        free < 8 << 20,
        "{free} bytes left free after the second file"
    );
    // A small write on a full filesystem either lands or fails: never a silent empty file.
    let small = mnt.join("small");
    let r = std::fs::write(&small, b"small\n");
    let small_len = match &r {
        Ok(()) => 6,
        Err(e) => {
            assert_eq!(e.kind(), ErrorKind::StorageFull, "small: {e}");
            std::fs::metadata(&small).map_or(0, |m| m.len())
        }
    };
    assert_eq!(std::fs::metadata(&small).map_or(0, |m| m.len()), small_len);
    m.unmount().unwrap();

    btrfs_check(&image, true).unwrap();
    let k = KernelMount::mount(&image, &kmnt, &["ro"]).unwrap();
    check_contents(&kmnt.join("fill"), first);
    check_contents(&kmnt.join("fill2"), second);
    if small_len > 0 {
        assert_eq!(std::fs::read(kmnt.join("small")).unwrap(), b"small\n");
    }
    k.unmount().unwrap();
}

fn nix_statvfs_avail(path: &Path) -> u64 {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a zeroed statvfs is a valid out-parameter.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: c is a valid C string, st a valid out-pointer.
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut st) }, 0);
    st.f_bavail * st.f_frsize
}

/// The mount's kernel dirty limit (its bdi's max_bytes), from mountinfo.
fn bdi_max_bytes(mnt: &Path) -> u64 {
    let info = mount_at(mnt).expect("mounted");
    let knob = format!("/sys/class/bdi/{}:{}/max_bytes", info.dev.0, info.dev.1);
    std::fs::read_to_string(&knob)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

#[test]
fn a_small_filesystem_caps_the_kernels_dirty_data_and_still_stops_in_write() {
    let name = "enospc_small";
    if !(require_root(name) && require_fuse(name)) {
        return;
    }
    let dir = TempDir::new(name).unwrap();
    let image = dir.join("image");
    empty_image(&image, 256, &[]).unwrap();
    let mnt = dir.subdir("mnt").unwrap();
    let m = OleoMount::mount_rw(Path::new(OLEO), &image, &mnt, &[]).unwrap();
    // A sixty-fourth of the filesystem, at least 8 MiB, so that writes stay cached until it
    // is nearly full (the kernel keeps it as a fraction: it reads back a little off).
    let cap = bdi_max_bytes(&mnt);
    assert!(cap.abs_diff(8 << 20) < (8 << 20) / 100, "max_bytes {cap}");
    let (written, e) = fill(&mnt.join("fill"), 4096);
    assert_eq!(e.kind(), ErrorKind::StorageFull, "fill: {e}");
    check_contents(&mnt.join("fill"), written);
    let (more, e) = fill(&mnt.join("fill2"), 4096);
    assert_eq!(e.kind(), ErrorKind::StorageFull, "fill2: {e}");
    m.unmount().unwrap();
    btrfs_check(&image, true).unwrap();
    let kmnt = dir.subdir("kmnt").unwrap();
    let k = KernelMount::mount(&image, &kmnt, &["ro"]).unwrap();
    check_contents(&kmnt.join("fill"), written);
    check_contents(&kmnt.join("fill2"), more);
    k.unmount().unwrap();
}

/// fstests generic/102's shape: 800 MiB written to a fresh 1 GiB filesystem, where kernel
/// btrfs has room for it (about 900 MiB of data space). The writer syncs each MiB, so the
/// kernel holds almost nothing dirty when free space nears the margin the server keeps for
/// cached writers. With the dirty cap at a sixteenth (64 MiB, a 144 MiB margin) that margin
/// was crossed before the last write(2), which failed with ENOSPC at 793 MiB while 110 MiB
/// were free (a CI failure of generic/102, there by write-back keeping pace with the writer).
#[test]
fn a_writer_that_syncs_as_it_goes_fills_a_small_filesystem_as_kernel_btrfs_does() {
    let name = "enospc_synced_fill";
    if !(require_root(name) && require_fuse(name)) {
        return;
    }
    let dir = TempDir::new(name).unwrap();
    let image = dir.join("image");
    empty_image(&image, 1024, &[]).unwrap();
    let mnt = dir.subdir("mnt").unwrap();
    let m = OleoMount::mount_rw(Path::new(OLEO), &image, &mnt, &[]).unwrap();
    let path = mnt.join("file");
    for round in 0..2 {
        let mut f = std::fs::File::create(&path).unwrap();
        for i in 0..800 {
            f.write_all(&chunk(i))
                .unwrap_or_else(|e| panic!("round {round}: write of MiB {i}: {e}"));
            f.sync_data()
                .unwrap_or_else(|e| panic!("round {round}: fdatasync after MiB {i}: {e}"));
        }
        drop(f);
        check_contents(&path, 800 << 20);
        if round == 0 {
            // The space comes back for the next round (generic/102 loops ten times).
            std::fs::remove_file(&path).unwrap();
        }
    }
    m.unmount().unwrap();
    btrfs_check(&image, true).unwrap();
    let kmnt = dir.subdir("kmnt").unwrap();
    let k = KernelMount::mount(&image, &kmnt, &["ro"]).unwrap();
    check_contents(&kmnt.join("file"), 800 << 20);
    k.unmount().unwrap();
}

/// Seed 001's ENOSPC rule through the mount: empty files from many threads (their directory
/// index and inode items queued in oleo) until the metadata runs out. Every create that
/// succeeded is there after unmount, through the kernel, and nothing else is.
#[test]
fn empty_files_from_many_threads_fill_and_lose_nothing() {
    let name = "enospc_empty_files";
    if !(require_root(name) && require_fuse(name)) {
        return;
    }
    let dir = TempDir::new(name).unwrap();
    let image = dir.join("image");
    let mnt = dir.subdir("mnt").unwrap();
    let kmnt = dir.subdir("kmnt").unwrap();
    empty_image(&image, 128, &["--nodesize", "4096", "-m", "single"]).unwrap();
    let m = OleoMount::mount_rw(Path::new(OLEO), &image, &mnt, &[]).unwrap();
    // Data takes half the device first, so that the metadata fills sooner.
    let ballast = std::fs::File::create(mnt.join("ballast")).unwrap();
    for i in 0..56 {
        ballast.write_all_at(&chunk(i), (i * MIB) as u64).unwrap();
    }
    ballast.sync_all().unwrap();
    drop(ballast);
    let until = Instant::now() + Duration::from_secs(600);
    let mut made: Vec<String> = std::thread::scope(|sc| {
        let handles: Vec<_> = (0..6)
            .map(|t| {
                let (mnt, m) = (&mnt, &m);
                sc.spawn(move || {
                    let d = mnt.join(format!("d{t}"));
                    std::fs::create_dir(&d).unwrap();
                    let mut mine = Vec::new();
                    for i in 0.. {
                        assert!(Instant::now() < until, "thread {t}: never filled up");
                        let rel = format!("d{t}/f{i:07}");
                        match std::fs::File::create(mnt.join(&rel)) {
                            Ok(_) => mine.push(rel),
                            Err(e) => {
                                assert_eq!(
                                    e.kind(),
                                    ErrorKind::StorageFull,
                                    "{rel}: {e}\n{}",
                                    m.log_text()
                                );
                                return mine;
                            }
                        }
                    }
                    unreachable!()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    made.sort();
    assert!(made.len() > 5_000, "filled up after {} files", made.len());
    m.unmount().unwrap();

    btrfs_check(&image, false).unwrap();
    let k = KernelMount::mount(&image, &kmnt, &["ro"]).unwrap();
    let mut seen = Vec::new();
    for t in 0..6 {
        for e in std::fs::read_dir(kmnt.join(format!("d{t}"))).unwrap() {
            let e = e.unwrap();
            seen.push(format!("d{t}/{}", e.file_name().to_string_lossy()));
        }
    }
    k.unmount().unwrap();
    seen.sort();
    assert_eq!(
        seen.len(),
        made.len(),
        "the kernel sees another number of files"
    );
    assert!(
        seen == made,
        "the kernel sees other names than the creates that succeeded"
    );
}

/// An O_DIRECT writer filling the disk with asynchronous writes (libaio, as fstests
/// generic/299's fio jobs) leaves room for the dirty pages of a buffered writer opened
/// earlier: they reach the disk at its fsync, and nothing write(2) took from it is lost.
/// O_DIRECT writes come to oleo as they are made, not as the page cache's write-back, so
/// they keep the cached writers' margin free; and each ends whole or with ENOSPC, never
/// short (the kernel turns a short asynchronous direct write into EIO).
#[test]
fn an_o_direct_filler_leaves_room_for_buffered_dirty_pages() {
    use std::os::unix::fs::OpenOptionsExt;
    let name = "enospc_o_direct";
    if !(require_root(name) && require_fuse(name)) {
        return;
    }
    let dir = TempDir::new(name).unwrap();
    let image = dir.join("image");
    empty_image(&image, 512, &[]).unwrap();
    let mnt = dir.subdir("mnt").unwrap();
    let m = OleoMount::mount_rw(Path::new(OLEO), &image, &mnt, &[]).unwrap();
    // The buffered writer: 8 MiB dirty in the kernel's page cache, not yet written back.
    let mut buffered = std::fs::File::create(mnt.join("buffered")).unwrap();
    for i in 0..8 {
        buffered.write_all(&chunk(i)).unwrap();
    }
    // The O_DIRECT writer fills the rest with asynchronous writes of 768 KiB (not a divisor
    // of the free space, so that one would end past the space left) into a file
    // preallocated past the free space (no write extends it: the kernel keeps such writes
    // asynchronous), until one fails.
    const PIECE: usize = 768 << 10;
    let direct = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_DIRECT)
        .open(mnt.join("direct"))
        .unwrap();
    direct.set_len(1 << 30).unwrap();
    let layout = std::alloc::Layout::from_size_align(PIECE, 4096).unwrap();
    // SAFETY: a non-zero size; freed below with the same layout.
    let buf = unsafe { std::alloc::alloc(layout) };
    assert!(!buf.is_null());
    // SAFETY: buf holds PIECE bytes, aligned for O_DIRECT.
    let aligned = unsafe { std::slice::from_raw_parts_mut(buf, PIECE) };
    let aio = oleo_testkit::aio::Aio::new(4).unwrap();
    let mut pieces = 0usize;
    let res = loop {
        aligned.copy_from_slice(&chunk(pieces)[..PIECE]);
        match aio.write(&direct, aligned, (pieces * PIECE) as u64) {
            r if r == PIECE as i64 => pieces += 1,
            r => break r,
        }
        assert!(pieces * PIECE < 1 << 30, "1 GiB into a 512 MiB filesystem");
    };
    drop(aio);
    // SAFETY: allocated above with this layout.
    unsafe { std::alloc::dealloc(buf, layout) };
    assert_eq!(
        res,
        -i64::from(libc::ENOSPC),
        "the asynchronous direct write after {pieces} pieces of {PIECE} bytes"
    );
    assert!(pieces * PIECE > 128 << 20, "stopped early: {pieces} pieces");
    // The buffered writer's pages reach the disk.
    buffered
        .sync_all()
        .expect("the buffered writer's dirty pages were refused at write-back");
    drop(buffered);
    drop(direct);
    check_contents(&mnt.join("buffered"), 8 * MIB as u64);
    m.unmount().unwrap();
    btrfs_check(&image, true).unwrap();
    let kmnt = dir.subdir("kmnt").unwrap();
    let k = KernelMount::mount(&image, &kmnt, &["ro"]).unwrap();
    check_contents(&kmnt.join("buffered"), 8 * MIB as u64);
    let f = std::fs::File::open(kmnt.join("direct")).unwrap();
    let mut got = vec![0u8; PIECE];
    for i in 0..pieces {
        f.read_exact_at(&mut got, (i * PIECE) as u64).unwrap();
        assert!(got == chunk(i)[..PIECE], "direct: piece {i} differs");
    }
    drop(f);
    k.unmount().unwrap();
}
