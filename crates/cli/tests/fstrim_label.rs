//! FITRIM (`fstrim`) and the label ioctls (`btrfs filesystem label`) through an oleo FUSE
//! mount, against kernel btrfs doing the same on a loop device over an image file (the
//! loop driver punches holes for discards). After the trim the image holds fewer blocks,
//! `btrfs check --check-data-csum` is clean, and every file left reads back byte for byte
//! through oleo and through a read-only kernel mount.
//!
//! Needs root, loop devices, kernel btrfs and FUSE: a skip elsewhere, a failure under CI=true.

use oleo_testkit::env::skip;
use oleo_testkit::mount::btrfs_sync;
use oleo_testkit::syscalls::{as_user, USER};
use oleo_testkit::*;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;

const OLEO: &str = env!("CARGO_BIN_EXE_oleo");
const MIB: u64 = 1 << 20;
const FITRIM: libc::c_ulong = 0xC018_5879;
const FS_IOC_GETFSLABEL: libc::c_ulong = 0x8100_9431;
const FS_IOC_SETFSLABEL: libc::c_ulong = 0x4100_9432;

/// FITRIM on `mnt`: the bytes trimmed, or the errno.
fn fitrim(mnt: &Path, start: u64, len: u64, minlen: u64) -> Result<u64, i32> {
    let f = std::fs::File::open(mnt).map_err(|e| e.raw_os_error().unwrap_or(0))?;
    let mut range = [start, len, minlen];
    use std::os::fd::AsRawFd;
    // SAFETY: FITRIM reads and writes the three u64s of `range`, which outlives the call.
    let r = unsafe { libc::ioctl(f.as_raw_fd(), FITRIM as _, range.as_mut_ptr()) };
    if r == 0 {
        Ok(range[1])
    } else {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
    }
}

/// FS_IOC_SETFSLABEL with the 256-byte buffer `buf`: the errno, 0 for success.
fn set_label_raw(mnt: &Path, buf: &[u8; 256]) -> i32 {
    let f = std::fs::File::open(mnt).unwrap();
    use std::os::fd::AsRawFd;
    // SAFETY: the ioctl reads 256 bytes from `buf`.
    let r = unsafe { libc::ioctl(f.as_raw_fd(), FS_IOC_SETFSLABEL as _, buf.as_ptr()) };
    if r == 0 {
        0
    } else {
        std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
    }
}

fn get_label_raw(mnt: &Path) -> Vec<u8> {
    let f = std::fs::File::open(mnt).unwrap();
    let mut buf = [0xffu8; 256];
    use std::os::fd::AsRawFd;
    // SAFETY: the ioctl writes 256 bytes into `buf`.
    let r = unsafe { libc::ioctl(f.as_raw_fd(), FS_IOC_GETFSLABEL as _, buf.as_mut_ptr()) };
    assert_eq!(
        r,
        0,
        "FS_IOC_GETFSLABEL: {}",
        std::io::Error::last_os_error()
    );
    let n = buf
        .iter()
        .position(|&b| b == 0)
        .expect("a NUL-terminated label");
    buf[..n].to_vec()
}

/// `fstrim -v MNT`: the bytes it reports ("MNT: 1 MiB (1048576 bytes) trimmed").
fn fstrim(mnt: &Path) -> u64 {
    let out = Command::new("fstrim").arg("-v").arg(mnt).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "fstrim -v {}: {out:?}", mnt.display());
    let inner = text.split('(').nth(1).and_then(|t| t.split(' ').next());
    inner
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("fstrim said {text:?}"))
}

/// Files kept (name, seed, length) and files deleted before the trim.
const KEEP: &[(&str, u64, u64)] = &[("a", 1, 3 * MIB + 123), ("b", 2, 17 * MIB), ("c", 3, 4096)];
const DELETE: &[(&str, u64, u64)] = &[("x", 4, 120 * MIB), ("y", 5, 90 * MIB)];

/// Writes every file, makes them durable, deletes the others and commits.
fn fill_and_delete(mnt: &Path) {
    for &(name, seed, len) in KEEP.iter().chain(DELETE) {
        std::fs::write(
            mnt.join(name),
            oleo_testkit::ops::pattern(seed, len as usize),
        )
        .unwrap();
    }
    btrfs_sync(mnt).unwrap();
    for &(name, _, _) in DELETE {
        std::fs::remove_file(mnt.join(name)).unwrap();
    }
    // The kernel forgets the deleted inodes soon after; oleo frees their extents then.
    std::thread::sleep(std::time::Duration::from_millis(500));
    btrfs_sync(mnt).unwrap();
}

