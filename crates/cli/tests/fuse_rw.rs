//! Read-write FUSE mounts against a reference directory. Seeded random sequences of POSIX
//! operations (create, mknod, mkdir, symlink, link, unlink, rmdir, rename with flags,
//! write, truncate, fallocate, chmod, chown, utimens, xattrs) run as plain syscalls on an
//! oleo mount and on a host directory; each must give the same result or errno. The trees
//! are compared through the mount during the run; after unmounting (which waits for the
//! final commit) `btrfs check --readonly --check-data-csum` must be clean and the kernel
//! must mount the image and show the reference tree; then the kernel writes, and oleo
//! must read that back.
//!
//! `OLEO_TEST_SEED` replays a seed; `OLEO_TEST_SEEDS=N` runs N seeds per case.

use oleo_testkit::ops::{
    apply_path, compare_trees, copy_xattr, random_op, seeds, walk, xattrs_of, Op, Rng,
};

/// No space left on device (errno).
const ENOSPC: i32 = 28;
use oleo_testkit::*;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::process::Command;

const OLEO: &str = env!("CARGO_BIN_EXE_oleo");

enum Start {
    /// mkfs.btrfs with these arguments, empty.
    Empty(&'static [&'static str]),
    /// An image the kernel filled first (testkit's populate).
    KernelFilled,
    /// The same, then every file rewritten compressed by the kernel (`btrfs filesystem
    /// defragment -r -c<algorithm>`).
    KernelCompressed(&'static str),
}

/// Which FUSE transport a case runs on: whatever the machine offers, or one of the two.
#[derive(Clone, Copy, PartialEq)]
enum Transport {
    Default,
    DevFuse,
    IoUring,
}

impl Transport {
    fn options(self) -> &'static [&'static str] {
        match self {
            Transport::Default => &[],
            Transport::DevFuse => &["fuse_uring=off"],
            Transport::IoUring => &["fuse_uring=on"],
        }
    }

    /// Whether the server serves over io_uring, from its threads' names.
    fn check(self, m: &OleoMount) {
        let rings = m
            .server_threads()
            .iter()
            .filter(|t| t.starts_with("oleo-uring"))
            .count();
        match self {
            Transport::Default => {}
            Transport::DevFuse => assert_eq!(rings, 0, "fuse_uring=off still serves over io_uring"),
            Transport::IoUring => {
                assert!(rings > 0, "no io_uring queue threads:\n{}", m.log_text())
            }
        }
    }
}

/// Turns on the fuse module's io_uring transport (root only); false where the kernel
/// has none. A skip under CI=true fails.
fn enable_fuse_uring(name: &str) -> bool {
    let param = Path::new("/sys/module/fuse/parameters/enable_uring");
    let on = std::fs::read_to_string(param).is_ok_and(|v| v.trim() == "Y")
        || std::fs::write(param, "Y").is_ok();
    if !on {
        let why = format!("{name}: skipped: this kernel has no FUSE over io_uring (6.14+)");
        assert!(std::env::var("CI").as_deref() != Ok("true"), "{why}");
        eprintln!("{why}");
    }
    on
}

fn run_case(name: &str, start: Start, ops: usize, big: bool) {
    run_case_on(name, start, ops, big, Transport::Default)
}

fn run_case_on(name: &str, start: Start, ops: usize, big: bool, transport: Transport) {
    run_case_with(name, start, ops, big, transport, &[])
}

