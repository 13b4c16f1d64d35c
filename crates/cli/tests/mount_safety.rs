//! `oleo mount` refuses what would lose data: a second oleo serving an image oleo already
//! serves (a second mount of it that oleo finds in mountinfo is a bind mount of the first,
//! mount_twice.rs; one it cannot find, whose first mount shows another fsname, meets the
//! image's claim), an image the kernel has mounted; a truncated image mounts read-only with a
//! warning, and `-o rw` of it is refused with the reason.

use oleo_testkit::{empty_image, require_fuse, require_root, KernelMount, OleoMount, TempDir};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

const OLEO: &str = env!("CARGO_BIN_EXE_oleo");

fn mkfs(image: &Path, mb: u64) {
    empty_image(image, mb, &[]).unwrap();
}

/// `oleo mount -f` that is expected to fail at once: its exit status and output.
fn mount_fails(image: &Path, mnt: &Path, opts: &[&str]) -> String {
    let mut cmd = Command::new(OLEO);
    cmd.args(["mount", "-f"]);
    if !opts.is_empty() {
        cmd.arg("-o").arg(opts.join(","));
    }
    let out = cmd.arg(image).arg(mnt).output().unwrap();
    let text = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "the mount was accepted: {text}");
    text
}

#[test]
fn a_second_mount_and_a_kernel_mounted_image_are_refused() {
    let name = "mount_twice";
    if !(require_root(name) && require_fuse(name)) {
        return;
    }
    let tmp = TempDir::new(name).unwrap();
    let image = tmp.join("d.img");
    mkfs(&image, 256);
    let (m1, m2) = (tmp.subdir("m1").unwrap(), tmp.subdir("m2").unwrap());
    // Shown under another source: not found as a mount of the image, so the second
    // mount opens the image and meets the first one's claim.
    let first = OleoMount::mount_rw(Path::new(OLEO), &image, &m1, &["fsname=elsewhere"]).unwrap();
    std::fs::write(m1.join("fsynced"), b"must survive").unwrap();
    for opts in [&["rw"][..], &["ro"], &[]] {
        let text = mount_fails(&image, &m2, opts);
        assert!(
            text.contains("oleo (pid") && text.contains("d.img"),
            "-o {opts:?}: the refusal names the holder: {text}"
        );
    }
    first.unmount().unwrap();

    let k = KernelMount::mount(&image, &m1, &[]).unwrap();
    let text = mount_fails(&image, &m2, &[]);
    assert!(
        text.contains("mounted by the kernel at") && text.contains(&*m1.to_string_lossy()),
        "{text}"
    );
    assert_eq!(std::fs::read(m1.join("fsynced")).unwrap(), b"must survive");
    k.unmount().unwrap();
}

#[test]
fn a_truncated_image_mounts_read_only_and_rw_is_refused() {
    let name = "mount_truncated";
    if !(require_root(name) && require_fuse(name)) {
        return;
    }
    let tmp = TempDir::new(name).unwrap();
    let image = tmp.join("t.img");
    mkfs(&image, 1024);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&image)
        .unwrap()
        .set_len(200 << 20)
        .unwrap();
    let mnt = tmp.subdir("mnt").unwrap();
    let text = mount_fails(&image, &mnt, &["rw"]);
    assert!(
        text.contains("cannot mount read-write") && text.contains("smaller than"),
        "{text}"
    );
    let m =
        OleoMount::mount_with_timeout(Path::new(OLEO), &image, &mnt, &[], Duration::from_secs(20))
            .unwrap();
    let err = std::fs::write(mnt.join("f"), b"x").unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EROFS), "{err}");
    m.unmount().unwrap();
}

/// A btrfs image made into ext4 keeps btrfs's superblock copy at 64 MiB: oleo must not
/// bring the stale btrfs back from it (and then write over the ext4), as the kernel never
/// reads the copies either. The mount is refused, naming the missing superblock, and the
/// image is unchanged.
#[test]
fn a_device_reformatted_over_btrfs_is_not_taken_for_btrfs() {
    let name = "reformatted";
    if !require_root(name) {
        return;
    }
    if oleo_testkit::env::find_in_path("mkfs.ext4").is_none() {
        assert!(!oleo_testkit::env::is_ci(), "mkfs.ext4 is missing");
        eprintln!("{name}: skipped, mkfs.ext4 is missing (e2fsprogs)");
        return;
    }
    let tmp = TempDir::new(name).unwrap();
    let image = tmp.join("d.img");
    mkfs(&image, 300);
    let st = Command::new("mkfs.ext4")
        .args(["-q", "-F", "-E", "nodiscard"])
        .arg(&image)
        .status()
        .unwrap();
    assert!(st.success(), "mkfs.ext4 failed");
    let bytes = std::fs::read(&image).unwrap();
    let copy = &bytes[(64 << 20) + 0x40..(64 << 20) + 0x48];
    assert_eq!(
        copy, b"_BHRfS_M",
        "ext4 overwrote btrfs's copy: the test proves nothing"
    );
    let err = mount_fails(&image, &tmp.subdir("m").unwrap(), &[]);
    assert!(
        err.contains("no btrfs superblock at 64 KiB"),
        "not refused for the missing primary superblock: {err}"
    );
    assert!(std::fs::read(&image).unwrap() == bytes, "the image changed");
}
