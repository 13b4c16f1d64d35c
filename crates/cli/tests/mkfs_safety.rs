//! `oleo mkfs` never destroys by accident, as mkfs.btrfs: a target holding a filesystem
//! (btrfs or another) needs `-f`; a target the kernel has mounted, or one an oleo mount
//! holds, is refused even with `-f`; a failed mkfs removes a file it created itself. The new
//! root directory belongs to the user who ran mkfs.
//!
//! Needs root (kernel mounts, another user), FUSE for the oleo-held case.

use oleo::{Filesystem, OpenOptions};
use oleo_testkit::{btrfs_check, require_fuse, require_root, KernelMount, OleoMount, TempDir};
use std::path::Path;
use std::process::Command;

const OLEO: &str = env!("CARGO_BIN_EXE_oleo");

fn oleo_mkfs(args: &[&str], image: &Path) -> (bool, String) {
    let out = Command::new(OLEO)
        .arg("mkfs")
        .args(args)
        .arg(image)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

fn sparse(path: &Path, mb: u64) {
    std::fs::File::create(path)
        .unwrap()
        .set_len(mb << 20)
        .unwrap();
}

fn head(path: &Path) -> Vec<u8> {
    let mut v = std::fs::read(path).unwrap();
    v.truncate(2 << 20);
    v
}

#[test]
fn a_target_with_a_signature_needs_force() {
    let name = "mkfs_signatures";
    if !require_root(name) {
        return;
    }
    let tmp = TempDir::new(name).unwrap();
    let ext4 = tmp.join("ext4.img");
    sparse(&ext4, 256);
    let out = Command::new("mkfs.ext4")
        .args(["-q", "-F", "-L", "data"])
        .arg(&ext4)
        .output()
        .unwrap();
    assert!(out.status.success(), "mkfs.ext4: {out:?}");
    let before = head(&ext4);
    let (ok, text) = oleo_mkfs(&[], &ext4);
    assert!(!ok, "an ext4 image was formatted without -f:\n{text}");
    assert!(
        text.contains("ext4 filesystem (label `data`)") && text.contains("-f"),
        "the message says what is there and how to go on: {text}"
    );
    assert!(head(&ext4) == before, "the refused target was changed");
    let (ok, text) = oleo_mkfs(&["-f", "-q"], &ext4);
    assert!(ok, "-f: {text}");
    Filesystem::open(&ext4, OpenOptions::default()).unwrap();

    let btrfs = tmp.join("btrfs.img");
    sparse(&btrfs, 256);
    let out = Command::new("mkfs.btrfs")
        .args(["-q", "-f", "-L", "old"])
        .arg(&btrfs)
        .output()
        .unwrap();
    assert!(out.status.success(), "mkfs.btrfs: {out:?}");
    let (ok, text) = oleo_mkfs(&[], &btrfs);
    assert!(
        !ok && text.contains("btrfs filesystem (label `old`)"),
        "{text}"
    );
    let (ok, text) = oleo_mkfs(&["--force", "-q"], &btrfs);
    assert!(ok, "--force: {text}");
    btrfs_check(&btrfs, false).unwrap();
}

#[test]
fn a_target_in_use_is_refused_even_with_force() {
    let name = "mkfs_in_use";
    if !(require_root(name) && require_fuse(name)) {
        return;
    }
    let tmp = TempDir::new(name).unwrap();
    let image = tmp.join("fs.img");
    sparse(&image, 256);
    assert!(oleo_mkfs(&["-q"], &image).0);
    let mnt = tmp.subdir("mnt").unwrap();

    let k = KernelMount::mount(&image, &mnt, &[]).unwrap();
    let (ok, text) = oleo_mkfs(&["-f"], &image);
    assert!(
        !ok && text.contains("mounted by the kernel at") && text.contains(&*mnt.to_string_lossy()),
        "{text}"
    );
    k.unmount().unwrap();

    let m = OleoMount::mount_rw(Path::new(OLEO), &image, &mnt, &[]).unwrap();
    std::fs::write(mnt.join("precious"), b"keep me").unwrap();
    let (ok, text) = oleo_mkfs(&["-f"], &image);
    assert!(!ok && text.contains("in use by oleo (pid"), "{text}");
    assert_eq!(std::fs::read(mnt.join("precious")).unwrap(), b"keep me");
    m.unmount().unwrap();
    btrfs_check(&image, true).unwrap();
}

#[test]
fn a_failed_mkfs_leaves_no_file_it_created() {
    let tmp = TempDir::new("mkfs_failed").unwrap();
    let new = tmp.join("new.img");
    let (ok, text) = oleo_mkfs(&["--size", "16M"], &new);
    assert!(!ok && text.contains("too small"), "{text}");
    assert!(!new.exists(), "a failed mkfs left {} behind", new.display());
    // A file that was there before stays.
    let old = tmp.join("old.img");
    sparse(&old, 16);
    let (ok, _) = oleo_mkfs(&[], &old);
    assert!(!ok);
    assert!(old.exists());
}

#[test]
fn the_root_directory_belongs_to_the_caller() {
    let name = "mkfs_root_owner";
    if !require_root(name) {
        return;
    }
    let tmp = TempDir::new(name).unwrap();
    let dir = tmp.subdir("nobody").unwrap();
    let chown = Command::new("chown")
        .arg("65534:65534")
        .arg(&dir)
        .status()
        .unwrap();
    assert!(chown.success());
    let image = dir.join("fs.img");
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", OLEO])
        .args(["mkfs", "-q", "--size", "256M"])
        .arg(&image)
        .output()
        .unwrap();
    assert!(out.status.success(), "mkfs as nobody: {out:?}");
    let fs = Filesystem::open(&image, OpenOptions::default()).unwrap();
    let root = fs.getattr(fs.root()).unwrap();
    assert_eq!((root.uid, root.gid), (65534, 65534));
    drop(fs);
    btrfs_check(&image, false).unwrap();
}

#[test]
fn a_block_device_is_claimed_not_refused() {
    let name = "mkfs_block_device";
    if !require_root(name) {
        return;
    }
    let tmp = TempDir::new(name).unwrap();
    let image = tmp.join("dev.img");
    sparse(&image, 300);
    let lo = oleo_testkit::LoopDevice::attach(&image, false).unwrap();
    let (ok, text) = oleo_mkfs(&["-q"], lo.path());
    assert!(ok, "mkfs of an unused loop device: {text}");
    let (ok, text) = oleo_mkfs(&["-q"], lo.path());
    assert!(!ok && text.contains("btrfs filesystem"), "{text}");
    let mnt = tmp.subdir("mnt").unwrap();
    let out = Command::new("mount")
        .arg(lo.path())
        .arg(&mnt)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let (ok, text) = oleo_mkfs(&["-f"], lo.path());
    let _ = Command::new("umount").arg(&mnt).status();
    assert!(!ok && text.contains("mounted by the kernel"), "{text}");
}