/// `run_case_on` with more mount options for oleo.
fn run_case_with(
    name: &str,
    start: Start,
    ops: usize,
    big: bool,
    transport: Transport,
    options: &[&str],
) {
    if !(require_root(name) && require_fuse(name)) {
        return;
    }
    if transport == Transport::IoUring && !enable_fuse_uring(name) {
        return;
    }
    for seed in seeds(name, 1) {
        eprintln!("{name}: seed {seed}");
        let dir = TempDir::new(&format!("fuse-rw-{name}")).unwrap();
        let image = dir.join("image");
        let reference = dir.subdir("ref").unwrap();
        let mnt = dir.subdir("mnt").unwrap();
        let kmnt = dir.subdir("kmnt").unwrap();
        match start {
            Start::Empty(args) => {
                std::fs::File::create(&image)
                    .unwrap()
                    .set_len(2 << 30)
                    .unwrap();
                let out = Command::new("mkfs.btrfs")
                    .arg("-q")
                    .arg("-f")
                    .args(args)
                    .arg(&image)
                    .output()
                    .unwrap();
                assert!(
                    out.status.success(),
                    "mkfs.btrfs: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            Start::KernelFilled | Start::KernelCompressed(_) => {
                let spec = ImageSpec::new(name, seed)
                    .size_mb(2048)
                    .populate(PopulateSpec::basic());
                build_image(&spec, &image).expect("build image");
                // The reference starts as a copy of what the kernel wrote. xattrs larger than
                // the host filesystem holds are dropped on the image too (through the kernel).
                let k = KernelMount::mount(&image, &kmnt, &["rw"]).expect("kernel mount");
                let st = Command::new("cp")
                    .arg("-a")
                    .arg(format!("{}/.", kmnt.display()))
                    .arg(&reference)
                    .status()
                    .unwrap();
                assert!(st.success());
                // Only the xattrs differ, and only by what the host could not hold.
                let (dirs, others) = walk(&kmnt);
                for path in dirs.into_iter().chain(others) {
                    let rel = std::ffi::OsStr::from_bytes(&path);
                    let have = xattrs_of(&reference.join(rel));
                    for name in xattrs_of(&kmnt.join(rel))
                        .keys()
                        .filter(|n| !have.contains_key(*n))
                    {
                        let st = Command::new("setfattr")
                            .arg("-x")
                            .arg(std::ffi::OsStr::from_bytes(name))
                            .arg(kmnt.join(rel))
                            .status()
                            .unwrap();
                        assert!(st.success());
                    }
                }
                if let Start::KernelCompressed(algo) = start {
                    let out = Command::new("btrfs")
                        .args(["filesystem", "defragment", "-r", &format!("-c{algo}")])
                        .arg(&kmnt)
                        .output()
                        .unwrap();
                    assert!(out.status.success(), "defragment: {out:?}");
                    Command::new("sync").status().unwrap();
                    let (disk, ram) = oleo_testkit::check::compsize(&kmnt);
                    assert!(disk < ram, "the kernel compressed nothing: {disk} of {ram}");
                }
                k.unmount().unwrap();
            }
        }
        let mut opts = transport.options().to_vec();
        opts.extend_from_slice(options);
        let m = OleoMount::mount_rw(Path::new(OLEO), &image, &mnt, &opts).expect("oleo mount rw");
        let _dog = m.watchdog(std::time::Duration::from_secs(600));
        compare_trees(&reference, &mnt, "oleo (before)");
        transport.check(&m);
        let mut rng = Rng::new(seed);
        let (mut done, mut refused) = (0, 0);
        for i in 0..ops {
            let op = random_op(&mut rng, &reference, big);
            let want = apply_path(&reference, &op);
            let mut got = apply_path(&mnt, &op);
            // The reference lives on the host's ext4, which holds fewer xattr bytes per
            // inode than btrfs: where only it runs out, oleo's file is put back as the
            // reference has it, and the op counts as refused.
            if let (Op::SetXattr { path, name, .. }, Err(ENOSPC), Ok(())) = (&op, want, got) {
                copy_xattr(&reference, &mnt, path, name).expect("undo the xattr in oleo");
                got = want;
            }
            assert_eq!(
                got,
                want,
                "{name} seed {seed} op {i}: {op}: oleo {got:?} vs reference {want:?}\n{}",
                m.log_text()
            );
            if want.is_ok() {
                done += 1;
            } else {
                refused += 1;
            }
            if rng.chance(2) {
                mount::btrfs_sync(&mnt).unwrap();
            } else if rng.chance(2) {
                // An fsync of the root directory: a log sync.
                std::fs::File::open(&mnt).unwrap().sync_all().unwrap();
            }
            if i % 100 == 99 {
                compare_trees(&reference, &mnt, "oleo");
            }
        }
        compare_trees(&reference, &mnt, "oleo");
        drop(_dog);
        m.unmount().expect("unmount");
        eprintln!("{name} seed {seed}: {done} operations done, {refused} refused alike");
        assert_btrfs_check(&image, &format!("{name} seed {seed}"));
        {
            let k = KernelMount::mount(&image, &kmnt, &["rw"]).expect("kernel mount");
            compare_trees(&reference, &kmnt, "kernel");
            if options.iter().any(|o| o.starts_with("compress")) {
                let (disk, ram) = oleo_testkit::check::compsize(&kmnt);
                eprintln!("{name} seed {seed}: compsize {disk} of {ram} bytes");
                assert!(disk < ram, "nothing compressed: {disk} of {ram} bytes");
            }
            std::fs::write(kmnt.join("kernel-wrote-this"), b"from the kernel").unwrap();
            k.unmount().unwrap();
        }
        assert_btrfs_check(
            &image,
            &format!("{name} seed {seed}, after the kernel wrote"),
        );
        let m = OleoMount::mount_rw(Path::new(OLEO), &image, &mnt, &[]).expect("oleo mount again");
        assert_eq!(
            std::fs::read(mnt.join("kernel-wrote-this")).unwrap(),
            b"from the kernel"
        );
        if let Err(e) = std::fs::write(mnt.join("oleo-wrote-this-too"), b"and oleo again") {
            panic!(
                "oleo cannot write after the kernel did: {e}; oleo said:\n{}",
                m.log_text()
            );
        }
        m.unmount().unwrap();
        assert_btrfs_check(&image, &format!("{name} seed {seed}, final"));
    }
}

#[test]
fn fuse_rw_default_mkfs() {
    run_case("default", Start::Empty(&[]), 400, false);
}

#[test]
fn fuse_rw_4k_nodes_no_holes_off_xxhash() {
    run_case(
        "4k-holes-xxhash",
        Start::Empty(&["--nodesize", "4096", "-O", "^no-holes", "--csum", "xxhash"]),
        300,
        true,
    );
}

#[test]
fn fuse_rw_kernel_filled() {
    run_case("kernel-filled", Start::KernelFilled, 300, false);
}

/// The same random operations with requests taken through io_uring commands, and through
/// /dev/fuse reads when io_uring is turned off.
#[test]
fn fuse_rw_over_io_uring() {
    run_case_on("uring", Start::Empty(&[]), 400, true, Transport::IoUring);
}

#[test]
fn fuse_rw_over_dev_fuse() {
    run_case_on("dev-fuse", Start::Empty(&[]), 300, true, Transport::DevFuse);
}

/// Files the kernel compressed, partially overwritten by oleo compressing with another
/// algorithm; then the kernel reads everything back.
#[test]
fn fuse_rw_kernel_compressed_overwritten_with_lzo() {
    run_case_with(
        "kernel-zstd-oleo-lzo",
        Start::KernelCompressed("zstd"),
        300,
        true,
        Transport::Default,
        &["compress=lzo"],
    );
}

#[test]
fn fuse_rw_compress_force_zstd() {
    run_case_with(
        "force-zstd",
        Start::Empty(&[]),
        300,
        true,
        Transport::Default,
        &["compress-force=zstd:7"],
    );
}

/// An unlinked file stays readable and writable through open descriptors until the last
/// close (an orphan item keeps it across commits); then its space comes back. A server
/// killed while such a file is open leaves the orphan item: the next mount deletes it.
#[test]
fn unlinked_open_files_live_until_closed() {
    use std::io::{Read, Seek, SeekFrom, Write};
    let name = "orphans";
    if !(require_root(name) && require_fuse(name)) {
        return;
    }
    let dir = TempDir::new("fuse-orphans").unwrap();
    let image = dir.join("image");
    let mnt = dir.subdir("mnt").unwrap();
    mkfs_gib(&image);
    let m = OleoMount::mount_rw(Path::new(OLEO), &image, &mnt, &[]).expect("mount");
    let used = |p: &Path| {
        let st = nix_statvfs(p);
        st.0 - st.1
    };
    let before = used(&mnt);
    let path = mnt.join("doomed");
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    f.write_all(&vec![7u8; 32 << 20]).unwrap();
    f.sync_all().unwrap();
    std::fs::remove_file(&path).unwrap();
    assert!(!path.exists());
    // A commit while it is unlinked and open.
    mount::btrfs_sync(&mnt).unwrap();
    f.seek(SeekFrom::Start(0)).unwrap();
    f.write_all(b"still here").unwrap();
    f.sync_all().unwrap();
    let mut head = [0u8; 10];
    f.seek(SeekFrom::Start(0)).unwrap();
    f.read_exact(&mut head).unwrap();
    assert_eq!(&head, b"still here");
    assert!(
        used(&mnt) >= before + (30 << 20),
        "the open file's data must still be allocated"
    );
    drop(f);
    // The inode goes when the kernel, after the last close, forgets it (a FORGET it queues
    // by itself); freed space is reusable after the commit that follows.
    let t0 = std::time::Instant::now();
    loop {
        mount::btrfs_sync(&mnt).unwrap();
        if used(&mnt) < before + (4 << 20) {
            break;
        }
        assert!(
            t0.elapsed().as_secs() < 10,
            "space not given back after the last close"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    m.unmount().unwrap();
    assert_btrfs_check(&image, "orphans: after the last close");

    // Killed with an unlinked file open: the orphan item is on disk; the next mount cleans.
    let mut child = Command::new(OLEO)
        .args(["mount", "-f", "-o", "rw"])
        .arg(&image)
        .arg(&mnt)
        .spawn()
        .unwrap();
    let t0 = std::time::Instant::now();
    while mount_at(&mnt).is_none() {
        assert!(t0.elapsed().as_secs() < 10, "mount did not appear");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let path = mnt.join("doomed2");
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    f.write_all(&vec![9u8; 16 << 20]).unwrap();
    std::fs::remove_file(&path).unwrap();
    f.sync_all().unwrap();
    let _ = child.kill();
    let _ = child.wait();
    drop(f);
    let _ = Command::new("umount").arg("-l").arg(&mnt).status();
    assert_btrfs_check(&image, "orphans: killed with an orphan");
    let m = OleoMount::mount_rw(Path::new(OLEO), &image, &mnt, &[]).expect("mount again");
    mount::btrfs_sync(&mnt).unwrap();
    assert!(
        used(&mnt) < before + (4 << 20),
        "the orphan was not removed at mount"
    );
    m.unmount().unwrap();
    assert_btrfs_check(&image, "orphans: cleaned at mount");
}

/// (blocks, free blocks) in bytes.
fn nix_statvfs(p: &Path) -> (u64, u64) {
    let c = std::ffi::CString::new(p.as_os_str().as_bytes()).unwrap();
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut st) }, 0);
    (st.f_blocks * st.f_frsize, st.f_bfree * st.f_frsize)
}

/// copy_file_range shares whole extents (no new data space) and copies the rest.
#[test]
fn copy_file_range_shares_extents() {
    let name = "copy_file_range";
    if !(require_root(name) && require_fuse(name)) {
        return;
    }
    let dir = TempDir::new("fuse-cfr").unwrap();
    let image = dir.join("image");
    let mnt = dir.subdir("mnt").unwrap();
    mkfs_gib(&image);
    let m = OleoMount::mount_rw(Path::new(OLEO), &image, &mnt, &[]).expect("mount");
    let data: Vec<u8> = (0..(24u32 << 20) + 1234)
        .map(|i| (i / 4096) as u8 ^ (i as u8))
        .collect();
    std::fs::write(mnt.join("src"), &data).unwrap();
    mount::btrfs_sync(&mnt).unwrap();
    let before = nix_statvfs(&mnt);
    let src = std::fs::File::open(mnt.join("src")).unwrap();
    let dst = std::fs::File::create(mnt.join("dst")).unwrap();
    let mut copied = 0usize;
    while copied < data.len() {
        use std::os::fd::AsRawFd;
        let n = unsafe {
            libc::copy_file_range(
                src.as_raw_fd(),
                std::ptr::null_mut(),
                dst.as_raw_fd(),
                std::ptr::null_mut(),
                data.len() - copied,
                0,
            )
        };
        assert!(
            n > 0,
            "copy_file_range: {}",
            std::io::Error::last_os_error()
        );
        copied += n as usize;
    }
    dst.sync_all().unwrap();
    drop((src, dst));
    let after = nix_statvfs(&mnt);
    assert_eq!(std::fs::read(mnt.join("dst")).unwrap(), data);
    let grew = before.1.saturating_sub(after.1);
    assert!(
        grew < (4 << 20),
        "the copy took {grew} bytes of new space: extents were not shared"
    );
    // A partial, unaligned copy into the middle of a file is copied bytes.
    let out = std::fs::OpenOptions::new()
        .write(true)
        .open(mnt.join("dst"))
        .unwrap();
    let src = std::fs::File::open(mnt.join("src")).unwrap();
    {
        use std::os::fd::AsRawFd;
        let (mut off_in, mut off_out): (i64, i64) = (100, 5000);
        let n = unsafe {
            libc::copy_file_range(
                src.as_raw_fd(),
                &mut off_in,
                out.as_raw_fd(),
                &mut off_out,
                9000,
                0,
            )
        };
        assert_eq!(n, 9000);
    }
    drop((src, out));
    let mut want = data.clone();
    want.copy_within(100..9100, 5000);
    assert_eq!(std::fs::read(mnt.join("dst")).unwrap(), want);
    m.unmount().unwrap();
    assert_btrfs_check(&image, "copy_file_range");
    let k = dir.subdir("k").unwrap();
    let km = KernelMount::mount(&image, &k, &["ro"]).unwrap();
    assert_eq!(std::fs::read(k.join("dst")).unwrap(), want);
    assert_eq!(std::fs::read(k.join("src")).unwrap(), data);
    km.unmount().unwrap();
}

/// Writing to a filesystem with snapshots: the kernel makes a subvolume, fills it (enough for
/// multi-level trees), snapshots it writable and read-only. oleo then changes the subvolume
/// and the writable snapshot with random operations (checked against reference copies);
/// every shared block copied must move its back references, so `btrfs check` is the judge,
/// and the kernel must show each subvolume as its reference. The read-only snapshot refuses
/// changes with EROFS and stays as it was.
#[test]
fn fuse_rw_snapshots() {
    let name = "snapshots";
    if !(require_root(name) && require_fuse(name)) {
        return;
    }
    for seed in seeds(name, 1) {
        let dir = TempDir::new("fuse-rw-snap").unwrap();
        let image = dir.join("image");
        let reference = dir.subdir("ref").unwrap();
        let mnt = dir.subdir("mnt").unwrap();
        let kmnt = dir.subdir("kmnt").unwrap();
        std::fs::File::create(&image)
            .unwrap()
            .set_len(2 << 30)
            .unwrap();
        let out = Command::new("mkfs.btrfs")
            .args(["-q", "-f", "--nodesize", "4096"])
            .arg(&image)
            .output()
            .unwrap();
        assert!(out.status.success());
        let sh = |args: &[&str]| {
            let st = Command::new(args[0]).args(&args[1..]).status().unwrap();
            assert!(st.success(), "{args:?}");
        };
        {
            let k = KernelMount::mount(&image, &kmnt, &["rw"]).expect("kernel mount");
            let vol = kmnt.join("vol");
            sh(&["btrfs", "-q", "subvolume", "create", vol.to_str().unwrap()]);
            let mut rng = Rng::new(seed);
            for d in 0..8 {
                let dd = vol.join(format!("d{d}"));
                std::fs::create_dir(&dd).unwrap();
                for f in 0..250 {
                    let len = if f % 25 == 0 {
                        200_000 + rng.below(300_000)
                    } else {
                        rng.below(3000)
                    };
                    let data: Vec<u8> = (0..len).map(|i| (i as u8) ^ (f as u8)).collect();
                    std::fs::write(dd.join(format!("file-{f:04}")), data).unwrap();
                }
            }
            sh(&[
                "setfattr",
                "-n",
                "user.k",
                "-v",
                "original",
                vol.join("d0/file-0001").to_str().unwrap(),
            ]);
            sh(&[
                "btrfs",
                "-q",
                "subvolume",
                "snapshot",
                vol.to_str().unwrap(),
                kmnt.join("snap").to_str().unwrap(),
            ]);
            std::fs::write(
                vol.join("d1/after-snapshot"),
                b"kernel wrote this after the snapshot",
            )
            .unwrap();
            sh(&[
                "btrfs",
                "-q",
                "subvolume",
                "snapshot",
                "-r",
                vol.to_str().unwrap(),
                kmnt.join("snap-ro").to_str().unwrap(),
            ]);
            for sub in ["vol", "snap", "snap-ro"] {
                let st = Command::new("cp")
                    .arg("-a")
                    .arg(kmnt.join(sub))
                    .arg(&reference)
                    .status()
                    .unwrap();
                assert!(st.success());
            }
            k.unmount().unwrap();
        }
        let m = OleoMount::mount_rw(Path::new(OLEO), &image, &mnt, &[]).expect("oleo mount rw");
        let _dog = m.watchdog(std::time::Duration::from_secs(600));
        for sub in ["vol", "snap", "snap-ro"] {
            compare_trees(
                &reference.join(sub),
                &mnt.join(sub),
                &format!("oleo {sub} (before)"),
            );
        }
        // The read-only snapshot refuses changes.
        let e = std::fs::write(mnt.join("snap-ro/new"), b"x").unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{e}");
        let e = std::fs::remove_file(mnt.join("snap-ro/d0/file-0001")).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{e}");
        let mut rng = Rng::new(seed ^ 0x5eed);
        for i in 0..600 {
            let sub = if i % 2 == 0 { "vol" } else { "snap" };
            let (r, o) = (reference.join(sub), mnt.join(sub));
            let op = random_op(&mut rng, &r, false);
            let want = apply_path(&r, &op);
            let got = apply_path(&o, &op);
            assert_eq!(
                got,
                want,
                "{name} seed {seed} op {i} in {sub}: {op}: oleo {got:?} vs reference {want:?}\n{}",
                m.log_text()
            );
            if rng.chance(3) {
                mount::btrfs_sync(&mnt).unwrap();
            }
        }
        for sub in ["vol", "snap", "snap-ro"] {
            compare_trees(&reference.join(sub), &mnt.join(sub), &format!("oleo {sub}"));
        }
        drop(_dog);
        m.unmount().expect("unmount");
        assert_btrfs_check(&image, &format!("{name} seed {seed}"));
        let k = KernelMount::mount(&image, &kmnt, &["rw"]).expect("kernel mount");
        for sub in ["vol", "snap", "snap-ro"] {
            compare_trees(
                &reference.join(sub),
                &kmnt.join(sub),
                &format!("kernel {sub}"),
            );
        }
        // The kernel deletes the writable snapshot: every reference oleo moved must add up.
        sh(&[
            "btrfs",
            "-q",
            "subvolume",
            "delete",
            "-c",
            kmnt.join("snap").to_str().unwrap(),
        ]);
        sh(&["btrfs", "-q", "subvolume", "sync", kmnt.to_str().unwrap()]);
        k.unmount().unwrap();
        assert_btrfs_check(
            &image,
            &format!("{name} seed {seed}, after the kernel deleted the snapshot"),
        );
    }
}

/// Readers listing a big directory (readdirplus: one read lock for the listing and the
/// attributes) while writers create and write files: nothing may deadlock behind the
/// queued writers (a watchdog turns a hang into a failure), and the result is consistent.
#[test]
fn readers_and_writers_at_once() {
    let name = "readers_and_writers";
    if !(require_root(name) && require_fuse(name)) {
        return;
    }
    let dir = TempDir::new("fuse-rw-concurrent").unwrap();
    let image = dir.join("image");
    let mnt = dir.subdir("mnt").unwrap();
    mkfs_gib(&image);
    let m = OleoMount::mount_rw(Path::new(OLEO), &image, &mnt, &["threads=8"]).expect("mount");
    let big = mnt.join("big");
    std::fs::create_dir(&big).unwrap();
    for i in 0..1500 {
        std::fs::write(big.join(format!("f{i:05}")), b"x").unwrap();
    }
    let dog = m.watchdog(std::time::Duration::from_secs(120));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut handles = Vec::new();
    for r in 0..3 {
        let (big, stop) = (big.clone(), stop.clone());
        handles.push(std::thread::spawn(move || {
            let mut rounds = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                // A writer may remove a listed file before its stat: that is a race, not an error.
                let n = std::fs::read_dir(&big)
                    .unwrap()
                    .map(|e| e.unwrap().metadata().map(|m| m.len()))
                    .filter(|m| !matches!(m, Err(e) if e.kind() == std::io::ErrorKind::NotFound))
                    .inspect(|m| assert!(m.is_ok(), "stat failed: {m:?}"))
                    .count();
                assert!(n >= 1500, "reader {r} saw {n} entries");
                rounds += 1;
            }
            rounds
        }));
    }
    for w in 0..3 {
        let (big, stop) = (big.clone(), stop.clone());
        handles.push(std::thread::spawn(move || {
            let mut n = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let p = big.join(format!("w{w}-{n}"));
                std::fs::write(&p, vec![w as u8; 70_000]).unwrap();
                if n % 3 == 0 {
                    std::fs::remove_file(&p).unwrap();
                }
                n += 1;
            }
            n
        }));
    }
    std::thread::sleep(std::time::Duration::from_secs(8));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let done: Vec<usize> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    eprintln!("readers/writers: rounds and files {done:?}");
    assert!(
        done.iter().all(|&n| n > 0),
        "someone made no progress: {done:?}"
    );
    drop(dog);
    m.unmount().unwrap();
    assert_btrfs_check(&image, "concurrent readers and writers");
}