fn check_kept(mnt: &Path, who: &str) {
    for &(name, seed, len) in KEEP {
        let got = std::fs::read(mnt.join(name)).unwrap();
        assert!(
            got == oleo_testkit::ops::pattern(seed, len as usize),
            "{who}: {name} does not read back"
        );
    }
    for &(name, _, _) in DELETE {
        assert!(!mnt.join(name).exists(), "{who}: {name} came back");
    }
}

#[test]
fn fstrim_punches_free_space_as_kernel_btrfs_does() {
    let name = "fstrim_oleo";
    if !require_fuse_mount(name) {
        return;
    }
    if oleo_testkit::env::find_in_path("fstrim").is_none() {
        skip(name, "needs fstrim (util-linux)");
        return;
    }
    let dir = TempDir::new(name).unwrap();
    oleo_testkit::tempdir::open_to_others(dir.path());

    // Kernel btrfs on a loop device over the same kind of image, the same steps.
    let kimg = dir.join("kernel.img");
    empty_image(&kimg, 512, &[]).unwrap();
    let kmnt = dir.subdir("kmnt").unwrap();
    let k = KernelMount::mount(&kimg, &kmnt, &["rw", "nodiscard"]).unwrap();
    fill_and_delete(k.path());
    let kernel_blocks = std::fs::metadata(&kimg).unwrap().blocks();
    let kernel_trimmed = fstrim(k.path());
    let kernel_after = std::fs::metadata(&kimg).unwrap().blocks();
    let kernel_short = fitrim(k.path(), 0, 100, 0);
    let kernel_past = fitrim(k.path(), 1 << 50, u64::MAX, 0).map(drop);
    let kernel_wrap = fitrim(k.path(), u64::MAX - 4095, 8192, 0).map(drop);
    let kernel_user = as_user(|| fitrim(k.path(), 0, u64::MAX, 0)).map(drop);
    k.unmount().unwrap();

    let img = dir.join("oleo.img");
    empty_image(&img, 512, &[]).unwrap();
    let mnt = dir.subdir("mnt").unwrap();
    let m = OleoMount::mount_rw(Path::new(OLEO), &img, &mnt, &[]).unwrap();
    fill_and_delete(m.path());
    let before = std::fs::metadata(&img).unwrap().blocks();
    let trimmed = fstrim(m.path());
    let after = std::fs::metadata(&img).unwrap().blocks();
    eprintln!(
        "fstrim: kernel btrfs {kernel_trimmed} bytes (image {} -> {} KiB), \
         oleo {trimmed} bytes (image {} -> {} KiB)",
        kernel_blocks / 2,
        kernel_after / 2,
        before / 2,
        after / 2
    );
    let deleted: u64 = DELETE.iter().map(|d| d.2).sum();
    assert!(
        trimmed >= deleted,
        "oleo trimmed {trimmed} bytes, less than the {deleted} deleted"
    );
    assert!(
        trimmed <= 512 * MIB * 2,
        "oleo trimmed {trimmed} bytes of a 512 MiB image"
    );
    // The same order of magnitude as the kernel on the same steps.
    assert!(
        trimmed / 2 <= kernel_trimmed && kernel_trimmed / 2 <= trimmed,
        "oleo trimmed {trimmed} bytes, kernel btrfs {kernel_trimmed}"
    );
    assert!(
        (before - after) * 512 >= deleted * 9 / 10,
        "the image's blocks went from {before} to {after} only"
    );
    let kept: u64 = KEEP.iter().map(|k| k.2).sum();
    assert!(after * 512 >= kept, "the image holds less than its files");

    // Argument errors as the kernel gives them.
    assert_eq!(
        fitrim(m.path(), 0, 100, 0).map(drop),
        kernel_short.map(drop)
    );
    assert_eq!(
        kernel_short,
        Err(libc::EINVAL),
        "kernel: len under a sector"
    );
    assert_eq!(
        fitrim(m.path(), 1 << 50, u64::MAX, 0).map(drop),
        kernel_past
    );
    assert_eq!(
        fitrim(m.path(), u64::MAX - 4095, 8192, 0).map(drop),
        kernel_wrap
    );
    // Root only (the kernel: CAP_SYS_ADMIN).
    assert_eq!(kernel_user, Err(libc::EPERM), "kernel: a user's FITRIM");
    assert_eq!(
        as_user(|| fitrim(m.path(), 0, u64::MAX, 0)).map(drop),
        Err(libc::EPERM),
        "oleo: a user's FITRIM ({USER:?})"
    );
    // A minimum length above every free extent trims no block group space: only the
    // unallocated space remains (the kernel trims that whatever the range).
    let big_minlen = fitrim(m.path(), 0, u64::MAX, 1 << 40).unwrap();
    assert!(big_minlen < trimmed, "{big_minlen} with minlen 1 TiB");
    check_kept(m.path(), "oleo after fstrim");
    m.unmount().unwrap();

    assert_btrfs_check(&img, "after fstrim through oleo");
    let m = OleoMount::mount(Path::new(OLEO), &img, &mnt, &[]).unwrap();
    check_kept(m.path(), "oleo mounted again");
    // A read-only mount never writes the image: EROFS.
    assert_eq!(fitrim(m.path(), 0, u64::MAX, 0), Err(libc::EROFS));
    m.unmount().unwrap();
    let k = KernelMount::mount(&img, &kmnt, &["ro"]).unwrap();
    check_kept(k.path(), "kernel btrfs");
    k.unmount().unwrap();
}

