//! The same filesystem mounted twice (fstests generic/732), as kernel btrfs allows: a
//! second `oleo mount` of an image a live oleo mount serves (or `mount -t fuse.oleo`, through
//! the mount helper) is a bind mount of the first, one FUSE connection and one server.
//!
//! - generic/732's renames across the two mounts; unmounting one leaves the other working
//!   and its server running; unmounting the last ends the server, `oleo umount` waiting for
//!   it; `btrfs check` is clean and the kernel sees the final tree;
//! - a second mount's per-mount flags are its own (nosuid on the second only);
//! - what one FUSE connection cannot have twice is refused, naming the option and the first
//!   mount point, and nothing changes: filesystem options, atime rules, rw over ro, a
//!   subvolume outside the mounted one, a user's second mount;
//! - subvol= and subvolid= bind the subvolume's directory of the first mount;
//! - SIGTERM to the server unmounts every mount of it.

use oleo_testkit::*;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

const OLEO: &str = env!("CARGO_BIN_EXE_oleo");
const NOBODY: u32 = 65534;

fn oleo(args: &[&str]) -> Output {
    Command::new(OLEO).args(args).output().unwrap()
}

fn ok(args: &[&str]) -> Output {
    let out = oleo(args);
    assert!(
        out.status.success(),
        "oleo {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A refusal: fails, and says each of `words`.
fn refused(out: Output, words: &[&str]) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "not refused: {err}");
    for w in words {
        assert!(err.contains(w), "{w:?} missing from: {err}");
    }
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// mount(8)'s way: the helper `mount.fuse.oleo SOURCE TARGET -o OPTIONS` (a link to this
/// build in `dir`; /sbin's is left alone, other runs use it).
fn helper_mount(dir: &Path, image: &Path, mp: &Path, opts: &str, verbose: bool) -> Output {
    let helper = dir.join("mount.fuse.oleo");
    if std::fs::symlink_metadata(&helper).is_err() {
        std::os::unix::fs::symlink(OLEO, &helper).unwrap();
    }
    let mut c = Command::new(&helper);
    c.arg(image).arg(mp).args(["-o", opts]);
    if verbose {
        c.arg("-v");
    }
    c.output().unwrap()
}

/// Unmounts whatever is left at these mount points when a test fails.
struct Cleanup(Vec<PathBuf>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        for mp in self.0.iter().rev() {
            while is_mounted(mp) {
                let _ = Command::new("umount").arg("-l").arg(mp).status();
            }
        }
    }
}

/// The mounts here whose device is `mp`'s (one FUSE connection).
fn mounts_of_conn(mp: &Path) -> Vec<PathBuf> {
    let dev = mount_at(mp).expect("mounted").dev;
    oleo_testkit::mount::mountinfo()
        .into_iter()
        .filter(|m| m.dev == dev)
        .map(|m| m.mountpoint)
        .collect()
}

/// The oleo process whose command line names `mp`.
fn server_pid(mp: &Path) -> Option<i32> {
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid = e.file_name().to_string_lossy().parse::<i32>().ok()?;
        let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
        let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
        let names = args
            .iter()
            .any(|a| std::str::from_utf8(a).is_ok_and(|a| Path::new(a) == mp));
        let is_mount = args.iter().any(|a| *a == b"mount");
        (names && is_mount && alive(pid)).then_some(pid)
    })
}

fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|st| {
        st.rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z'))
    })
}

