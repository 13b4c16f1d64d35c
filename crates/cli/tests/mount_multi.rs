//! `oleo mount` of multi-device filesystems, checked against the kernel and btrfs-progs:
//!
//! - a RAID1 set mounted read-write as `oleo mount A B MNT` (and as `-o device=B`), a tree
//!   copied in with `cp -a` (enough to make new data chunks), unmounted: `btrfs check
//!   --check-data-csum` is clean, the kernel mounts the set and sees exactly the tree, and
//!   oleo's new chunks are RAID1 on both devices;
//! - RAID5 with a member left out and RAID6 with two, mounted `-o degraded,ro`: everything
//!   the kernel wrote reads back (contents, symlinks, xattrs, hard links); without
//!   `degraded` the mount is refused naming the missing devid;
//! - RAID5/6 mounted without `ro` falls back to read-only with a warning; `-o rw` is
//!   refused; a member of another filesystem or the same image twice are refused, each
//!   with one line naming the cause.
//!
//! Needs root, FUSE, loop devices, kernel btrfs and btrfs-progs (a skip elsewhere, a
//! failure under CI=true).

use oleo_testkit::multi_device::{self as md, BG_DATA, BG_RAID1, BLOCK};
use oleo_testkit::{mount_at, require_fuse_mount, OleoMount, TempDir};
use std::collections::BTreeSet;
use std::fs::File;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

const OLEO: &str = env!("CARGO_BIN_EXE_oleo");
const MIB: u64 = 1 << 20;

// ---- a foreground `oleo mount` with its devices as arguments ----------------------------

/// `oleo mount -f [-o OPTS] DEV... MNT`, served in the foreground by a child this handle
/// keeps: `stop` unmounts and waits for it to exit (its final commit on disk). Drop
/// unmounts lazily and kills it if a test failed first.
struct Served {
    mnt: PathBuf,
    child: Option<Child>,
    log: PathBuf,
    mounted: bool,
}

