//! Stopping a read-write oleo mount without losing what was written: SIGTERM, SIGINT and
//! SIGHUP commit, unmount and exit 0; `umount` followed at once by `btrfs check` or a
//! kernel mount never sees a half-written image; while oleo writes an image nobody else
//! may open it for writing, and without the means to refuse that (no CAP_SYS_ADMIN) a loop
//! device attached to it turns the mount read-only before its next commit.

use oleo_testkit::cmd::run;
use oleo_testkit::mount::btrfs_sync;
use oleo_testkit::*;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const OLEO: &str = env!("CARGO_BIN_EXE_oleo");

/// Orphaned daemons become this process' children, so their exit status can be read.
fn become_subreaper() {
    // SAFETY: plain prctl.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
}

/// The exit status of `pid`, once it has exited (it must be our child or orphan).
fn wait_pid(pid: i32, limit: Duration) -> i32 {
    let until = Instant::now() + limit;
    loop {
        let mut status = 0;
        // SAFETY: plain waitpid.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        assert!(r >= 0, "waitpid {pid}: {}", std::io::Error::last_os_error());
        if r == pid {
            return status;
        }
        assert!(
            Instant::now() < until,
            "pid {pid} did not exit in {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The pid of the oleo serving `mp` (the process whose command line names it).
fn server_pid(mp: &Path) -> Option<i32> {
    let want = mp.to_str()?.as_bytes();
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid = e.file_name().to_string_lossy().parse::<i32>().ok()?;
        let cmd = std::fs::read(e.path().join("cmdline")).ok()?;
        let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
        let zombie = stat.rsplit_once(')')?.1.trim_start().starts_with('Z');
        (!zombie && cmd.starts_with(OLEO.as_bytes()) && cmd.split(|&b| b == 0).any(|a| a == want))
            .then_some(pid)
    })
}

/// Files written through the mount without fsync: (name, contents).
fn write_unsynced(mp: &Path, tag: &str) -> Vec<(String, Vec<u8>)> {
    let mut files = Vec::new();
    let small = format!("written before the signal ({tag})").into_bytes();
    std::fs::write(mp.join("small"), &small).unwrap();
    files.push(("small".to_string(), small));
    let big: Vec<u8> = (0..6u32 << 20)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    std::fs::create_dir_all(mp.join("dir/sub")).unwrap();
    std::fs::write(mp.join("dir/sub/big"), &big).unwrap();
    files.push(("dir/sub/big".to_string(), big));
    std::fs::write(mp.join("to-rename"), b"renamed").unwrap();
    std::fs::rename(mp.join("to-rename"), mp.join("dir/renamed")).unwrap();
    files.push(("dir/renamed".to_string(), b"renamed".to_vec()));
    files
}

/// Mounts read-only with oleo and compares.
fn assert_files(image: &Path, mp: &Path, files: &[(String, Vec<u8>)], when: &str) {
    assert_btrfs_check(image, when);
    let m = OleoMount::mount(Path::new(OLEO), image, mp, &[]).unwrap();
    for (name, data) in files {
        let got = std::fs::read(mp.join(name)).unwrap_or_else(|e| panic!("{when}: {name}: {e}"));
        assert!(got == *data, "{when}: {name} differs");
    }
    m.unmount().unwrap();
}

fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGTERM => "SIGTERM",
        libc::SIGINT => "SIGINT",
        libc::SIGHUP => "SIGHUP",
        _ => "?",
    }
}

/// Waits for a server started by `start_server` to exit: its exit code (-1 if a signal
/// ended it) and what it said (a foreground one's stderr, a background one's log).
fn wait_server(pid: i32, fg_child: Option<Child>, log: &Path) -> (i32, String) {
    match fg_child {
        Some(c) => {
            let out = c.wait_with_output().unwrap();
            let code = out.status.code().unwrap_or(-1);
            (code, String::from_utf8_lossy(&out.stderr).into_owned())
        }
        None => {
            let st = wait_pid(pid, Duration::from_secs(60));
            let code = if libc::WIFEXITED(st) {
                libc::WEXITSTATUS(st)
            } else {
                -1
            };
            (code, std::fs::read_to_string(log).unwrap_or_default())
        }
    }
}