fn wait_gone(pid: i32, limit: Duration) -> bool {
    let until = Instant::now() + limit;
    while alive(pid) {
        if Instant::now() > until {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

/// The per-mount options mountinfo shows for `mp` (the last mount there).
fn mount_options(mp: &Path) -> String {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            (Path::new(f[4]) == mp).then(|| f[5].to_string())
        })
        .next_back()
        .unwrap_or_else(|| panic!("{} not mounted", mp.display()))
}

fn has_flag(mp: &Path, flag: &str) -> bool {
    mount_options(mp).split(',').any(|o| o == flag)
}

/// The id of the subvolume `path` is in, asked of the oleo serving it.
fn subvol_id(path: &Path) -> u64 {
    use oleo_fuse::subvol_ioctl as cmd;
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(path).unwrap();
    let mut b = vec![0u8; cmd::SUBVOL_OF_SIZE];
    // SAFETY: the buffer is as long as the size the command encodes.
    let r = unsafe { libc::ioctl(f.as_raw_fd(), cmd::SUBVOL_OF as _, b.as_mut_ptr()) };
    assert_eq!(r, 0, "SUBVOL_OF {}", path.display());
    cmd::SubvolOf::parse(&b).id
}

#[test]
fn generic_732_renames_across_two_mounts_of_one_filesystem() {
    let name = "mount_twice_732";
    if !require_fuse_mount(name) {
        return;
    }
    let dir = TempDir::new(name).unwrap();
    let image = dir.join("twice.img");
    oleo_mkfs(OLEO, &image, 256);
    let m1 = std::fs::canonicalize(dir.subdir("m1").unwrap()).unwrap();
    let m2 = std::fs::canonicalize(dir.subdir("m2").unwrap()).unwrap();
    let _cleanup = Cleanup(vec![m1.clone(), m2.clone()]);

    ok(&["mount", s(&image), s(&m1)]);
    let pid = server_pid(&m1).expect("the server of the first mount");
    // The second through mount(8)'s helper convention, as `mount -t fuse.oleo` runs it.
    let out = helper_mount(dir.path(), &image, &m2, "rw", true);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "second mount: {said}");
    assert!(
        said.contains(&format!(
            "is already mounted at {}: {} is a bind mount of it",
            m1.display(),
            m2.display()
        )),
        "-v: {said}"
    );
    assert_eq!(mounts_of_conn(&m1), vec![m1.clone(), m2.clone()]);

    // generic/732: names made and moved through one mount, read and moved back through
    // the other.
    std::fs::create_dir(m1.join("A")).unwrap();
    std::fs::create_dir(m1.join("B")).unwrap();
    std::fs::write(m1.join("A/f"), b"through the first\n").unwrap();
    std::fs::rename(m1.join("A/f"), m1.join("B/f")).unwrap();
    assert_eq!(
        std::fs::read(m2.join("B/f")).unwrap(),
        b"through the first\n"
    );
    std::fs::rename(m2.join("B/f"), m2.join("A/f")).unwrap();
    assert!(m1.join("A/f").exists() && !m1.join("B/f").exists());
    assert_eq!(
        std::fs::read(m1.join("A/f")).unwrap(),
        b"through the first\n"
    );

    // The first unmounted: no wait for a server that goes on; the second still serves.
    let t = Instant::now();
    ok(&["umount", s(&m1)]);
    assert!(t.elapsed() < Duration::from_secs(5), "umount waited");
    assert!(!is_mounted(&m1));
    assert!(alive(pid), "the server ended with a mount of it left");
    std::fs::write(m2.join("B/g"), b"after the first went\n").unwrap();
    assert!(m2.join("A/f").exists());

    // The last unmounted: the server ends, and `oleo umount` waited for it.
    ok(&["umount", s(&m2)]);
    assert!(!is_mounted(&m2));
    assert!(
        wait_gone(pid, Duration::from_millis(500)),
        "the server outlived its last mount"
    );
    assert_btrfs_check(&image, "after two mounts of one filesystem");
    let k = KernelMount::mount(&image, &dir.join("kernel"), &["ro"]).unwrap();
    assert_eq!(
        std::fs::read(k.path().join("A/f")).unwrap(),
        b"through the first\n"
    );
    assert!(!k.path().join("B/f").exists());
    assert_eq!(
        std::fs::read(k.path().join("B/g")).unwrap(),
        b"after the first went\n"
    );
    k.unmount().unwrap();
}

