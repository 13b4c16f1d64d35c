//! oleo at home in mount(8) and without root: the type is `fuse.oleo` for every mount,
//! `mount -t fuse.oleo`, fstab lines and `mount -o remount,ro|rw` work through the
//! /sbin/mount.fuse.oleo helper, FUSE's standard options are accepted, an unprivileged user
//! mounts through fusermount3, and a background mount's log lands where it says.

use oleo::{Filesystem, OpenOptions};
use oleo_testkit::*;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const OLEO: &str = env!("CARGO_BIN_EXE_oleo");
const NOBODY: u32 = 65534;

/// The type and options /proc/mounts gives the mount at `mp`.
fn proc_mount(mp: &Path) -> Option<(String, String, String)> {
    let want = std::fs::canonicalize(mp).ok()?;
    std::fs::read_to_string("/proc/mounts")
        .unwrap()
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            (Path::new(f[1]) == want).then(|| (f[0].into(), f[2].into(), f[3].into()))
        })
}

/// Waits until the daemon serving `image` has exited: its lock on the image is gone.
fn wait_released(image: &Path) {
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        match Filesystem::open_rw(image, OpenOptions::default()) {
            Ok(_) => return,
            Err(oleo::Error::Busy(m)) if Instant::now() < until => {
                let _ = m;
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => panic!("{}: {e}", image.display()),
        }
    }
}

/// Puts /sbin/mount.fuse.oleo in place (pointing at this build) for as long as it lives.
struct Helper(bool);

impl Helper {
    fn install() -> Helper {
        let helper = Path::new("/sbin/mount.fuse.oleo");
        let ours = std::fs::symlink_metadata(helper).is_err();
        if ours {
            std::os::unix::fs::symlink(OLEO, helper).unwrap();
        }
        Helper(ours)
    }
}

impl Drop for Helper {
    fn drop(&mut self) {
        if self.0 {
            let _ = std::fs::remove_file("/sbin/mount.fuse.oleo");
        }
    }
}

fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn mount8_remount_and_fstab() {
    let name = "mount_home_mount8";
    if !require_fuse_mount(name) {
        return;
    }
    let _helper = Helper::install();
    let dir = TempDir::new(name).unwrap();
    let image = dir.join("home.img");
    oleo_mkfs(OLEO, &image, 256);
    let mp = dir.subdir("mnt").unwrap();
    let log = dir.join("oleo.log");
    let opts = format!(
        "allow_other,default_permissions,commit=300,log={}",
        log.display()
    );
    run(Command::new("mount")
        .args(["-t", "fuse.oleo", "-o", &opts])
        .arg(&image)
        .arg(&mp));
    let (source, fstype, options) = proc_mount(&mp).expect("mounted");
    assert_eq!(
        (source.as_str(), fstype.as_str()),
        (&*image.to_string_lossy(), "fuse.oleo")
    );
    assert!(options.contains("allow_other"), "{options}");
    let findmnt = Command::new("findmnt")
        .args(["-n", "-t", "fuse.oleo", "-o", "TARGET"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&findmnt.stdout).contains(&*mp.to_string_lossy()));

    std::fs::write(mp.join("before"), b"written rw").unwrap();
    let generation = superblock_generation(&image).unwrap();
    run(Command::new("mount").args(["-o", "remount,ro"]).arg(&mp));
    // Turning read-only commits at once (commit=300 would take five minutes).
    let t0 = Instant::now();
    while superblock_generation(&image).unwrap() == generation {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "no commit after remount,ro"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let err = std::fs::write(mp.join("during"), b"x").unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EROFS), "{err}");
    assert_eq!(std::fs::read(mp.join("before")).unwrap(), b"written rw");
    run(Command::new("mount").args(["-o", "remount,rw"]).arg(&mp));
    std::fs::write(mp.join("after"), b"written again").unwrap();
    run(Command::new("umount").arg(&mp));
    wait_released(&image);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("serving") && text.contains("INFO"), "{text}");

    // An fstab line, mounted by its mount point.
    let fstab = dir.join("fstab");
    std::fs::write(
        &fstab,
        format!(
            "{} {} fuse.oleo defaults,noauto,allow_other,default_permissions,x-systemd.automount 0 0\n",
            image.display(),
            mp.display()
        ),
    )
    .unwrap();
    run(Command::new("mount").arg("-T").arg(&fstab).arg(&mp));
    assert_eq!(std::fs::read(mp.join("after")).unwrap(), b"written again");
    assert!(!mp.join("during").exists());
    run(Command::new("umount").arg(&mp));
    wait_released(&image);
    assert_btrfs_check(&image, "mount(8) mounts");
}