impl Served {
    fn start(opts: &str, devices: &[PathBuf], mnt: &Path, log: &Path) -> Result<Served, String> {
        std::fs::create_dir_all(mnt).unwrap();
        let logf = File::create(log).unwrap();
        let mut cmd = Command::new(OLEO);
        cmd.args(["mount", "-f"]);
        if !opts.is_empty() {
            cmd.args(["-o", opts]);
        }
        cmd.args(devices).arg(mnt);
        cmd.stdin(Stdio::null())
            .stdout(logf.try_clone().unwrap())
            .stderr(logf);
        let described = format!("{cmd:?}");
        let child = cmd.spawn().map_err(|e| format!("{described}: {e}"))?;
        let mut s = Served {
            mnt: mnt.to_path_buf(),
            child: Some(child),
            log: log.to_path_buf(),
            mounted: false,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if mount_at(mnt).is_some_and(|m| m.fstype.starts_with("fuse")) {
                s.mounted = true;
                // Answered once a stat of the root comes back.
                if std::fs::metadata(mnt).is_ok() {
                    return Ok(s);
                }
            }
            if let Some(st) = s.child.as_mut().unwrap().try_wait().unwrap() {
                s.child = None;
                return Err(format!(
                    "{described} exited ({st}) without mounting: {}",
                    s.log_text()
                ));
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "{described}: no mount after 30 s: {}",
                    s.log_text()
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Unmounts and waits (up to a minute) for the server to exit; its exit status.
    fn stop(mut self) -> Result<ExitStatus, String> {
        let st = Command::new("fusermount3")
            .arg("-u")
            .arg(&self.mnt)
            .status()
            .unwrap();
        if !st.success() {
            return Err(format!("fusermount3 -u {}: {st}", self.mnt.display()));
        }
        self.mounted = false;
        let mut child = self.child.take().unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(st) = child.try_wait().unwrap() {
                return Ok(st);
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "oleo did not exit within 60 s of its unmount: {}",
                    self.log_text()
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if self.mounted {
            let _ = Command::new("fusermount3")
                .arg("-uz")
                .arg(&self.mnt)
                .status();
        }
        if let Some(mut c) = self.child.take() {
            let deadline = Instant::now() + Duration::from_secs(20);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = c.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// `oleo ARGS` run to its end: (success, stderr).
fn oleo(args: &[&std::ffi::OsStr]) -> (bool, String) {
    let out = Command::new(OLEO).args(args).output().expect("run oleo");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn os<S: AsRef<std::ffi::OsStr> + ?Sized>(s: &S) -> &std::ffi::OsStr {
    s.as_ref()
}

// ---- the tree copied in ------------------------------------------------------------------

fn splitmix(s: &mut u64) -> u64 {
    *s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *s;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A tree to copy in: `nbig` pattern files of 24 MiB (and a few bytes: some end
/// mid-block), 400 small files in 8 directories, a deep chain, symlinks, a hard link,
/// user xattrs, an empty file and modes. Returns its manifest.
fn make_tree(root: &Path, nbig: u32, seed: u64) -> md::Manifest {
    let mut rng = seed;
    std::fs::create_dir_all(root.join("big")).unwrap();
    for b in 0..nbig {
        let size = 24 * MIB as usize + b as usize * 1001;
        let mut data = Vec::with_capacity(size + BLOCK);
        let mut i = 0;
        while data.len() < size {
            data.extend(md::pattern_block(300 + b, i));
            i += 1;
        }
        data.truncate(size);
        std::fs::write(root.join(format!("big/f{b:02}")), &data).unwrap();
    }
    for d in 0..8 {
        let dir = root.join(format!("small/d{d}"));
        std::fs::create_dir_all(&dir).unwrap();
        for f in 0..50 {
            let len = (splitmix(&mut rng) % 9000) as usize;
            let data: Vec<u8> = (0..len).map(|_| splitmix(&mut rng) as u8).collect();
            std::fs::write(dir.join(format!("f{f:02}")), data).unwrap();
        }
    }
    let deep = root.join("deep/a/b/c/d/e");
    std::fs::create_dir_all(&deep).unwrap();
    std::fs::write(deep.join("leaf"), b"at the bottom\n").unwrap();
    std::fs::write(root.join("empty"), b"").unwrap();
    symlink("big/f00", root.join("to-big")).unwrap();
    symlink("no/such/target", root.join("dangling")).unwrap();
    std::fs::hard_link(root.join("small/d0/f00"), root.join("hard")).unwrap();
    let x = root.join("small/d1/f01");
    for (k, v) in [
        ("user.one", "1".to_string()),
        ("user.seed", seed.to_string()),
    ] {
        let st = Command::new("setfattr")
            .args(["-n", k, "-v", &v])
            .arg(&x)
            .status()
            .unwrap();
        assert!(st.success(), "setfattr {k}");
    }
    std::fs::set_permissions(
        root.join("small/d2/f02"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    md::Manifest::capture(root).unwrap()
}

/// The chunks of a set, through the library (read-only).
fn chunks_of(images: &[PathBuf]) -> Vec<oleo::ChunkInfo> {
    chunks_of_degraded(images, false)
}

fn chunks_of_degraded(images: &[PathBuf], degraded: bool) -> Vec<oleo::ChunkInfo> {
    let fs = oleo::Filesystem::open(
        &images[0],
        oleo::OpenOptions {
            devices: images[1..].to_vec(),
            degraded,
            ..Default::default()
        },
    )
    .expect("open the set");
    fs.chunk_usage().unwrap()
}

/// After oleo wrote to a RAID1 pair: `btrfs check` clean, the kernel sees `want` at
/// `tree`, and oleo's new data chunks are RAID1 over both devices.
fn check_after_oleo(
    images: &[PathBuf],
    before: &[oleo::ChunkInfo],
    want: &md::Manifest,
    tree: &str,
    mnt: &Path,
    what: &str,
) {
    let check = md::offline_check(images).unwrap();
    assert!(
        check.clean,
        "{what}: btrfs check --check-data-csum after oleo's writes:\n{}",
        check.output
    );
    let old: BTreeSet<u64> = before.iter().map(|c| c.logical).collect();
    let new: Vec<oleo::ChunkInfo> = chunks_of(images)
        .into_iter()
        .filter(|c| !old.contains(&c.logical))
        .collect();
    assert!(
        new.iter().any(|c| c.flags & BG_DATA != 0),
        "{what}: oleo made no data chunk: {new:?}"
    );
    for c in &new {
        let devs: BTreeSet<u64> = c.stripes.iter().map(|s| s.0).collect();
        assert!(
            c.flags & BG_RAID1 != 0 && devs.len() == 2,
            "{what}: oleo made chunk {} with flags {:#x} on devids {devs:?}, not RAID1 on both",
            c.logical,
            c.flags
        );
    }
    let set = md::KernelSet::mount(images, &[], mnt, &["ro", "noatime"])
        .unwrap_or_else(|e| panic!("{what}: the kernel cannot mount the set: {e}"));
    want.check_dir(&set.root().join(tree)).unwrap_or_else(|e| {
        panic!("{what}: the kernel sees another tree than was copied in:\n{e}")
    });
    set.unmount().unwrap();
}

fn cp_tree(src: &Path, dst: &Path, what: &str) {
    let out = Command::new("cp")
        .arg("-a")
        .arg(src)
        .arg(dst)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{what}: cp -a {} {}: {}",
        src.display(),
        dst.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn raid1_mounted_with_both_devices_as_arguments_takes_a_tree() {
    if !require_fuse_mount("mount_multi raid1 rw") {
        return;
    }
    let tmp = TempDir::new("mm-rw").unwrap();
    let images = md::mkfs_set(tmp.path(), "r1", 2, 512 * MIB, "raid1", "raid1").unwrap();
    let before = chunks_of(&images);
    let src = tmp.join("src");
    let want = make_tree(&src, 6, 41);
    let mnt = tmp.join("mnt");
    let what = "oleo mount -f A B MNT (raid1)";
    // The second device first: the order does not matter.
    let devs = vec![images[1].clone(), images[0].clone()];
    let s = Served::start("", &devs, &mnt, &tmp.join("oleo.log"))
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let started = Instant::now();
    cp_tree(&src, &mnt.join("tree"), what);
    // What was copied reads back through the mount.
    want.check_dir(&mnt.join("tree"))
        .unwrap_or_else(|e| panic!("{what}: the mount shows another tree:\n{e}"));
    let st = s.stop().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(st.success(), "{what}: oleo exited with {st}");
    eprintln!("{what}: copied and unmounted in {:?}", started.elapsed());
    check_after_oleo(&images, &before, &want, "tree", &tmp.join("kmnt"), what);
}

#[test]
fn raid1_mounted_with_device_option_takes_a_tree() {
    if !require_fuse_mount("mount_multi raid1 device=") {
        return;
    }
    let tmp = TempDir::new("mm-devopt").unwrap();
    let images = md::mkfs_set(tmp.path(), "r1", 2, 512 * MIB, "raid1", "raid1").unwrap();
    let before = chunks_of(&images);
    let src = tmp.join("src");
    let want = make_tree(&src, 4, 42);
    let mnt = tmp.join("mnt");
    let what = "oleo mount -o rw,device=B A MNT (raid1)";
    let opt = format!("device={}", images[1].display());
    let m = OleoMount::mount_rw(Path::new(OLEO), &images[0], &mnt, &[&opt])
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    cp_tree(&src, &mnt.join("tree"), what);
    m.unmount().unwrap_or_else(|e| panic!("{what}: {e}"));
    check_after_oleo(&images, &before, &want, "tree", &tmp.join("kmnt"), what);
}

/// `oleo mount -o degraded A MNT` of a RAID1 pair with B left out is writable; a tree
/// copied in lands in new SINGLE chunks on A, and the kernel reads it degraded (B still
/// left out) and with both devices.
#[test]
fn raid1_degraded_read_write_mount() {
    if !require_fuse_mount("mount_multi raid1 degraded rw") {
        return;
    }
    let tmp = TempDir::new("mm-degraded-rw").unwrap();
    let images = md::mkfs_set(tmp.path(), "r1", 2, 512 * MIB, "raid1", "raid1").unwrap();
    let src = tmp.join("src");
    let want = make_tree(&src, 4, 46);
    let mnt = tmp.join("mnt");
    let what = "oleo mount -o degraded A MNT (raid1, B left out)";
    let one = vec![images[0].clone()];
    let before = chunks_of_degraded(&one, true);
    let s = Served::start("degraded", &one, &mnt, &tmp.join("oleo.log"))
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    cp_tree(&src, &mnt.join("tree"), what);
    let st = s.stop().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(st.success(), "{what}: oleo exited with {st}");

    let old: BTreeSet<u64> = before.iter().map(|c| c.logical).collect();
    let new: Vec<oleo::ChunkInfo> = chunks_of_degraded(&one, true)
        .into_iter()
        .filter(|c| !old.contains(&c.logical))
        .collect();
    assert!(
        new.iter().any(|c| c.flags & BG_DATA != 0),
        "{what}: no new data chunk: {new:?}"
    );
    for c in &new {
        assert!(
            c.flags & md::BG_RAID1 == 0
                && c.flags & md::BG_DUP == 0
                && c.stripes.len() == 1
                && c.stripes[0].0 == 1,
            "{what}: new chunk {} (flags {:#x}, stripes {:?}) is not SINGLE on devid 1",
            c.logical,
            c.flags,
            c.stripes
        );
    }
    let kmnt = tmp.join("kmnt");
    let set = md::KernelSet::mount(&images, &[true, false], &kmnt, &["ro", "degraded"])
        .unwrap_or_else(|e| panic!("{what}: kernel, degraded: {e}"));
    want.check_dir(&set.root().join("tree"))
        .unwrap_or_else(|e| panic!("{what}: kernel, degraded:\n{e}"));
    set.unmount().unwrap();
    let set = md::KernelSet::mount(&images, &[], &kmnt, &["ro"])
        .unwrap_or_else(|e| panic!("{what}: kernel, both devices: {e}"));
    want.check_dir(&set.root().join("tree"))
        .unwrap_or_else(|e| panic!("{what}: kernel, both devices:\n{e}"));
    set.unmount().unwrap();
}

/// A kernel-made and -filled set (mkfs, mount, `md::fill`, unmount).
fn kernel_filled(
    tmp: &TempDir,
    name: &str,
    ndevs: usize,
    profile: &str,
    seed: u64,
) -> (Vec<PathBuf>, md::Manifest) {
    let images = md::mkfs_set(tmp.path(), name, ndevs, 256 * MIB, profile, profile).unwrap();
    let set = md::KernelSet::mount(&images, &[], &tmp.join("kmnt"), &["rw", "noatime"]).unwrap();
    let manifest = md::fill(set.root(), seed).unwrap();
    set.unmount().unwrap();
    (images, manifest)
}

#[test]
fn raid56_degraded_read_only_mounts_read_everything() {
    if !require_fuse_mount("mount_multi raid5/6 degraded") {
        return;
    }
    let tmp = TempDir::new("mm-degraded").unwrap();
    for (profile, n, gone, seed) in [
        ("raid5", 3, vec![1usize], 43u64),
        ("raid6", 4, vec![0, 3], 44),
    ] {
        let (images, manifest) = kernel_filled(&tmp, profile, n, profile, seed);
        let present: Vec<PathBuf> = (0..n)
            .filter(|i| !gone.contains(i))
            .map(|i| images[i].clone())
            .collect();
        let missing: Vec<u64> = gone
            .iter()
            .map(|&i| md::devid_of(&images[i]).unwrap())
            .collect();
        let what = format!("{profile} on {n}, devids {missing:?} left out");
        let mnt = tmp.join(format!("mnt-{profile}"));
        std::fs::create_dir_all(&mnt).unwrap();

        // Without degraded: refused, one line naming a missing devid.
        let mut args: Vec<&std::ffi::OsStr> = vec![os("mount"), os("-o"), os("ro")];
        args.extend(present.iter().map(|p| p.as_os_str()));
        args.push(mnt.as_os_str());
        let (ok, err) = oleo(&args);
        assert!(!ok, "{what}: mounted without degraded");
        assert!(
            missing
                .iter()
                .any(|d| err.contains(&format!("device {d} "))
                    || err.contains(&format!("devid {d}"))),
            "{what}: the refusal names no missing devid: {err}"
        );
        assert_eq!(err.trim().lines().count(), 1, "{what}: one line: {err}");
        assert!(mount_at(&mnt).is_none(), "{what}: something got mounted");

        // Positional devices.
        let s = Served::start(
            "degraded,ro",
            &present,
            &mnt,
            &tmp.join(format!("{profile}.log")),
        )
        .unwrap_or_else(|e| panic!("{what}: oleo mount -o degraded,ro: {e}"));
        manifest
            .check_dir(&mnt)
            .unwrap_or_else(|e| panic!("{what}: oleo mount -o degraded,ro reads differ:\n{e}"));
        let w = std::fs::write(mnt.join("new"), b"x");
        assert!(w.is_err(), "{what}: a read-only mount took a write");
        let st = s.stop().unwrap();
        assert!(st.success(), "{what}: oleo exited with {st}");

        // The other members as device= (daemonized mount).
        let opts: Vec<String> = present[1..]
            .iter()
            .map(|p| format!("device={}", p.display()))
            .chain(["degraded".to_string()])
            .collect();
        let opts: Vec<&str> = opts.iter().map(|s| s.as_str()).collect();
        let m = OleoMount::mount(Path::new(OLEO), &present[0], &mnt, &opts)
            .unwrap_or_else(|e| panic!("{what}: oleo mount -o ro,degraded,device=...: {e}"));
        manifest
            .check_dir(m.path())
            .unwrap_or_else(|e| panic!("{what}: -o device= reads differ:\n{e}"));
        m.unmount().unwrap();
    }
}

#[test]
fn raid5_without_ro_falls_back_to_read_only() {
    if !require_fuse_mount("mount_multi raid5 read-only fallback") {
        return;
    }
    let tmp = TempDir::new("mm-raid5-rw").unwrap();
    let (images, manifest) = kernel_filled(&tmp, "r5", 3, "raid5", 45);
    let mnt = tmp.join("mnt");
    let what = "raid5 on 3 mounted without -o";
    let s = Served::start("", &images, &mnt, &tmp.join("oleo.log"))
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    manifest
        .check_dir(&mnt)
        .unwrap_or_else(|e| panic!("{what}: reads differ:\n{e}"));
    let err = std::fs::write(mnt.join("new"), b"x").expect_err("a write on RAID5 was taken");
    assert_eq!(
        err.raw_os_error(),
        Some(libc::EROFS),
        "{what}: a write fails with {err}, not EROFS"
    );
    let log = s.log_text();
    assert!(
        log.contains("read-only") && log.contains("RAID5/6"),
        "{what}: no warning that RAID5/6 mounts read-only in oleo's output: {log}"
    );
    let st = s.stop().unwrap();
    assert!(st.success(), "{what}: oleo exited with {st}");

    // Asked for rw explicitly: refused.
    let mut args: Vec<&std::ffi::OsStr> = vec![os("mount"), os("-o"), os("rw")];
    args.extend(images.iter().map(|p| p.as_os_str()));
    args.push(mnt.as_os_str());
    let (ok, err) = oleo(&args);
    assert!(!ok, "raid5 mounted with -o rw");
    assert!(err.contains("RAID5/6"), "-o rw on raid5: {err}");
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    assert!(mount_at(&mnt).is_none());
}

#[test]
fn refusals_name_the_device() {
    if !require_fuse_mount("mount_multi refusals") {
        return;
    }
    let tmp = TempDir::new("mm-refuse").unwrap();
    let ours = md::mkfs_set(tmp.path(), "ours", 2, 256 * MIB, "raid1", "raid1").unwrap();
    let other = md::mkfs_set(tmp.path(), "other", 2, 256 * MIB, "raid1", "raid1").unwrap();
    let mnt = tmp.join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let dev_opt = format!("device={}", other[0].display());
    let cases: Vec<(Vec<&std::ffi::OsStr>, String)> = vec![
        (
            vec![
                os("mount"),
                ours[0].as_os_str(),
                other[1].as_os_str(),
                mnt.as_os_str(),
            ],
            other[1].display().to_string(),
        ),
        (
            vec![
                os("mount"),
                os("-o"),
                os(&dev_opt),
                ours[0].as_os_str(),
                mnt.as_os_str(),
            ],
            other[0].display().to_string(),
        ),
        (
            vec![
                os("mount"),
                ours[0].as_os_str(),
                ours[0].as_os_str(),
                mnt.as_os_str(),
            ],
            "twice".to_string(),
        ),
        (
            vec![os("mount"), ours[0].as_os_str(), mnt.as_os_str()],
            "device 2 ".to_string(),
        ),
    ];
    for (args, expect) in cases {
        let (ok, err) = oleo(&args);
        assert!(!ok, "{args:?} should fail");
        assert!(
            err.contains(&expect),
            "{args:?}: expected {expect:?} in {err:?}"
        );
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: one line: {err:?}");
        assert!(mount_at(&mnt).is_none(), "{args:?}: something got mounted");
    }
}
