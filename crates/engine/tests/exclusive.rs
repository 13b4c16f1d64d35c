//! One writer per filesystem and never beside the kernel; a device smaller than its
//! filesystem is not written; dropping a writable filesystem commits, `close` reports.
//!
//! Needs root, btrfs-progs and loop devices for some cases (prints `SKIP: ...` without them;
//! fails under CI=true).

use oleo::{Error, Filesystem, OpenOptions};
use oleo_testkit::{
    assert_btrfs_check, empty_image, require_root, KernelMount, LoopDevice, TempDir,
};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn mkfs(dir: &TempDir, mb: u64) -> PathBuf {
    let image = dir.join("image");
    empty_image(&image, mb, &[]).unwrap();
    image
}

fn busy_message(r: oleo::Result<Filesystem>) -> String {
    match r {
        Err(Error::Busy(m)) => m,
        Err(e) => panic!("expected a refusal naming the holder, got: {e}"),
        Ok(_) => panic!("a second open was accepted"),
    }
}

/// Kills the holder however the test ends.
struct Holder(Child);

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A process holding `flock -x` on the image, as another oleo would (flock execs `sleep`,
/// which keeps the lock: one process to kill).
fn hold_with_flock(image: &Path) -> Holder {
    let mut child = Command::new("flock")
        .args(["--no-fork", "-x"])
        .arg(image)
        .args(["sleep", "600"])
        .stdout(Stdio::null())
        .spawn()
        .expect("flock (util-linux)");
    // Wait until the lock is taken: our shared open starts failing.
    let until = Instant::now() + Duration::from_secs(10);
    while Instant::now() < until {
        match Filesystem::open(image, OpenOptions::default()) {
            Err(Error::Busy(_)) => return Holder(child),
            _ => std::thread::sleep(Duration::from_millis(20)),
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("flock never took the lock");
}

#[test]
fn a_second_writer_and_a_reader_beside_a_writer_are_refused() {
    let name = "exclusive_second_open";
    if !require_root(name) {
        return;
    }
    let dir = TempDir::new(name).unwrap();
    let image = mkfs(&dir, 256);
    let fs = Filesystem::open_rw(&image, OpenOptions::default()).unwrap();
    let m = busy_message(Filesystem::open_rw(&image, OpenOptions::default()));
    assert!(m.contains("image") && m.contains("this process"), "{m}");
    let m = busy_message(Filesystem::open(&image, OpenOptions::default()));
    assert!(m.contains("open for writing"), "{m}");
    drop(fs);

    // Readers share; a writer beside them is refused.
    let r1 = Filesystem::open(&image, OpenOptions::default()).unwrap();
    let r2 = Filesystem::open(&image, OpenOptions::default()).unwrap();
    busy_message(Filesystem::open_rw(&image, OpenOptions::default()));
    drop((r1, r2));
    Filesystem::open_rw(&image, OpenOptions::default()).unwrap();
}

#[test]
fn the_holder_is_named_and_a_killed_holder_releases_the_image() {
    let name = "exclusive_other_process";
    if !require_root(name) {
        return;
    }
    let dir = TempDir::new(name).unwrap();
    let image = mkfs(&dir, 256);
    let mut holder = hold_with_flock(&image);
    let m = busy_message(Filesystem::open_rw(&image, OpenOptions::default()));
    assert!(
        m.contains(&format!("pid {}", holder.0.id())) && m.contains("sleep 600"),
        "the message names the holder and its command: {m}"
    );
    // SIGKILL: the kernel drops the lock with the process, nothing is left to clean up.
    holder.0.kill().unwrap();
    holder.0.wait().unwrap();
    Filesystem::open_rw(&image, OpenOptions::default())
        .unwrap_or_else(|e| panic!("the image stayed locked after its holder died: {e}"));
}

#[test]
fn an_image_the_kernel_has_mounted_is_refused_and_a_held_loop_cannot_be_mounted() {
    let name = "exclusive_kernel";
    if !require_root(name) {
        return;
    }
    let dir = TempDir::new(name).unwrap();
    let image = mkfs(&dir, 256);
    let mnt = dir.subdir("mnt").unwrap();
    let k = KernelMount::mount(&image, &mnt, &[]).unwrap();
    for r in [
        Filesystem::open_rw(&image, OpenOptions::default()),
        Filesystem::open(&image, OpenOptions::default()),
        Filesystem::open_rw(k.device(), OpenOptions::default()),
    ] {
        let m = busy_message(r);
        assert!(
            m.contains("mounted by the kernel") && m.contains(&mnt.display().to_string()),
            "the message names the mount point: {m}"
        );
    }
    k.unmount().unwrap();

    // The other way round: while oleo writes the image, its loop device cannot be mounted.
    let lo = LoopDevice::attach(&image, false).unwrap();
    let fs = Filesystem::open_rw(&image, OpenOptions::default()).unwrap();
    let out = Command::new("mount")
        .arg(lo.path())
        .arg(&mnt)
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "the kernel mounted a loop device over an image oleo is writing"
    );
    drop(fs);
    drop(lo);
}

#[test]
fn a_device_smaller_than_its_filesystem_is_read_but_never_written() {
    let name = "exclusive_truncated";
    if !require_root(name) {
        return;
    }
    let dir = TempDir::new(name).unwrap();
    let image = mkfs(&dir, 1024);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&image)
        .unwrap()
        .set_len(200 << 20)
        .unwrap();
    let before = std::fs::read(&image).unwrap();
    match Filesystem::open_rw(&image, OpenOptions::default()) {
        Err(Error::Unsupported(m)) => assert!(
            m.contains(&(200u64 << 20).to_string()) && m.contains(&(1024u64 << 20).to_string()),
            "both sizes are named: {m}"
        ),
        Err(e) => panic!("refused for the wrong reason: {e}"),
        Ok(_) => panic!("a truncated image was opened for writing"),
    }
    let fs = Filesystem::open(&image, OpenOptions::default()).unwrap();
    fs.readdir(fs.root(), 0, &mut |_| true).unwrap();
    drop(fs);
    assert!(
        std::fs::read(&image).unwrap() == before,
        "the image changed"
    );
}

#[test]
fn dropping_a_writable_filesystem_commits_and_close_reports() {
    let name = "exclusive_drop_commits";
    if !require_root(name) {
        return;
    }
    let dir = TempDir::new(name).unwrap();
    let image = mkfs(&dir, 256);
    {
        let fs = Filesystem::open_rw(&image, OpenOptions::default()).unwrap();
        let root = fs.root();
        let f = fs
            .mknod(root, b"kept", &oleo::NewInode::file(0o644))
            .unwrap();
        fs.write(f.id, 0, b"written, never synced\n").unwrap();
        // No sync, no close.
    }
    let fs = Filesystem::open(&image, OpenOptions::default()).unwrap();
    let id = fs.lookup(fs.root(), b"kept").unwrap();
    assert_eq!(fs.read(id, 0, 100).unwrap(), b"written, never synced\n");
    drop(fs);
    assert_btrfs_check(&image, "a drop");

    let fs = Filesystem::open_rw(&image, OpenOptions::default()).unwrap();
    let root = fs.root();
    fs.mknod(root, b"closed", &oleo::NewInode::file(0o600))
        .unwrap();
    fs.close().unwrap();
    let fs = Filesystem::open(&image, OpenOptions::default()).unwrap();
    fs.lookup(fs.root(), b"closed").unwrap();
    drop(fs);

    // A commit that cannot reach the disk: close says so.
    let fs = Filesystem::open_rw(&image, OpenOptions::default()).unwrap();
    let root = fs.root();
    fs.mknod(root, b"lost", &oleo::NewInode::file(0o600))
        .unwrap();
    fs.fail_writes_after(0);
    assert!(fs.close().is_err(), "close hid a failed commit");
    let fs = Filesystem::open(&image, OpenOptions::default()).unwrap();
    assert!(fs.lookup(fs.root(), b"lost").is_err());
    drop(fs);
    assert_btrfs_check(&image, "a failed close");
}

#[test]
fn an_aborted_transaction_turns_the_filesystem_read_only() {
    let name = "exclusive_abort_read_only";
    if !require_root(name) {
        return;
    }
    let dir = TempDir::new(name).unwrap();
    let image = mkfs(&dir, 256);
    let fs = Filesystem::open_rw(&image, OpenOptions::default()).unwrap();
    let root = fs.root();
    fs.mknod(root, b"pending", &oleo::NewInode::file(0o600))
        .unwrap();
    fs.fail_writes_after(0);
    assert!(fs.sync().is_err(), "a commit that cannot write succeeded");
    let later = fs
        .mknod(root, b"later", &oleo::NewInode::file(0o600))
        .unwrap_err();
    assert_eq!(later.errno(), libc::EROFS, "{later}");
    assert!(matches!(later, Error::Aborted(_)), "{later}");
    drop(fs);
    let fs = Filesystem::open(&image, OpenOptions::default()).unwrap();
    assert!(fs.lookup(fs.root(), b"pending").is_err());
}
