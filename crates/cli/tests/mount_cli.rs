//! The `oleo mount` command as users meet it: background and foreground mounts, unmounting
//! with umount, mount(8)'s helper convention, refusals with one clear message, and many
//! readers at once.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use oleo_testkit::*;

const OLEO: &str = env!("CARGO_BIN_EXE_oleo");

fn small_image(dir: &TempDir, name: &str) -> PathBuf {
    let image = dir.join(format!("{name}.img"));
    let spec = ImageSpec::new(name, seed(7))
        .size_mb(256)
        .populate(PopulateSpec::basic());
    build_image(&spec, &image).expect("build image");
    image
}

fn wait_until(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

fn oleo(args: &[&str]) -> std::process::Output {
    Command::new(OLEO).args(args).output().expect("run oleo")
}

#[test]
fn background_mount_then_umount() {
    if !require_fuse_mount("background_mount_then_umount") {
        return;
    }
    let dir = TempDir::new("mount-bg").unwrap();
    let image = small_image(&dir, "bg");
    let mp = dir.subdir("mnt").unwrap();
    let out = oleo(&["mount", image.to_str().unwrap(), mp.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "oleo mount failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The command returns only once the mount answers.
    assert!(is_mounted(&mp));
    assert!(std::fs::read_dir(&mp).unwrap().count() > 0);
    let st = Command::new("umount").arg(&mp).status().unwrap();
    assert!(st.success());
    assert!(!is_mounted(&mp));
}

/// The pid, process group and session of the process whose command line names `mp`.
fn server_ids(mp: &Path) -> Option<(i32, i32, i32)> {
    let want = mp.to_str()?.as_bytes();
    for e in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(cmd) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        if cmd.split(|&b| b == 0).any(|a| a == want) && cmd.starts_with(OLEO.as_bytes()) {
            let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
            // pid (comm) state ppid pgrp session ...
            let rest: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
            return Some((pid, rest[2].parse().ok()?, rest[3].parse().ok()?));
        }
    }
    None
}

/// A background server leaves the caller's job but not its session (so that it shares the
/// caller's CPU group under sched_autogroup), and a hang-up of the terminal it was started
/// from does not stop it.
#[test]
fn background_mount_outlives_its_terminal_in_the_callers_session() {
    if !require_fuse_mount("background_mount_outlives_its_terminal_in_the_callers_session") {
        return;
    }
    let dir = TempDir::new("mount-hup").unwrap();
    let image = small_image(&dir, "hup");
    let mp = dir.subdir("mnt").unwrap();
    let line = format!("{OLEO} mount {} {}", image.display(), mp.display());
    // script(1) runs the line on a new terminal in a session of its own and hangs the
    // terminal up when the line ends.
    let out = Command::new("script")
        .args(["-qec", &line, "/dev/null"])
        .output()
        .expect("script(1), from util-linux");
    assert!(
        out.status.success(),
        "oleo mount under script(1): {}",
        String::from_utf8_lossy(&out.stdout)
    );
    std::thread::sleep(Duration::from_millis(500));
    let (pid, pgrp, session) = server_ids(&mp).expect("the server is still running");
    assert_eq!(pgrp, pid, "the server leads a process group of its own");
    assert_ne!(
        session, pid,
        "the server stays in the session it was started from"
    );
    assert!(std::fs::read_dir(&mp).unwrap().count() > 0, "still serving");
    let st = Command::new("umount").arg(&mp).status().unwrap();
    assert!(st.success());
    assert!(
        wait_until(Duration::from_secs(20), || server_ids(&mp).is_none()),
        "the server ends after the unmount"
    );
}

#[test]
fn foreground_mount_ends_on_unmount() {
    if !require_fuse_mount("foreground_mount_ends_on_unmount") {
        return;
    }
    let dir = TempDir::new("mount-fg").unwrap();
    let image = small_image(&dir, "fg");
    let mp = dir.subdir("mnt").unwrap();
    let mut child = Command::new(OLEO)
        .args([
            "mount",
            "-f",
            "-o",
            "ro",
            image.to_str().unwrap(),
            mp.to_str().unwrap(),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    assert!(
        wait_until(Duration::from_secs(10), || is_mounted(&mp)),
        "foreground mount did not appear"
    );
    assert!(Command::new("fusermount3")
        .arg("-u")
        .arg(&mp)
        .status()
        .unwrap()
        .success());
    let exited = wait_until(Duration::from_secs(10), || {
        child.try_wait().unwrap().is_some()
    });
    if !exited {
        let _ = child.kill();
    }
    assert!(exited, "oleo -f kept running after the unmount");
    assert!(child.wait().unwrap().success());
}

#[test]
fn mount_helper_convention() {
    if !require_fuse_mount("mount_helper_convention") {
        return;
    }
    let dir = TempDir::new("mount-helper").unwrap();
    let image = small_image(&dir, "helper");
    let mp = dir.subdir("mnt").unwrap();
    // mount(8) looks for /sbin/mount.fuse.oleo; point one at this build for the test.
    let helper = Path::new("/sbin/mount.fuse.oleo");
    let ours = !helper.exists();
    if ours {
        std::os::unix::fs::symlink(OLEO, helper).unwrap();
    }
    let st = Command::new("mount")
        .args(["-t", "fuse.oleo", "-o", "subvol=/"])
        .arg(&image)
        .arg(&mp)
        .status()
        .unwrap();
    let mounted = is_mounted(&mp);
    let listed = std::fs::read_dir(&mp).map(|d| d.count()).unwrap_or(0);
    let _ = Command::new("umount").arg(&mp).status();
    if ours {
        let _ = std::fs::remove_file(helper);
    }
    assert!(
        st.success() && mounted && listed > 0,
        "mount -t fuse.oleo failed (status {st})"
    );
}

#[test]
fn refusals_are_one_clear_message() {
    if !require_fuse_mount("refusals_are_one_clear_message") {
        return;
    }
    let dir = TempDir::new("mount-refuse").unwrap();
    let image = small_image(&dir, "refuse");
    let mp = dir.subdir("mnt").unwrap();
    let (img, mnt) = (image.to_str().unwrap(), mp.to_str().unwrap());
    // An image oleo reads but cannot write (no skinny metadata items).
    let old = dir.join("old-format.img");
    std::fs::File::create(&old)
        .unwrap()
        .set_len(256 << 20)
        .unwrap();
    let st = Command::new("mkfs.btrfs")
        .args(["-q", "-f", "-O", "^skinny-metadata"])
        .arg(&old)
        .status()
        .unwrap();
    assert!(st.success());
    let old = old.to_str().unwrap();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["mount", "-o", "rw", old, mnt],
            "cannot mount read-write: unsupported: writing needs skinny metadata",
        ),
        (
            vec!["mount", "-o", "bogus", img, mnt],
            "unknown mount option",
        ),
        (
            vec!["mount", "-o", "subvolid=4242", img, mnt],
            "no subvolume with id 4242",
        ),
        (
            vec!["mount", "-o", "subvol=no/such", img, mnt],
            "subvolume `no/such` not found",
        ),
        (
            vec!["mount", "/etc/hostname", mnt],
            "no valid btrfs superblock",
        ),
        (
            vec!["mount", img, "/nonexistent-mountpoint"],
            "/nonexistent-mountpoint",
        ),
    ];
    for (args, expect) in cases {
        let out = oleo(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} should fail");
        assert!(
            err.contains(expect),
            "{args:?}: expected {expect:?} in {err:?}"
        );
        assert_eq!(
            err.trim().lines().count(),
            1,
            "{args:?}: one line, got {err:?}"
        );
        assert!(!is_mounted(&mp));
    }
}

#[test]
fn a_missing_device_is_named() {
    if !require_fuse_mount("a_missing_device_is_named") {
        return;
    }
    let dir = TempDir::new("mount-multi").unwrap();
    let (a, b) = (dir.join("a.img"), dir.join("b.img"));
    for p in [&a, &b] {
        std::fs::File::create(p)
            .unwrap()
            .set_len(256 << 20)
            .unwrap();
    }
    let st = Command::new("mkfs.btrfs")
        .args(["-q", "-f", "-d", "raid1", "-m", "raid1"])
        .arg(&a)
        .arg(&b)
        .status()
        .unwrap();
    assert!(st.success());
    let mp = dir.subdir("mnt").unwrap();
    let out = oleo(&["mount", a.to_str().unwrap(), mp.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    // One line, naming the device and what to do.
    assert!(
        err.trim().lines().count() == 1
            && err.contains("device 2")
            && err.contains("missing")
            && err.contains("degraded"),
        "{err}"
    );
}

#[test]
fn parallel_readers_get_the_same_bytes() {
    if !require_fuse_mount("parallel_readers_get_the_same_bytes") {
        return;
    }
    let dir = TempDir::new("mount-par").unwrap();
    let image = dir.join("par.img");
    let spec = ImageSpec::new("par", seed(11))
        .size_mb(512)
        .populate(PopulateSpec {
            large_file_mb: 64,
            ..PopulateSpec::none()
        });
    build_image(&spec, &image).unwrap();
    let kmp = dir.subdir("kernel").unwrap();
    let kernel = KernelMount::mount(&image, &kmp, &[]).unwrap();
    let big = walk_files(&kmp)
        .into_iter()
        .max_by_key(|p| std::fs::metadata(p).unwrap().len())
        .unwrap();
    let rel = big.strip_prefix(&kmp).unwrap().to_path_buf();
    let expected = std::fs::read(&big).unwrap();
    drop(kernel);
    let mp = dir.subdir("mnt").unwrap();
    let _m = OleoMount::mount(Path::new(OLEO), &image, &mp, &[]).unwrap();
    let path = mp.join(&rel);
    let readers: Vec<_> = (0..8)
        .map(|i| {
            let path = path.clone();
            std::thread::spawn(move || {
                use std::io::{Read, Seek, SeekFrom};
                let mut f = std::fs::File::open(&path).unwrap();
                let len = f.metadata().unwrap().len();
                // Each reader starts somewhere else so requests interleave.
                let start = len / 8 * i;
                let mut out = vec![0u8; len as usize];
                f.seek(SeekFrom::Start(start)).unwrap();
                f.read_exact(&mut out[start as usize..]).unwrap();
                f.seek(SeekFrom::Start(0)).unwrap();
                f.read_exact(&mut out[..start as usize]).unwrap();
                out
            })
        })
        .collect();
    for r in readers {
        assert!(
            r.join().unwrap() == expected,
            "a parallel reader saw different bytes"
        );
    }
}

fn walk_files(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let t = e.file_type().unwrap();
            if t.is_dir() {
                stack.push(e.path());
            } else if t.is_file() {
                out.push(e.path());
            }
        }
    }
    out
}