/// `oleo mount -o rw,commit=300,log=LOG SOURCE MP`, in the foreground (the child kept) or
/// in the background (silent when it works); the server's pid.
fn start_server(
    source: &Path,
    mp: &Path,
    log: &Path,
    foreground: bool,
    when: &str,
) -> (i32, Option<Child>) {
    let _ = std::fs::remove_file(log);
    let mut cmd = Command::new(OLEO);
    cmd.arg("mount");
    if foreground {
        cmd.arg("-f");
    }
    cmd.arg("-o")
        .arg(format!("rw,commit=300,log={}", log.display()))
        .arg(source)
        .arg(mp)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if foreground {
        let c = cmd.spawn().unwrap();
        let until = Instant::now() + Duration::from_secs(20);
        while !is_mounted(mp) || std::fs::metadata(mp).is_err() {
            assert!(Instant::now() < until, "{when}: not mounted");
            std::thread::sleep(Duration::from_millis(20));
        }
        (c.id() as i32, Some(c))
    } else {
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "{when}: {out:?}");
        assert!(
            out.stdout.is_empty() && out.stderr.is_empty(),
            "{when}: a mount that worked says nothing: {out:?}"
        );
        (server_pid(mp).expect("the server runs"), None)
    }
}

#[test]
fn a_stop_signal_commits_unmounts_and_exits_zero() {
    let name = "mount_stop_signals";
    if !require_fuse_mount(name) {
        return;
    }
    become_subreaper();
    let dir = TempDir::new(name).unwrap();
    let image = dir.join("s.img");
    oleo_mkfs(OLEO, &image, 256);
    let mp = dir.subdir("mnt").unwrap();
    let log = dir.join("oleo.log");
    // Background servers: SIGTERM and SIGHUP; foreground: SIGINT (Ctrl-C) and SIGTERM.
    for (sig, foreground) in [
        (libc::SIGTERM, false),
        (libc::SIGHUP, false),
        (libc::SIGINT, true),
        (libc::SIGTERM, true),
    ] {
        let when = format!(
            "{} to a {} server",
            signal_name(sig),
            if foreground {
                "foreground"
            } else {
                "background"
            }
        );
        let (pid, fg_child) = start_server(&image, &mp, &log, foreground, &when);
        let files = write_unsynced(&mp, &when);
        let started = Instant::now();
        // SAFETY: plain kill.
        assert_eq!(unsafe { libc::kill(pid, sig) }, 0);
        let (status, stderr) = wait_server(pid, fg_child, &log);
        eprintln!("{when}: stopped in {:?}", started.elapsed());
        assert_eq!(status, 0, "{when}: exit status; said: {stderr}");
        assert!(!is_mounted(&mp), "{when}: the mount point is free");
        let said = format!("stopped by {}", signal_name(sig));
        assert!(stderr.contains(&said), "{when}: no {said:?} in {stderr}");
        assert_files(&image, &mp, &files, &when);
    }
}

/// A second signal during the stop ends the server at once; the image keeps its last
/// commit (or the final one, if the stop was faster than the second signal).
#[test]
fn a_second_signal_exits_at_once_and_the_image_stays_consistent() {
    let name = "mount_stop_twice";
    if !require_fuse_mount(name) {
        return;
    }
    let dir = TempDir::new(name).unwrap();
    let image = dir.join("t.img");
    oleo_mkfs(OLEO, &image, 256);
    let mp = dir.subdir("mnt").unwrap();
    let mut child = Command::new(OLEO)
        .args(["mount", "-f", "-o", "rw,commit=300"])
        .arg(&image)
        .arg(&mp)
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let until = Instant::now() + Duration::from_secs(20);
    while !is_mounted(&mp) || std::fs::metadata(&mp).is_err() {
        assert!(Instant::now() < until, "not mounted");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::fs::write(mp.join("synced"), b"durable").unwrap();
    btrfs_sync(&mp).unwrap();
    write_unsynced(&mp, "twice");
    let pid = child.id() as i32;
    // SAFETY: plain kill.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    std::thread::sleep(Duration::from_millis(5));
    // SAFETY: plain kill.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let st = child.wait().unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert!(
        st.success() || st.signal() == Some(libc::SIGTERM),
        "exits 0 (stop done) or by the second signal: {st:?}"
    );
    if is_mounted(&mp) {
        let _ = Command::new("umount").arg("-l").arg(&mp).status();
    }
    assert_files(
        &image,
        &mp,
        &[("synced".to_string(), b"durable".to_vec())],
        "after two signals",
    );
}