#[test]
fn label_gets_and_sets_through_the_mount() {
    let name = "fslabel_oleo";
    if !require_fuse_mount(name) {
        return;
    }
    let dir = TempDir::new(name).unwrap();
    oleo_testkit::tempdir::open_to_others(dir.path());
    let img = dir.join("oleo.img");
    empty_image(&img, 256, &["-L", "first"]).unwrap();
    let mnt = dir.subdir("mnt").unwrap();
    let m = OleoMount::mount_rw(Path::new(OLEO), &img, &mnt, &[]).unwrap();
    let label = |args: &[&str]| {
        let out = Command::new("btrfs")
            .args(["filesystem", "label"])
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "btrfs filesystem label {args:?}: {out:?}"
        );
        String::from_utf8_lossy(&out.stdout).trim_end().to_string()
    };
    let mp = m.path().to_str().unwrap();
    assert_eq!(label(&[mp]), "first");
    assert_eq!(label(&[mp, "oleo-label"]), "");
    assert_eq!(label(&[mp]), "oleo-label");
    assert_eq!(get_label_raw(m.path()), b"oleo-label");
    // 256 bytes without a NUL: EINVAL, as the kernel (btrfs-progs refuses it earlier).
    assert_eq!(set_label_raw(m.path(), &[b'x'; 256]), libc::EINVAL);
    // The longest label, 255 bytes.
    let mut long = [b'l'; 256];
    long[255] = 0;
    assert_eq!(set_label_raw(m.path(), &long), 0);
    assert_eq!(get_label_raw(m.path()), vec![b'l'; 255]);
    // Root only (the kernel: CAP_SYS_ADMIN); anyone reads it.
    let mut user_try = [0u8; 256];
    user_try[..4].copy_from_slice(b"user");
    assert_eq!(as_user(|| set_label_raw(m.path(), &user_try)), libc::EPERM);
    assert_eq!(as_user(|| get_label_raw(m.path())), vec![b'l'; 255]);
    assert_eq!(label(&[mp, "final"]), "");
    m.unmount().unwrap();

    assert_eq!(label(&[img.to_str().unwrap()]), "final");
    let out = Command::new("blkid")
        .args(["-p", "-s", "LABEL", "-o", "value"])
        .arg(&img)
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "final");
    assert_btrfs_check(&img, "after setting the label through oleo");

    // Read-only: the label reads, setting it is EROFS.
    let m = OleoMount::mount(Path::new(OLEO), &img, &mnt, &[]).unwrap();
    assert_eq!(get_label_raw(m.path()), b"final");
    let mut ro_try = [0u8; 256];
    ro_try[..2].copy_from_slice(b"ro");
    assert_eq!(set_label_raw(m.path(), &ro_try), libc::EROFS);
    m.unmount().unwrap();
}
