//! The mount opens the filesystem, then forks, and the child serves it. An open that writes
//! a batch of small writes (a log replay) has started the thread that starts the image's
//! writeback (`Kicker`, io/device.rs) by then: the child has the device but not the
//! thread. The child must go on writing, commit, and close without waiting for a thread
//! it does not have, and leave no descriptor of the image open behind it.
//!
//! One test alone in this binary: the fork happens while no other test thread runs.
//! Needs root and btrfs-progs (a skip elsewhere, a failure under CI=true).

mod common;

use oleo::NewInode;
use oleo_testkit::assert_btrfs_check;
use oleo_testkit::ops::pattern;
use std::time::{Duration, Instant};

#[test]
fn a_child_forked_after_writeback_started_writes_and_closes() {
    let Some((tmp, image)) = common::scratch_image("fork tests", "oleo-fork-kicker", 256, &[])
    else {
        return;
    };
    let image = image.canonicalize().expect("canonical path");
    let fs = common::open_top_rw(&image);
    let f = fs
        .mknod(fs.root(), b"small", &NewInode::file(0o644))
        .expect("create")
        .id;
    // 12 MiB of 4 KiB writes through the image's page cache: more than one batch.
    let data = pattern(1, 4096);
    for i in 0..3072u64 {
        fs.write(f, i * 4096, &data).expect("write");
    }
    fs.sync().expect("commit");
    // SAFETY: this binary's only test; the harness's main thread waits for it and holds no
    // lock the child needs. The child only uses the filesystem, then _exits.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        // A panic here must not unwind into the test's frames (their drops would remove
        // the parent's image): it is an exit code as well.
        let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            for i in 0..3072u64 {
                if fs.write(f, i * 4096, &pattern(2, 4096)).is_err() {
                    return 3;
                }
            }
            if fs.close().is_err() {
                return 4;
            }
            if oleo_testkit::open_descriptors(&image) != 0 {
                return 5;
            }
            0
        }))
        .unwrap_or(8);
        // SAFETY: leaves the child without running the parent's exit handlers.
        unsafe { libc::_exit(code) };
    }
    // The parent's copy is the child's now, as in the mount: never dropped here.
    std::mem::forget(fs);
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut status = 0;
    loop {
        // SAFETY: waits for our own child; status is a valid out-pointer.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            break;
        }
        if Instant::now() > deadline {
            // SAFETY: our own child.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            panic!("the child hung closing the filesystem");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "the child failed: status {status:#x} (3: write, 4: close, 5: a descriptor left open, 8: a panic)"
    );
    assert_btrfs_check(&image, "after the child's close");
    // The kernel reads what the child wrote (this process keeps its forgotten copy's
    // claim until it exits, as the mount's parent does: oleo could not open it again).
    let whole: Vec<u8> = (0..3072).flat_map(|_| pattern(2, 4096)).collect();
    let expect = std::collections::BTreeMap::from([("small".to_string(), whole)]);
    common::extents::kernel_reads(&image, &tmp.join("mnt"), &expect);
}