/// A stop signal whose final commit cannot be written (the device turned read-only under
/// the server) exits non-zero and says why, in the foreground and in the background.
#[test]
fn a_failed_final_commit_after_a_stop_signal_exits_nonzero_and_says_why() {
    let name = "mount_stop_failed_commit";
    if !require_fuse_mount(name) {
        return;
    }
    become_subreaper();
    let dir = TempDir::new(name).unwrap();
    let image = dir.join("f.img");
    oleo_mkfs(OLEO, &image, 256);
    let mp = dir.subdir("mnt").unwrap();
    let log = dir.join("oleo.log");
    for (sig, foreground) in [(libc::SIGTERM, false), (libc::SIGINT, true)] {
        let when = format!(
            "{} to a {} server",
            signal_name(sig),
            if foreground {
                "foreground"
            } else {
                "background"
            }
        );
        let dev = LoopDevice::attach(&image, false).unwrap();
        let (pid, fg_child) = start_server(dev.path(), &mp, &log, foreground, &when);
        std::fs::write(mp.join("lost"), when.as_bytes()).unwrap();
        // Into the server, not committed (commit=300).
        oleo_testkit::mount::syncfs(&mp).unwrap();
        run(Command::new("blockdev").arg("--setro").arg(dev.path())).unwrap();
        // SAFETY: plain kill.
        assert_eq!(unsafe { libc::kill(pid, sig) }, 0);
        let (status, said) = wait_server(pid, fg_child, &log);
        let _ = Command::new("blockdev")
            .arg("--setrw")
            .arg(dev.path())
            .status();
        assert_ne!(status, 0, "{when}: exit status; said: {said}");
        assert!(
            said.contains("final commit at unmount failed"),
            "{when}: no reason given: {said}"
        );
        assert!(!is_mounted(&mp), "{when}: the mount point is free");
        drop(dev);
        assert_btrfs_check(&image, &when);
    }
}