/// An fsync of a directory and an O_SYNC write through the mount write the log tree (no
/// commit), and the kernel's replay of a copy taken then has the new entries and the
/// written data; BTRFS_IOC_SYNC (`btrfs filesystem sync`) commits.
#[test]
fn directory_fsync_logs_and_the_sync_ioctl_commits() {
    let name = "dir-fsync";
    if !(require_root(name) && require_fuse(name)) {
        return;
    }
    let dir = TempDir::new("fuse-dir-fsync").unwrap();
    let image = dir.join("image");
    let copy = dir.join("copy");
    let mnt = dir.subdir("mnt").unwrap();
    let kmnt = dir.subdir("kmnt").unwrap();
    mkfs_gib(&image);
    let m = OleoMount::mount_rw(Path::new(OLEO), &image, &mnt, &[]).expect("mount");
    std::fs::create_dir(mnt.join("d")).unwrap();
    std::fs::write(mnt.join("d/old"), b"committed").unwrap();
    mount::btrfs_sync(&mnt).unwrap();
    let generation = superblock_generation(&image).unwrap();
    assert_eq!(
        superblock_log_root(&image).unwrap(),
        0,
        "a commit drops the log"
    );

    std::fs::write(mnt.join("d/new"), b"").unwrap();
    std::fs::remove_file(mnt.join("d/old")).unwrap();
    std::fs::File::open(mnt.join("d"))
        .unwrap()
        .sync_all()
        .unwrap();
    assert_ne!(
        superblock_log_root(&image).unwrap(),
        0,
        "no log after the fsync"
    );
    assert_eq!(
        superblock_generation(&image).unwrap(),
        generation,
        "the directory's fsync committed"
    );
    {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .write(true)
            .custom_flags(libc::O_SYNC)
            .open(mnt.join("d/sync"))
            .unwrap();
        f.write_all(&[7u8; 100_000]).unwrap();
        // No close, no fsync: O_SYNC made it durable.
        std::fs::copy(&image, &copy).unwrap();
    }

    mount::btrfs_sync(&mnt).unwrap();
    assert!(
        superblock_generation(&image).unwrap() > generation,
        "no commit"
    );
    assert_eq!(superblock_log_root(&image).unwrap(), 0);
    m.unmount().unwrap();

    let k = KernelMount::mount(&copy, &kmnt, &["rw"]).expect("kernel mount of the copy");
    let mut names: Vec<_> = std::fs::read_dir(kmnt.join("d"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    names.sort();
    let data = std::fs::read(kmnt.join("d/sync")).unwrap();
    k.unmount().unwrap();
    assert_eq!(names, ["new", "sync"], "the kernel's replay");
    assert!(
        data == [7u8; 100_000],
        "O_SYNC data after the kernel's replay"
    );
    assert_btrfs_check(&copy, "after the kernel's replay");
}

/// A fresh 1 GiB image with mkfs.btrfs's defaults.
fn mkfs_gib(image: &Path) {
    std::fs::File::create(image)
        .unwrap()
        .set_len(1 << 30)
        .unwrap();
    assert!(Command::new("mkfs.btrfs")
        .args(["-q", "-f"])
        .arg(image)
        .status()
        .unwrap()
        .success());
}

/// Random operations through the mount in a subvolume that `oleo subvolume snapshot`
/// snapshots (read-only or not) and `oleo subvolume delete` deletes between them, as a user
/// would: every snapshot must stay what the reference was when it was taken, through the
/// mount, and for the kernel after unmounting; `btrfs check` clean (the daemon's cleaner
/// drops the deleted ones meanwhile).
#[test]
fn fuse_rw_snapshots_taken_and_deleted() {
    let name = "snapshots-cli";
    if !(require_root(name) && require_fuse(name)) {
        return;
    }
    let cli = |args: &[&str]| {
        let out = Command::new(OLEO).args(args).output().unwrap();
        assert!(
            out.status.success(),
            "oleo {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    for seed in seeds(name, 1) {
        let dir = TempDir::new("fuse-rw-snap-cli").unwrap();
        let image = dir.join("image");
        let reference = dir.subdir("ref").unwrap();
        let mnt = dir.subdir("mnt").unwrap();
        let kmnt = dir.subdir("kmnt").unwrap();
        image::empty_image(&image, 2048, &[]).expect("mkfs.btrfs");
        let m = OleoMount::mount_rw(Path::new(OLEO), &image, &mnt, &[]).expect("oleo mount rw");
        let _dog = m.watchdog(std::time::Duration::from_secs(600));
        let work = mnt.join("work");
        cli(&["subvolume", "create", work.to_str().unwrap()]);
        let mut rng = Rng::new(seed);
        // (name, copy of the reference when it was taken)
        let mut snaps: Vec<(String, std::path::PathBuf)> = Vec::new();
        for i in 0..300 {
            let op = random_op(&mut rng, &reference, false);
            let want = apply_path(&reference, &op);
            let got = apply_path(&work, &op);
            assert_eq!(
                got,
                want,
                "{name} seed {seed} op {i}: {op}: oleo {got:?} vs reference {want:?}\n{}",
                m.log_text()
            );
            if rng.chance(4) {
                let snap = format!("snap{i}");
                let mut args = vec!["subvolume", "snapshot"];
                if rng.chance(50) {
                    args.push("-r");
                }
                let dst = mnt.join(&snap);
                args.extend([work.to_str().unwrap(), dst.to_str().unwrap()]);
                cli(&args);
                let copy = dir.join(format!("ref-{snap}"));
                let st = Command::new("cp")
                    .arg("-a")
                    .arg(&reference)
                    .arg(&copy)
                    .status()
                    .unwrap();
                assert!(st.success());
                snaps.push((snap, copy));
            }
            if !snaps.is_empty() && rng.chance(2) {
                let (snap, _) = snaps.remove(rng.below(snaps.len() as u64) as usize);
                cli(&["subvolume", "delete", mnt.join(&snap).to_str().unwrap()]);
                assert!(!mnt.join(&snap).exists(), "{snap} deleted");
            }
        }
        compare_trees(&reference, &work, "oleo");
        for (snap, copy) in &snaps {
            compare_trees(copy, &mnt.join(snap), &format!("oleo {snap}"));
        }
        drop(_dog);
        m.unmount().expect("unmount");
        eprintln!("{name} seed {seed}: {} snapshots kept", snaps.len());
        assert_btrfs_check(&image, &format!("{name} seed {seed}"));
        let k = KernelMount::mount(&image, &kmnt, &["ro"]).expect("kernel mount");
        compare_trees(&reference, &kmnt.join("work"), "kernel");
        for (snap, copy) in &snaps {
            compare_trees(copy, &kmnt.join(snap), &format!("kernel {snap}"));
        }
        k.unmount().unwrap();
    }
}
