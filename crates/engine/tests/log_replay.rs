//! Replay of log trees the kernel wrote: images copied right after fsyncs (a crash at that
//! moment), opened by oleo read-only (replayed in memory) and read-write (replayed and
//! committed), must show what the kernel shows after its own replay of the same image, pass
//! `btrfs check`, and read the same again in the kernel.

mod common;

use common::tree_log::*;
use oleo::{Filesystem, OpenOptions};
use oleo_testkit::{assert_btrfs_check, require_root, TempDir};
use std::fs::{self, File, OpenOptions as StdOpen};
use std::io::{self, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

/// Files of the fast-fsync case at the top (another one is in subvolume `sv`).
const TOP_FILES: &[&str] = &[
    "overwritten",
    "punched",
    "truncated",
    "xattrs",
    "chmodded",
    "prealloc",
    "inline",
    "untouched",
];

/// Files as they are before the last commit.
fn setup(top: &Path) -> io::Result<()> {
    for (i, f) in TOP_FILES.iter().enumerate() {
        let len = if *f == "inline" { 100 } else { 64 * 1024 };
        fs::write(top.join(f), pattern(i as u64, len))?;
    }
    sh(Command::new("btrfs")
        .args(["subvolume", "create"])
        .arg(top.join("sv")))?;
    fs::write(top.join("sv/in-subvolume"), pattern(99, 20000))?;
    sh(Command::new("setfattr")
        .args(["-n", "user.gone", "-v", "before"])
        .arg(top.join("xattrs")))?;
    sh(Command::new("setfattr")
        .args(["-n", "user.kept", "-v", "kept"])
        .arg(top.join("xattrs")))
}

/// The changes after the last commit, each made durable by an fsync of its file only.
fn changes(top: &Path) -> io::Result<()> {
    let p = |f: &str| top.join(f);
    write_at(&p("overwritten"), 8192, &pattern(1000, 4096))?;
    let mut f = StdOpen::new().append(true).open(p("overwritten"))?;
    f.write_all(&pattern(1001, 10000))?;
    f.sync_all()?;

    sh(Command::new("fallocate")
        .args(["-p", "-o", "16384", "-l", "16384"])
        .arg(p("punched")))?;
    fsync(&p("punched"))?;

    StdOpen::new()
        .write(true)
        .open(p("truncated"))?
        .set_len(10000)?;
    fsync(&p("truncated"))?;

    sh(Command::new("setfattr")
        .args(["-n", "user.new", "-v", "added"])
        .arg(p("xattrs")))?;
    sh(Command::new("setfattr")
        .args(["-x", "user.gone"])
        .arg(p("xattrs")))?;
    fsync(&p("xattrs"))?;

    fs::set_permissions(p("chmodded"), fs::Permissions::from_mode(0o600))?;
    fsync(&p("chmodded"))?;

    sh(Command::new("fallocate")
        .args(["-n", "-o", "65536", "-l", "65536"])
        .arg(p("prealloc")))?;
    write_at(&p("prealloc"), 4096, &pattern(1002, 4096))?;
    fsync(&p("prealloc"))?;

    let mut f = StdOpen::new().append(true).open(p("inline"))?;
    f.write_all(&pattern(1003, 200))?;
    f.sync_all()?;

    write_at(&p("sv/in-subvolume"), 20000, &pattern(1004, 30000))?;
    fsync(&p("sv/in-subvolume"))
}

#[test]
fn fast_fsync_logs_of_the_kernel_replay_as_the_kernel_does() {
    let name = "fast_fsync_logs_of_the_kernel_replay_as_the_kernel_does";
    let _ = env_logger::builder().is_test(true).try_init();
    if !require_root(name) {
        return;
    }
    let tmp = TempDir::new("log-replay").expect("temp dir");
    let image = build_logged(&tmp, "log-fast", 0x10a0, true, setup, changes);
    let want = kernel_replay(&tmp, &image);
    assert_eq!(
        want["overwritten"].1,
        64 * 1024 + 10000,
        "the kernel's replay"
    );
    assert!(
        want["xattrs"].4.contains_key("user.new") && !want["xattrs"].4.contains_key("user.gone")
    );
    oleo_replays_as_the_kernel(name, &tmp, &image, &want);
}

/// Name changes made durable by fsyncs (the cases of btrfs-format.md 12.3 and the
/// crash-consistency literature), as one log.
fn name_changes(top: &Path) -> io::Result<()> {
    let p = |f: &str| top.join(f);
    // mkdir newdir; write newdir/newfile; fsync newfile
    fs::create_dir(p("newdir"))?;
    let mut f = File::create(p("newdir/newfile"))?;
    f.write_all(&pattern(20, 8192))?;
    f.sync_all()?;
    // rename d/a to d/b; fsync b
    fs::rename(p("d/a"), p("d/b"))?;
    fsync(&p("d/b"))?;
    // unlink a sibling; fsync the directory
    fs::remove_file(p("d/sib1"))?;
    fsync(&p("d"))?;
    // a hard link; fsync the file
    fs::hard_link(p("d/existing"), p("d/existing.link"))?;
    fsync(&p("d/existing"))?;
    // a link of another directory's file; fsync the directory holding the link
    fs::hard_link(p("x"), p("d/xlink"))?;
    fsync(&p("d"))?;
    // a new empty file; fsync the directory
    File::create(p("e/created"))?;
    fsync(&p("e"))?;
    // unlink a file and fsync its directory
    fs::remove_file(p("e/doomed"))?;
    fsync(&p("e"))?;
    // a new file at the top; fsync the top directory (logs the root and its "..")
    fs::write(p("topnew"), pattern(21, 100))?;
    fsync(top)
}

fn name_setup(top: &Path) -> io::Result<()> {
    for d in ["d", "e"] {
        fs::create_dir(top.join(d))?;
    }
    for (i, f) in ["d/a", "d/sib1", "d/sib2", "d/existing", "x", "e/doomed"]
        .iter()
        .enumerate()
    {
        fs::write(top.join(f), pattern(30 + i as u64, 3000 + 1000 * i))?;
    }
    Ok(())
}

#[test]
fn logs_of_name_changes_replay_as_the_kernel_does() {
    let name = "logs_of_name_changes_replay_as_the_kernel_does";
    let _ = env_logger::builder().is_test(true).try_init();
    if !require_root(name) {
        return;
    }
    let tmp = TempDir::new("log-names").expect("temp dir");
    let image = build_logged(&tmp, "log-names", 0x10a3, true, name_setup, name_changes);
    let want = kernel_replay(&tmp, &image);
    assert!(want.contains_key("newdir/newfile") && want.contains_key("d/b"));
    assert!(!want.contains_key("d/sib1") && !want.contains_key("e/doomed"));
    oleo_replays_as_the_kernel(name, &tmp, &image, &want);
}

#[test]
fn random_fsync_workloads_of_the_kernel_replay_as_the_kernel_does() {
    let name = "random_fsync_workloads_of_the_kernel_replay_as_the_kernel_does";
    let _ = env_logger::builder().is_test(true).try_init();
    if !require_root(name) {
        return;
    }
    let base = oleo_testkit::seed(0x10b0);
    let rounds = std::env::var("OLEO_LOG_REPLAY_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(6u64);
    for round in 0..rounds {
        let seed = base.wrapping_add(round);
        let what =
            format!("seed {seed} (replay with OLEO_TEST_SEED={seed} OLEO_LOG_REPLAY_ROUNDS=1)");
        let tmp = TempDir::new("log-random").expect("temp dir");
        let setup = |top: &Path| {
            let mut rng = common::Rng(seed ^ 0x55);
            for d in ["a", "b", "a/c"] {
                fs::create_dir(top.join(d))?;
                for i in 0..3 {
                    let len = rng.below(200 << 10) as usize;
                    fs::write(top.join(format!("{d}/f{i}")), pattern(seed ^ i, len))?;
                }
            }
            Ok(())
        };
        // Renames across directories may make the kernel commit: not every change is logged.
        let image = build_logged(&tmp, "log-random", seed, false, setup, |top| {
            random_changes(top, seed, 40)
        });
        if let Ok(dir) = std::env::var("OLEO_KEEP_IMAGES") {
            fs::copy(&image, Path::new(&dir).join(format!("log-{seed}.img"))).expect("keep");
        }
        let want = kernel_replay(&tmp, &image);
        oleo_replays_as_the_kernel(&what, &tmp, &image, &want);
    }
}

#[test]
fn nologreplay_leaves_the_last_commit_untouched() {
    let name = "nologreplay_leaves_the_last_commit_untouched";
    let _ = env_logger::builder().is_test(true).try_init();
    if !require_root(name) {
        return;
    }
    let tmp = TempDir::new("log-off").expect("temp dir");
    let image = build_logged(
        &tmp,
        "log-new-file",
        0x10a1,
        true,
        |top| fs::write(top.join("old"), b"committed"),
        |top| {
            let mut f = File::create(top.join("new"))?;
            f.write_all(&pattern(7, 5000))?;
            f.sync_all()
        },
    );
    let before = fs::read(&image).expect("read image");

    let off = OpenOptions {
        log_replay: false,
        ..OpenOptions::default()
    };
    let fs = Filesystem::open_rw(&image, off).expect("open with nologreplay");
    assert!(fs.has_pending_log());
    let why = fs
        .can_write()
        .expect_err("writable with a pending log")
        .to_string();
    assert!(why.contains("nologreplay"), "reason: {why}");
    assert!(fs.resolve_path(fs.root(), b"old").is_ok());
    assert!(
        fs.resolve_path(fs.root(), b"new").is_err(),
        "showed uncommitted state"
    );
    fs.close().expect("close");
    assert!(
        fs::read(&image).expect("read image") == before,
        "oleo wrote to the image"
    );

    // Replayed, the new file is there with its fsynced content.
    let fs = Filesystem::open_rw(&image, OpenOptions::default()).expect("open with oleo");
    let id = fs
        .resolve_path(fs.root(), b"new")
        .expect("new after replay");
    assert_eq!(fs.read(id, 0, 8192).expect("read"), pattern(7, 5000));
    fs.close().expect("close");
    assert_btrfs_check(&image, "after replaying a new file");
}