/// How many times `umount` is followed by `btrfs check` and a kernel mount
/// (OLEO_UMOUNT_ROUNDS, default 100).
fn rounds() -> usize {
    std::env::var("OLEO_UMOUNT_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(100)
}

#[test]
fn umount_then_check_and_kernel_mount_at_once_see_every_write() {
    let name = "mount_stop_umount_race";
    if !require_fuse_mount(name) {
        return;
    }
    let dir = TempDir::new(name).unwrap();
    let image = dir.join("u.img");
    oleo_mkfs(OLEO, &image, 256);
    let mp = dir.subdir("mnt").unwrap();
    let kmp = dir.subdir("kernel").unwrap();
    let started = Instant::now();
    let n = rounds();
    for i in 0..n {
        let out = Command::new(OLEO)
            .args(["mount", "-o", "rw,commit=300"])
            .arg(&image)
            .arg(&mp)
            .output()
            .unwrap();
        assert!(out.status.success(), "round {i}: {out:?}");
        let data = format!("round {i}").repeat(1000);
        std::fs::write(mp.join(format!("f{i}")), &data).unwrap();
        std::fs::remove_file(mp.join(format!("f{}", i.wrapping_sub(2)))).ok();
        run(Command::new("umount").arg(&mp)).unwrap();
        // At once: the open waits for the server's final commit.
        let check = Command::new("btrfs")
            .args(["check", "--readonly"])
            .arg(&image)
            .output()
            .unwrap();
        assert!(
            check.status.success(),
            "round {i}: btrfs check right after umount: {}{}",
            String::from_utf8_lossy(&check.stdout),
            String::from_utf8_lossy(&check.stderr)
        );
        let k = KernelMount::mount(&image, &kmp, &["rw"]).unwrap();
        let got = std::fs::read_to_string(kmp.join(format!("f{i}"))).unwrap_or_default();
        assert!(
            got == data,
            "round {i}: the kernel sees f{i} as {} bytes",
            got.len()
        );
        k.unmount().unwrap();
    }
    eprintln!("{n} rounds in {:?}", started.elapsed());
}

/// Runs `cmd`: (succeeded, its output).
fn attempt(cmd: &mut Command) -> (bool, String) {
    let out = cmd.output().unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

/// Loop devices over `image`, from losetup.
fn loops_over(image: &Path) -> Vec<PathBuf> {
    let out = Command::new("losetup")
        .arg("-j")
        .arg(image)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once(':').map(|(d, _)| PathBuf::from(d)))
        .collect()
}

#[test]
fn nobody_else_opens_a_served_image_for_writing() {
    let name = "mount_stop_guard";
    if !require_fuse_mount(name) {
        return;
    }
    let dir = TempDir::new(name).unwrap();
    let image = dir.join("g.img");
    oleo_mkfs(OLEO, &image, 256);
    let (mp, kmp) = (dir.subdir("mnt").unwrap(), dir.subdir("kernel").unwrap());
    run(Command::new(OLEO)
        .args(["mount", "-o", "rw"])
        .arg(&image)
        .arg(&mp))
    .unwrap();
    std::fs::write(mp.join("mine"), b"oleo's").unwrap();
    let (ok, text) = attempt(Command::new("losetup").args(["-f", "--show"]).arg(&image));
    assert!(!ok && loops_over(&image).is_empty(), "losetup: {text}");
    let (ok, text) = attempt(
        Command::new("mount")
            .args(["-o", "loop"])
            .arg(&image)
            .arg(&kmp),
    );
    assert!(!ok && !is_mounted(&kmp), "mount -o loop: {text}");
    let e = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&image)
        .unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EPERM), "a second O_RDWR: {e}");
    // Reading stays allowed (as for any mounted filesystem's device).
    std::fs::File::open(&image).unwrap();
    std::fs::write(mp.join("after"), b"still writing").unwrap();
    run(Command::new("umount").arg(&mp)).unwrap();
    let k = KernelMount::mount(&image, &kmp, &["rw"]).unwrap();
    assert_eq!(std::fs::read(kmp.join("mine")).unwrap(), b"oleo's");
    assert_eq!(std::fs::read(kmp.join("after")).unwrap(), b"still writing");
    k.unmount().unwrap();
    assert_btrfs_check(&image, "after the refused openers");
}

/// Without fanotify (as without CAP_SYS_ADMIN) a loop device can be attached to the image;
/// oleo notices it before its next commit, writes nothing more and says why.
#[test]
fn without_fanotify_a_loop_device_turns_the_mount_read_only() {
    let name = "mount_stop_loop_detected";
    if !require_fuse_mount(name) {
        return;
    }
    let dir = TempDir::new(name).unwrap();
    let image = dir.join("l.img");
    oleo_mkfs(OLEO, &image, 256);
    let mp = dir.subdir("mnt").unwrap();
    let log = dir.join("oleo.log");
    run(Command::new(OLEO)
        .env("OLEO_NO_FANOTIFY", "1")
        .args(["mount", "-o"])
        .arg(format!("rw,commit=300,log={}", log.display()))
        .arg(&image)
        .arg(&mp))
    .unwrap();
    std::fs::write(mp.join("before"), b"committed").unwrap();
    btrfs_sync(&mp).unwrap();
    let generation = superblock_generation(&image).unwrap();
    let lo = LoopDevice::attach(&image, true).unwrap();
    std::fs::write(mp.join("after"), b"never committed").unwrap();
    let e = btrfs_sync(&mp).expect_err("a commit beside a loop device");
    assert!(
        matches!(
            e.raw_os_error(),
            Some(libc::EROFS | libc::EBUSY | libc::EIO)
        ),
        "{e}"
    );
    let e = std::fs::write(mp.join("later"), b"x").expect_err("read-only now");
    assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{e}");
    assert_eq!(
        superblock_generation(&image).unwrap(),
        generation,
        "nothing committed beside the loop device"
    );
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("was attached to") && text.contains(&lo.path().display().to_string()),
        "the log says why: {text}"
    );
    drop(lo);
    run(Command::new("umount").arg(&mp)).unwrap();
    let until = Instant::now() + Duration::from_secs(30);
    while server_pid(&mp).is_some() {
        assert!(Instant::now() < until, "the server ends");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_files(
        &image,
        &mp,
        &[("before".to_string(), b"committed".to_vec())],
        "after the loop device",
    );
}

