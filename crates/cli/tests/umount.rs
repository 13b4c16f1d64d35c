//! `oleo umount` returns only once the server has written its final commit and released the
//! image, so `oleo umount MNT && cp IMAGE COPY` copies every write, as root and as a user
//! without privileges; it takes several mount points, `-l` waits for the last open file, it
//! exits non-zero (saying why) when the final commit fails, and it leaves other mounts alone.
//!
//! Rounds per user: `OLEO_UMOUNT_ROUNDS` (default 100, about 30 s).

use oleo::{Filesystem, OpenOptions};
use oleo_testkit::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

const OLEO: &str = env!("CARGO_BIN_EXE_oleo");
const NOBODY: u32 = 65534;

fn rounds() -> usize {
    std::env::var("OLEO_UMOUNT_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100)
}

fn ok(out: Output, what: &str) -> Output {
    assert!(
        out.status.success(),
        "{what}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Distinct contents for round `i`: a size and bytes no other round has.
fn contents(i: usize) -> Vec<u8> {
    let len = 1000 + (i * 7919) % 300_000;
    let mut x = (i as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let mut v: Vec<u8> = (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect();
    v[..8].copy_from_slice(&(i as u64).to_le_bytes());
    v
}

/// Every file `f0..f{n-1}` in the copy, read through the library (no mount: quick).
fn assert_copy_holds(copy: &Path, n: usize, when: &str) {
    let fs = Filesystem::open(copy, OpenOptions::default())
        .unwrap_or_else(|e| panic!("{when}: open the copy: {e}"));
    let root = fs.root();
    for i in 0..n {
        let name = format!("f{i}");
        let id = fs
            .lookup(root, name.as_bytes())
            .unwrap_or_else(|e| panic!("{when}: {name} missing from the copy: {e}"));
        let size = fs.getattr(id).unwrap().size;
        let got = fs.read(id, 0, size as u32).unwrap();
        assert!(got == contents(i), "{when}: {name} differs in the copy");
    }
}

/// Mount, write `f{i}` through the mount (no fsync), `oleo umount MNT && cp IMAGE COPY`,
/// then check the copy: every round's file, and `btrfs check`. `wrap` runs a command as the
/// user under test.
fn umount_then_copy(dir: &Path, wrap: &dyn Fn(&str) -> Command, label: &str) {
    let image = dir.join("u.img");
    let mp = dir.join("mnt");
    let copy = dir.join("copy.img");
    let (img, mnt, cpy) = (
        image.to_str().unwrap(),
        mp.to_str().unwrap(),
        copy.to_str().unwrap(),
    );
    ok(
        wrap(&format!(
            "mkdir -p {mnt} && {OLEO} mkfs -q --size 128M {img}"
        ))
        .output()
        .unwrap(),
        "mkfs",
    );
    let n = rounds();
    let t0 = Instant::now();
    for i in 0..n {
        let when = format!("{label}, round {i}");
        // commit=300: only the final commit writes the round's file.
        ok(
            wrap(&format!("{OLEO} mount -o commit=300 {img} {mnt}"))
                .output()
                .unwrap(),
            &when,
        );
        let data = dir.join("data");
        std::fs::write(&data, contents(i)).unwrap();
        ok(
            wrap(&format!(
                "cat {data} > {mnt}/f{i} && {OLEO} umount {mnt} && cp --sparse=always {img} {cpy}",
                data = data.display()
            ))
            .output()
            .unwrap(),
            &when,
        );
        assert!(!is_mounted(&mp), "{when}: still mounted");
        assert_copy_holds(&copy, i + 1, &when);
        assert_btrfs_check(&copy, &when);
    }
    eprintln!("{label}: {n} rounds in {:?}", t0.elapsed());
}

#[test]
fn umount_then_copy_holds_every_write_as_root() {
    let name = "umount_root";
    if !require_fuse_mount(name) {
        return;
    }
    let dir = TempDir::new(name).unwrap();
    let wrap = |script: &str| {
        let mut c = Command::new("sh");
        c.arg("-c").arg(script);
        c
    };
    umount_then_copy(dir.path(), &wrap, "root");
}

#[test]
fn umount_then_copy_holds_every_write_as_a_user() {
    let name = "umount_user";
    if !require_fuse_mount(name) {
        return;
    }
    let dir = TempDir::new(name).unwrap();
    let home = dir.subdir("home").unwrap();
    ok(
        Command::new("chown")
            .arg(format!("{NOBODY}:{NOBODY}"))
            .arg(&home)
            .output()
            .unwrap(),
        "chown",
    );
    let h = home.clone();
    let wrap = move |script: &str| {
        let mut c = Command::new("setpriv");
        c.arg(format!("--reuid={NOBODY}"))
            .arg(format!("--regid={NOBODY}"))
            .arg("--clear-groups")
            .env("HOME", &h)
            .args(["sh", "-c", script]);
        c
    };
    umount_then_copy(&home, &wrap, "nobody");
}

fn oleo(args: &[&str], paths: &[&Path]) -> Output {
    Command::new(OLEO).args(args).args(paths).output().unwrap()
}

#[test]
fn several_mount_points_and_lazy() {
    let name = "umount_several";
    if !require_fuse_mount(name) {
        return;
    }
    let dir = TempDir::new(name).unwrap();
    let mut mounts: Vec<(PathBuf, PathBuf)> = Vec::new();
    for k in 0..3 {
        let image = dir.join(format!("{k}.img"));
        oleo_mkfs(OLEO, &image, 128);
        let mp = dir.subdir(&format!("mnt{k}")).unwrap();
        ok(
            oleo(&["mount", "-o", "commit=300"], &[&image, &mp]),
            "mount",
        );
        std::fs::write(mp.join("f0"), contents(k)).unwrap();
        mounts.push((image, mp));
    }
    // Two at once, one named by its image.
    ok(
        oleo(&["umount"], &[&mounts[0].1, &mounts[1].0]),
        "umount two",
    );
    for (k, (image, mp)) in mounts.iter().take(2).enumerate() {
        assert!(!is_mounted(mp));
        let copy = dir.join("copy.img");
        std::fs::copy(image, &copy).unwrap();
        let fs = Filesystem::open(&copy, OpenOptions::default()).unwrap();
        let id = fs.lookup(fs.root(), b"f0").unwrap();
        assert_eq!(fs.read(id, 0, 1 << 20).unwrap(), contents(k));
    }

    // Busy: refused without -l; with -l it returns once the open file is closed.
    let (image, mp) = &mounts[2];
    let open = std::fs::File::open(mp.join("f0")).unwrap();
    let out = oleo(&["umount"], &[mp]);
    assert!(!out.status.success(), "a busy mount was unmounted");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("busy"), "{err}");
    let t0 = Instant::now();
    let closer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(1500));
        drop(open);
    });
    ok(oleo(&["umount", "-l"], &[mp]), "umount -l");
    assert!(
        t0.elapsed() >= Duration::from_millis(1400),
        "umount -l returned before the open file was closed"
    );
    closer.join().unwrap();
    // Released: a writer may open it now.
    Filesystem::open_rw(image, OpenOptions::default()).unwrap();
    assert_btrfs_check(image, "umount -l");

    // Not an oleo mount, not mounted: refused, and nothing is unmounted.
    let out = oleo(&["umount"], &[Path::new("/proc")]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not an oleo mount"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = oleo(&["umount"], &[&mounts[0].1]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not mounted"));
}