#[test]
fn a_second_mounts_flags_are_its_own() {
    let name = "mount_twice_nosuid";
    if !require_fuse_mount(name) {
        return;
    }
    let dir = TempDir::new(name).unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let image = dir.join("flags.img");
    oleo_mkfs(OLEO, &image, 256);
    let m1 = std::fs::canonicalize(dir.subdir("m1").unwrap()).unwrap();
    let m2 = std::fs::canonicalize(dir.subdir("m2").unwrap()).unwrap();
    let m3 = std::fs::canonicalize(dir.subdir("m3").unwrap()).unwrap();
    let _cleanup = Cleanup(vec![m1.clone(), m2.clone(), m3.clone()]);
    ok(&["mount", s(&image), s(&m1)]);
    ok(&["mount", "-o", "nosuid,noexec", s(&image), s(&m2)]);
    ok(&["mount", "-o", "ro", s(&image), s(&m3)]);
    assert!(!has_flag(&m1, "nosuid") && !has_flag(&m1, "noexec"));
    assert!(has_flag(&m2, "nosuid") && has_flag(&m2, "noexec"));
    assert!(has_flag(&m3, "ro") && has_flag(&m1, "rw"));

    // A setuid-root copy of id(1), run by nobody through each mount.
    let id = m1.join("id");
    std::fs::copy("/usr/bin/id", &id).unwrap();
    std::fs::set_permissions(&id, std::fs::Permissions::from_mode(0o4755)).unwrap();
    assert_eq!(std::fs::metadata(&id).unwrap().uid(), 0);
    let euid = |p: &Path| {
        let out = Command::new("setpriv")
            .arg(format!("--reuid={NOBODY}"))
            .arg(format!("--regid={NOBODY}"))
            .arg("--clear-groups")
            .arg(p)
            .arg("-u")
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).trim().to_string(),
        )
    };
    assert_eq!(euid(&id), (true, "0".to_string()), "suid on the first");
    // noexec on the second: not run at all.
    let (ran, _) = euid(&m2.join("id"));
    assert!(!ran, "ran on a noexec mount");
    ok(&["mount", "-o", "remount,exec", s(&image), s(&m2)]);
    assert!(has_flag(&m2, "nosuid") && !has_flag(&m2, "noexec"));
    assert!(!has_flag(&m1, "nosuid"));
    assert_eq!(
        euid(&m2.join("id")),
        (true, NOBODY.to_string()),
        "setuid honoured on the nosuid second mount"
    );
    assert_eq!(euid(&id), (true, "0".to_string()), "first mount changed");
    // ro is the third's alone.
    assert!(std::fs::write(m3.join("x"), b"x").is_err());
    std::fs::write(m1.join("x"), b"x").unwrap();
    assert_eq!(std::fs::read(m3.join("x")).unwrap(), b"x");

    let pid = server_pid(&m1).expect("server");
    ok(&["umount", s(&m3), s(&m1)]);
    assert!(alive(pid));
    ok(&["umount", s(&m2)]);
    assert!(wait_gone(pid, Duration::from_millis(500)));
    assert_btrfs_check(&image, "after three mounts");
}