/// A mount point left by an oleo that died: `oleo mount` says what happened and what to
/// run, or takes it away itself when it served the same image.
#[test]
fn a_dead_mount_point_is_explained_or_taken_away() {
    let name = "mount_stop_dead";
    if !require_fuse_mount(name) {
        return;
    }
    let dir = TempDir::new(name).unwrap();
    let (a, b) = (dir.join("a.img"), dir.join("b.img"));
    oleo_mkfs(OLEO, &a, 256);
    oleo_mkfs(OLEO, &b, 256);
    let mp = dir.subdir("mnt").unwrap();
    run(Command::new(OLEO).arg("mount").arg(&a).arg(&mp)).unwrap();
    std::fs::write(mp.join("kept"), b"fsynced").unwrap();
    std::fs::File::open(mp.join("kept"))
        .unwrap()
        .sync_all()
        .unwrap();
    let pid = server_pid(&mp).unwrap();
    // SAFETY: plain kill.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let until = Instant::now() + Duration::from_secs(10);
    while server_pid(&mp).is_some() {
        assert!(Instant::now() < until, "the server dies");
        std::thread::sleep(Duration::from_millis(10));
    }
    // ECANCELED: a request the dying server's io_uring queue dropped; the next says so.
    let dead = |e: &std::io::Error| {
        matches!(
            e.raw_os_error(),
            Some(libc::ENOTCONN | libc::ECONNABORTED | libc::ECANCELED)
        )
    };
    let e = std::fs::metadata(&mp).unwrap_err();
    assert!(dead(&e), "{e}");
    let (ok, text) = attempt(Command::new(OLEO).arg("mount").arg(&b).arg(&mp));
    assert!(!ok, "mounted over a dead mount: {text}");
    assert!(
        text.contains("server is gone")
            && (text.contains("not connected")
                || text.contains("connection abort")
                || text.contains("canceled"))
            && text.contains(&format!("umount {}", mp.display())),
        "{text}"
    );
    // Its own image's dead mount: taken away, and mounted again.
    let (ok, text) = attempt(Command::new(OLEO).arg("mount").arg(&a).arg(&mp));
    assert!(ok, "{text}");
    assert_eq!(std::fs::read(mp.join("kept")).unwrap(), b"fsynced");
    run(Command::new("umount").arg(&mp)).unwrap();
    assert!(!is_mounted(&mp));
}

/// Errors that name the real cause: a remount by a user needs root; and `oleo extents` of
/// an image that oleo has mounted answers through the mount.
#[test]
fn errors_point_the_right_way() {
    let name = "mount_stop_errors";
    if !require_fuse_mount(name) {
        return;
    }
    let dir = TempDir::new(name).unwrap();
    let image = dir.join("e.img");
    oleo_mkfs(OLEO, &image, 256);
    let mp = dir.subdir("mnt").unwrap();
    run(Command::new(OLEO).arg("mount").arg(&image).arg(&mp)).unwrap();
    std::fs::write(mp.join("f"), b"x").unwrap();
    let (ok, text) = attempt(
        Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", OLEO])
            .args(["mount", "-o", "remount,ro"])
            .arg(&image)
            .arg(&mp),
    );
    assert!(!ok, "{text}");
    assert!(
        text.contains("needs root") && !text.contains("open for writing"),
        "{text}"
    );
    // `oleo extents` of the mounted image answers through the mount.
    let (ok, text) = attempt(Command::new(OLEO).arg("extents").arg(&image).arg("f"));
    assert!(ok && text.contains("inline"), "{text}");
    run(Command::new("umount").arg(&mp)).unwrap();
}