#[test]
fn a_failed_final_commit_fails_umount_and_says_why() {
    let name = "umount_failed_commit";
    if !require_fuse_mount(name) {
        return;
    }
    let dir = TempDir::new(name).unwrap();
    let image = dir.join("ro.img");
    oleo_mkfs(OLEO, &image, 128);
    let mp = dir.subdir("mnt").unwrap();
    let dev = LoopDevice::attach(&image, false).unwrap();
    let log = dir.join("oleo.log");
    ok(
        oleo(
            &["mount", "-o", &format!("commit=300,log={}", log.display())],
            &[dev.path(), &mp],
        ),
        "mount",
    );
    std::fs::write(mp.join("lost"), b"never committed").unwrap();
    // Into oleo, not yet committed.
    oleo_testkit::mount::syncfs(&mp).unwrap();
    // The device turns read-only under the server: its final commit cannot be written.
    ok(
        Command::new("blockdev")
            .arg("--setro")
            .arg(dev.path())
            .output()
            .unwrap(),
        "blockdev --setro",
    );
    let out = oleo(&["umount"], &[&mp]);
    let _ = Command::new("blockdev")
        .arg("--setrw")
        .arg(dev.path())
        .status();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("final commit"), "{err}");
    assert!(!is_mounted(&mp));
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("final commit at unmount failed"), "{text}");
    drop(dev);
    // The image keeps its last commit: clean, without the file.
    assert_btrfs_check(&image, "a failed final commit");
}

/// A mount made the way mount(8) makes it (its helper `mount.fuse.oleo SOURCE TARGET -o
/// OPTIONS`, here by a link of that name, not installed in /sbin) is unmounted and waited
/// for the same way.
#[test]
fn a_mount_by_the_mount8_helper() {
    let name = "umount_mount8";
    if !require_fuse_mount(name) {
        return;
    }
    let dir = TempDir::new(name).unwrap();
    let image = dir.join("h.img");
    oleo_mkfs(OLEO, &image, 128);
    let mp = dir.subdir("mnt").unwrap();
    let helper = dir.join("mount.fuse.oleo");
    std::os::unix::fs::symlink(OLEO, &helper).unwrap();
    ok(
        Command::new(&helper)
            .arg(&image)
            .arg(&mp)
            .args(["-o", "rw,commit=300"])
            .output()
            .unwrap(),
        "mount.fuse.oleo",
    );
    std::fs::write(mp.join("f0"), contents(7)).unwrap();
    ok(oleo(&["umount"], &[&mp]), "oleo umount");
    let copy = dir.join("copy.img");
    std::fs::copy(&image, &copy).unwrap();
    let fs = Filesystem::open(&copy, OpenOptions::default()).unwrap();
    let id = fs.lookup(fs.root(), b"f0").unwrap();
    assert_eq!(fs.read(id, 0, 1 << 20).unwrap(), contents(7));
    drop(fs);
    assert_btrfs_check(&copy, "a mount(8) helper mount");
}