#[test]
fn what_cannot_differ_is_refused_and_nothing_changes() {
    let name = "mount_twice_refused";
    if !require_fuse_mount(name) {
        return;
    }
    let dir = TempDir::new(name).unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let image = dir.join("refuse.img");
    oleo_mkfs(OLEO, &image, 256);
    let m1 = std::fs::canonicalize(dir.subdir("m1").unwrap()).unwrap();
    let m2 = std::fs::canonicalize(dir.subdir("m2").unwrap()).unwrap();
    let _cleanup = Cleanup(vec![m1.clone(), m2.clone()]);
    let (img, p1, p2) = (s(&image), s(&m1), s(&m2));
    ok(&["mount", "-o", "commit=10,noatime", img, p1]);
    let only_first = || {
        assert_eq!(mounts_of_conn(&m1), vec![m1.clone()]);
        assert!(!is_mounted(&m2));
    };
    let m1s = m1.display().to_string();
    refused(
        oleo(&["mount", "-o", "commit=20", img, p2]),
        &["commit=10", "commit=20", &m1s],
    );
    refused(
        oleo(&["mount", "-o", "compress=zstd", img, p2]),
        &["compress", &m1s],
    );
    refused(
        oleo(&["mount", "-o", "strictatime", img, p2]),
        &["strictatime", "noatime", &m1s],
    );
    refused(
        helper_mount(dir.path(), &image, &m2, "rw,sync", false),
        &["sync", &m1s],
    );
    only_first();
    // The same values are no difference; left out, the first's hold (noatime shown).
    ok(&["mount", "-o", "commit=10,noatime", img, p2]);
    assert!(has_flag(&m2, "noatime"));
    ok(&["umount", p2]);
    ok(&["mount", img, p2]);
    assert!(has_flag(&m2, "noatime"), "{}", mount_options(&m2));
    // Nor can a remount change the atime rules of one of them only; the others it can.
    refused(
        oleo(&["mount", "-o", "remount,strictatime", img, p2]),
        &["atime", &m1s],
    );
    assert!(has_flag(&m2, "noatime") && has_flag(&m1, "noatime"));
    ok(&["mount", "-o", "remount,nodev", img, p2]);
    assert!(has_flag(&m2, "nodev") && !has_flag(&m1, "nodev"));
    ok(&["umount", p2]);

    // rw over ro: refused until the first is read-write again; ro over it is fine.
    ok(&["mount", "-o", "remount,ro", img, p1]);
    refused(oleo(&["mount", img, p2]), &["remount", &m1s, "rw first"]);
    refused(
        helper_mount(dir.path(), &image, &m2, "rw", false),
        &["rw first", &m1s],
    );
    only_first();
    ok(&["mount", "-o", "ro", img, p2]);
    ok(&["umount", p2]);
    ok(&["mount", "-o", "remount,rw", img, p1]);

    // A user cannot bind: told where the image is mounted.
    let user_mp = dir.subdir("user").unwrap();
    std::os::unix::fs::chown(&user_mp, Some(NOBODY), Some(NOBODY)).unwrap();
    let out = Command::new("setpriv")
        .arg(format!("--reuid={NOBODY}"))
        .arg(format!("--regid={NOBODY}"))
        .arg("--clear-groups")
        .args([OLEO, "mount", img, s(&user_mp)])
        .output()
        .unwrap();
    refused(out, &["already mounted at", &m1s, "by oleo"]);
    assert!(!is_mounted(&user_mp));
    only_first();

    // Subvolumes: the first mount is a subvolume; the second may be it or beneath it.
    std::fs::create_dir(m1.join("d")).unwrap();
    ok(&["subvolume", "create", &format!("{p1}/d/sv")]);
    ok(&["subvolume", "create", &format!("{p1}/d/sv/inner")]);
    ok(&["subvolume", "create", &format!("{p1}/other")]);
    std::fs::write(m1.join("d/sv/inner/file"), b"inner").unwrap();
    ok(&["umount", p1]);
    ok(&["mount", "-o", "subvol=d/sv", img, p1]);
    assert!(m1.join("inner/file").exists());
    refused(
        oleo(&["mount", "-o", "subvol=other", img, p2]),
        &["/other", "/d/sv", &m1s, "not inside"],
    );
    refused(
        oleo(&["mount", "-o", "subvolid=5", img, p2]),
        &["/d/sv", &m1s],
    );
    only_first();
    let out = ok(&["mount", "-v", "-o", "subvol=/d/sv/inner", img, p2]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("/d/sv/inner"), "{said}");
    assert_eq!(std::fs::read(m2.join("file")).unwrap(), b"inner");
    ok(&["umount", p2]);
    let sv_id = subvol_id(&m1);
    ok(&["mount", "-o", &format!("subvolid={sv_id}"), img, p2]);
    assert!(m2.join("inner/file").exists());
    ok(&["umount", p2, p1]);

    // The top level mounted first: any subvolume binds its directory.
    ok(&["mount", "-o", "subvolid=5", img, p1]);
    ok(&["mount", "-o", "subvol=other", img, p2]);
    std::fs::write(m2.join("o"), b"o").unwrap();
    assert_eq!(std::fs::read(m1.join("other/o")).unwrap(), b"o");
    ok(&["umount", p1, p2]);
    assert_btrfs_check(&image, "after the refusals");
}

#[test]
fn a_stop_signal_unmounts_every_mount_of_the_server() {
    let name = "mount_twice_sigterm";
    if !require_fuse_mount(name) {
        return;
    }
    let dir = TempDir::new(name).unwrap();
    let image = dir.join("stop.img");
    oleo_mkfs(OLEO, &image, 256);
    let m1 = std::fs::canonicalize(dir.subdir("m1").unwrap()).unwrap();
    let m2 = std::fs::canonicalize(dir.subdir("m2").unwrap()).unwrap();
    let _cleanup = Cleanup(vec![m1.clone(), m2.clone()]);
    ok(&["mount", s(&image), s(&m1)]);
    ok(&["mount", s(&image), s(&m2)]);
    std::fs::write(m2.join("f"), b"written through the second").unwrap();
    let pid = server_pid(&m1).expect("server");
    // SAFETY: kill with a valid signal.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    assert!(wait_gone(pid, Duration::from_secs(30)), "server still runs");
    assert!(!is_mounted(&m1) && !is_mounted(&m2));
    assert_btrfs_check(&image, "after SIGTERM");
    let k = KernelMount::mount(&image, &dir.join("kernel"), &["ro"]).unwrap();
    assert_eq!(
        std::fs::read(k.path().join("f")).unwrap(),
        b"written through the second"
    );
    k.unmount().unwrap();
}