#[test]
fn a_background_mount_without_syslog_logs_to_a_file_it_names() {
    let name = "mount_home_log";
    if !require_fuse_mount(name) {
        return;
    }
    let dir = TempDir::new(name).unwrap();
    let image = dir.join("logged.img");
    oleo_mkfs(OLEO, &image, 256);
    let mp = dir.subdir("mnt").unwrap();
    let state = dir.subdir("state").unwrap();
    let out = Command::new(OLEO)
        .env("OLEO_SYSLOG_SOCKET", dir.join("no-syslog-here"))
        .env("XDG_STATE_HOME", &state)
        .args(["mount", "-v", "-o", "auto_unmount,fsname=logged-fs"])
        .arg(&image)
        .arg(&mp)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{said}");
    // Root's default is /var/log/oleo; what matters is that -v tells the terminal.
    let (source, _, _) = proc_mount(&mp).expect("mounted");
    assert_eq!(source, "logged-fs");
    let path = said
        .lines()
        .find_map(|l| l.strip_prefix("oleo: logging to "))
        .unwrap_or_else(|| panic!("the mount did not say where it logs: {said}"));
    run(Command::new("umount").arg(&mp));
    wait_released(&image);
    let text = std::fs::read_to_string(path).unwrap();
    assert!(text.contains("serving"), "{path}: {text}");
}

#[test]
fn an_unprivileged_user_mounts_writes_and_unmounts() {
    let name = "mount_home_rootless";
    if !require_fuse_mount(name) {
        return;
    }
    let dir = TempDir::new(name).unwrap();
    let home = dir.subdir("home").unwrap();
    run(Command::new("chown")
        .arg(format!("{NOBODY}:{NOBODY}"))
        .arg(&home));
    let image = home.join("user.img");
    let mp = home.join("mnt");
    let as_nobody = |args: &[&str]| {
        let mut c = Command::new("setpriv");
        c.arg(format!("--reuid={NOBODY}"))
            .arg(format!("--regid={NOBODY}"))
            .arg("--clear-groups")
            .env("HOME", &home)
            .args(args);
        c
    };
    let (img, mnt) = (image.to_str().unwrap(), mp.to_str().unwrap());
    run(&mut as_nobody(&["mkdir", mnt]));
    run(&mut as_nobody(&[OLEO, "mkfs", "-q", "--size", "256M", img]));
    run(&mut as_nobody(&[OLEO, "mount", img, mnt]));
    let (_, fstype, options) = proc_mount(&mp).expect("mounted");
    assert_eq!(fstype, "fuse.oleo");
    assert!(options.contains(&format!("user_id={NOBODY}")), "{options}");
    let file = format!("{mnt}/mine");
    run(&mut as_nobody(&[
        "sh",
        "-c",
        &format!("printf 'made without root' > {file} && sync {file}"),
    ]));
    run(&mut as_nobody(&["fusermount3", "-u", mnt]));
    wait_released(&image);
    assert_btrfs_check(&image, "a rootless mount");
    let kmp = dir.subdir("kernel").unwrap();
    let k = KernelMount::mount(&image, &kmp, &["ro"]).unwrap();
    assert_eq!(
        std::fs::read(kmp.join("mine")).unwrap(),
        b"made without root"
    );
    let meta = std::fs::metadata(kmp.join("mine")).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert_eq!((meta.uid(), meta.gid()), (NOBODY, NOBODY));
    k.unmount().unwrap();
}

#[test]
fn an_unusable_fuse_says_why() {
    let name = "mount_home_refusals";
    if !require_fuse_mount(name) {
        return;
    }
    let dir = TempDir::new(name).unwrap();
    let image: PathBuf = dir.join("r.img");
    oleo_mkfs(OLEO, &image, 256);
    run(Command::new("chown")
        .arg(format!("{NOBODY}:{NOBODY}"))
        .arg(&image));
    // A mount point the user may not write: fusermount3 refuses, and we say what to do.
    let mp = dir.subdir("root-owned").unwrap();
    let out = Command::new("setpriv")
        .args([
            &format!("--reuid={NOBODY}"),
            &format!("--regid={NOBODY}"),
            "--clear-groups",
            OLEO,
            "mount",
        ])
        .env("HOME", dir.path())
        .arg(&image)
        .arg(&mp)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "mounted on a directory of root's");
    assert!(
        err.contains("fusermount3") && err.contains("directory you own"),
        "{err}"
    );
    assert!(
        !err.contains("os error 13)\n") || err.contains("fusermount3"),
        "{err}"
    );
}

#[test]
fn only_the_serving_process_writes_the_image() {
    let name = "mount_home_one_writer";
    if !require_fuse_mount(name) {
        return;
    }
    let dir = TempDir::new(name).unwrap();
    let image = dir.join("one.img");
    oleo_mkfs(OLEO, &image, 256);
    let mp = dir.subdir("mnt").unwrap();
    let generation = superblock_generation(&image).unwrap();
    // The mount forks its server; the process that returns must leave the image alone
    // (its copy of the open filesystem is the server's, never committed twice).
    run(Command::new(OLEO)
        .args(["mount", "-o", "commit=300"])
        .arg(&image)
        .arg(&mp));
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(superblock_generation(&image).unwrap(), generation);
    run(Command::new("umount").arg(&mp));
    wait_released(&image);
    assert_btrfs_check(&image, "a background mount");
}
