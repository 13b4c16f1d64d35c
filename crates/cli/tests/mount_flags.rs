//! The kernel's VFS mount flags through an oleo mount, and atimes as kernel btrfs keeps them.
//!
//! - `nosuid`, `nodev`, `noexec` reach mount(2) (and fusermount3 for a user), show in
//!   /proc/mounts and are enforced by the VFS; a remount turns each on and off, and the
//!   opposite flag proves the difference (a setuid-root `id` run by nobody says 0 on a
//!   `suid` mount, 65534 on a `nosuid` one);
//! - an option oleo cannot honour is refused, naming it, and the image is not touched;
//! - atime: the same sequence of reads, listings, writes, utimes, chattr +A and a read-only
//!   snapshot on kernel btrfs and on oleo, under relatime (the default), strictatime,
//!   noatime and nodiratime, must move the atime at the same steps, and what oleo showed is
//!   what is on disk after a remount;
//! - a read-mostly workload (find and cat of many files) costs oleo no more commits, and
//!   not much more written, than kernel btrfs (`OLEO_ATIME_FILES`, default 3000);
//! - `dirsync`: a name made is on disk (in the log tree) before the call returns.

use oleo_testkit::*;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const OLEO: &str = env!("CARGO_BIN_EXE_oleo");
const NOBODY: u32 = 65534;

/// The options /proc/mounts gives the mount at `mp`.
fn proc_options(mp: &Path) -> Option<Vec<String>> {
    let want = std::fs::canonicalize(mp).ok()?;
    std::fs::read_to_string("/proc/mounts")
        .unwrap()
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            (Path::new(f[1]) == want).then(|| f[3].split(',').map(String::from).collect())
        })
        .next_back()
}

fn has(mp: &Path, flag: &str) -> bool {
    proc_options(mp)
        .unwrap_or_else(|| panic!("{} is not mounted", mp.display()))
        .iter()
        .any(|o| o == flag)
}

fn oleo(args: &[&str]) -> std::process::Output {
    Command::new(OLEO).args(args).output().unwrap()
}

fn ok(args: &[&str]) {
    let out = oleo(args);
    assert!(
        out.status.success(),
        "oleo {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn as_nobody(program: &Path, args: &[&str]) -> std::process::Output {
    Command::new("setpriv")
        .arg(format!("--reuid={NOBODY}"))
        .arg(format!("--regid={NOBODY}"))
        .arg("--clear-groups")
        .arg(program)
        .args(args)
        .output()
        .unwrap()
}

fn remount(image: &Path, mp: &Path, opts: &str) {
    ok(&[
        "mount",
        "-o",
        &format!("remount,{opts}"),
        image.to_str().unwrap(),
        mp.to_str().unwrap(),
    ]);
}

#[test]
fn nosuid_nodev_noexec_are_enforced_and_remount_changes_them() {
    let name = "mount_flags_vfs";
    if !require_fuse_mount(name) {
        return;
    }
    let dir = TempDir::new(name).unwrap();
    let image = dir.join("flags.img");
    oleo_mkfs(OLEO, &image, 256);
    let mp = dir.join("mnt");
    let m = OleoMount::mount_rw(Path::new(OLEO), &image, &mp, &["nosuid"]).unwrap();
    assert!(has(&mp, "nosuid"), "{:?}", proc_options(&mp));
    // A setuid-root copy of id(1), run by nobody.
    let id = mp.join("id");
    std::fs::copy("/usr/bin/id", &id).unwrap();
    std::fs::set_permissions(&id, std::fs::Permissions::from_mode(0o4755)).unwrap();
    assert_eq!(std::fs::metadata(&id).unwrap().uid(), 0);
    let euid = |what: &str| {
        let out = as_nobody(&id, &["-u"]);
        assert!(out.status.success(), "{what}: {out:?}");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    assert_eq!(
        euid("nosuid"),
        NOBODY.to_string(),
        "setuid honoured on a nosuid mount"
    );
    remount(&image, &mp, "suid");
    assert!(!has(&mp, "nosuid"));
    assert_eq!(
        euid("suid"),
        "0",
        "a suid mount runs setuid binaries as their owner"
    );
    remount(&image, &mp, "nosuid");
    assert_eq!(euid("nosuid again"), NOBODY.to_string());

    // noexec: exec refused with EACCES, by the VFS.
    let t = mp.join("true");
    std::fs::copy("/bin/true", &t).unwrap();
    assert!(Command::new(&t).status().unwrap().success());
    remount(&image, &mp, "noexec");
    assert!(has(&mp, "noexec"));
    let e = Command::new(&t).status().unwrap_err();
    assert_eq!(
        e.raw_os_error(),
        Some(libc::EACCES),
        "exec on a noexec mount: {e}"
    );
    remount(&image, &mp, "exec");
    assert!(!has(&mp, "noexec"));
    assert!(Command::new(&t).status().unwrap().success());

    // nodev: a device node in the image does not open the host's device.
    let null = mp.join("null");
    let c = std::ffi::CString::new(null.to_str().unwrap()).unwrap();
    // SAFETY: a valid path; makedev(1, 3) is the host's /dev/null.
    assert_eq!(
        unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(1, 3)) },
        0
    );
    assert!(std::fs::OpenOptions::new().write(true).open(&null).is_ok());
    remount(&image, &mp, "nodev");
    assert!(has(&mp, "nodev"));
    let e = std::fs::OpenOptions::new()
        .write(true)
        .open(&null)
        .unwrap_err();
    assert_eq!(
        e.raw_os_error(),
        Some(libc::EACCES),
        "open on a nodev mount: {e}"
    );
    // And they stay across a remount that names none of them.
    remount(&image, &mp, "noatime");
    assert!(has(&mp, "nodev") && has(&mp, "nosuid") && has(&mp, "noatime"));
    m.unmount().unwrap();
    assert_btrfs_check(&image, name);
}

#[test]
fn verbose_mount_prints_the_flags_in_force() {
    let name = "mount_flags_verbose";
    if !require_fuse_mount(name) {
        return;
    }
    let dir = TempDir::new(name).unwrap();
    let image = dir.join("v.img");
    oleo_mkfs(OLEO, &image, 256);
    let mp = dir.join("mnt");
    std::fs::create_dir_all(&mp).unwrap();
    let opts = format!("noexec,nodev,strictatime,log={}", dir.join("log").display());
    let out = Command::new(OLEO)
        .args(["mount", "-v", "-o", &opts])
        .arg(&image)
        .arg(&mp)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    let m = MountGuard(mp.clone());
    assert!(out.status.success(), "{err}");
    let line = err
        .lines()
        .find(|l| l.contains("mounted on"))
        .unwrap_or_else(|| panic!("no flags said: {err}"));
    for f in ["rw", "nodev", "noexec"] {
        assert!(line.split([' ', ',']).any(|w| w == f), "{f} not in {line}");
    }
    // strictatime: neither relatime nor noatime.
    assert!(
        !line.contains("relatime") && !line.contains("noatime"),
        "{line}"
    );
    drop(m);
}

/// Unmounts (and waits for the daemon's image lock to go) when dropped.
struct MountGuard(PathBuf);

impl Drop for MountGuard {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
        std::thread::sleep(Duration::from_millis(300));
    }
}

#[test]
fn options_oleo_cannot_honour_are_refused_and_the_image_untouched() {
    let name = "mount_flags_refused";
    if !require_fuse_mount(name) {
        return;
    }
    let dir = TempDir::new(name).unwrap();
    let image = dir.join("r.img");
    oleo_mkfs(OLEO, &image, 256);
    let before = std::fs::read(&image).unwrap();
    let mp = dir.subdir("mnt").unwrap();
    for (opt, named) in [
        ("bogus", "bogus"),
        ("noexec,frobnicate=1", "frobnicate"),
        ("noacl", "noacl"),
        ("nobarrier", "nobarrier"),
        ("flushoncommit", "flushoncommit"),
    ] {
        let out = oleo(&[
            "mount",
            "-o",
            opt,
            image.to_str().unwrap(),
            mp.to_str().unwrap(),
        ]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "-o {opt} mounted");
        assert!(err.contains(named), "-o {opt}: {err}");
        assert!(proc_options(&mp).is_none(), "-o {opt} left a mount");
    }
    // A user cannot have suid or dev (fusermount3 forces nosuid,nodev): said, not dropped.
    let home = dir.subdir("home").unwrap();
    let uimg = home.join("u.img");
    std::fs::copy(&image, &uimg).unwrap();
    let ump = home.join("mnt");
    std::fs::create_dir(&ump).unwrap();
    for p in [&home, &uimg, &ump] {
        std::os::unix::fs::chown(p, Some(NOBODY), Some(NOBODY)).unwrap();
    }
    for opt in ["suid", "dev"] {
        let out = as_nobody(
            Path::new(OLEO),
            &[
                "mount",
                "-o",
                opt,
                uimg.to_str().unwrap(),
                ump.to_str().unwrap(),
            ],
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "a user mounted with {opt}");
        assert!(err.contains(opt), "{opt}: {err}");
        assert!(proc_options(&ump).is_none());
    }
    assert!(
        std::fs::read(&image).unwrap() == before,
        "a refused mount wrote the image"
    );
    assert!(
        std::fs::read(&uimg).unwrap() == before,
        "a refused mount wrote the image"
    );
}

#[test]
fn a_users_mount_has_the_flags_it_asks_for() {
    let name = "mount_flags_user";
    if !require_fuse_mount(name) {
        return;
    }
    let dir = TempDir::new(name).unwrap();
    let home = dir.subdir("home").unwrap();
    let image = home.join("u.img");
    let mp = home.join("mnt");
    std::fs::create_dir(&mp).unwrap();
    for p in [&home, &mp] {
        std::os::unix::fs::chown(p, Some(NOBODY), Some(NOBODY)).unwrap();
    }
    // Made by the user: its root directory is theirs.
    let out = as_nobody(
        Path::new(OLEO),
        &["mkfs", "-q", "--size", "256M", image.to_str().unwrap()],
    );
    assert!(out.status.success(), "{out:?}");
    let out = as_nobody(
        Path::new(OLEO),
        &[
            "mount",
            "-o",
            "noexec,noatime",
            image.to_str().unwrap(),
            mp.to_str().unwrap(),
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let opts = proc_options(&mp).expect("mounted");
    for f in ["nosuid", "nodev", "noexec", "noatime"] {
        assert!(opts.iter().any(|o| o == f), "{f} not in {opts:?}");
    }
    let t = mp.join("true");
    let out = as_nobody(Path::new("cp"), &["/bin/true", t.to_str().unwrap()]);
    assert!(out.status.success());
    let out = as_nobody(&t, &[]);
    assert!(!out.status.success(), "ran a program from a noexec mount");
    let out = as_nobody(Path::new("fusermount3"), &["-u", mp.to_str().unwrap()]);
    assert!(out.status.success());
}

/// One step of the atime sequence.
#[derive(Clone, Copy, Debug)]
enum Step {
    /// open, read all, close.
    Read(&'static str),
    /// open for reading and close, without reading.
    OpenOnly(&'static str),
    /// readdir.
    List(&'static str),
    /// append a byte.
    Append(&'static str),
    /// atime set two days back (mtime kept).
    AgeAtime(&'static str),
    /// chattr +A.
    NoAtimeFlag(&'static str),
}

const SEQUENCE: &[Step] = &[
    Step::Read("d/f"),
    Step::Read("d/f"),
    Step::OpenOnly("d/g"),
    Step::List("d"),
    Step::List("d"),
    Step::AgeAtime("d/f"),
    Step::Read("d/f"),
    Step::Read("d/f"),
    Step::Append("d/f"),
    Step::Read("d/f"),
    Step::AgeAtime("d"),
    Step::List("d"),
    Step::NoAtimeFlag("d/g"),
    Step::AgeAtime("d/g"),
    Step::Read("d/g"),
    Step::Read("snap/d/f"),
    Step::List("snap/d"),
];

/// What a step does to the path it names.
type Action = Box<dyn Fn(&Path)>;

fn atime(p: &Path) -> (i64, i64) {
    let m = std::fs::metadata(p).unwrap();
    (m.atime(), m.atime_nsec())
}

/// Runs the sequence under `root`; for each step, whether the atime of what it touched
/// moved. `snapshot` makes `root/snap`, read-only.
fn run_sequence(root: &Path, snapshot: &dyn Fn()) -> Vec<(String, bool)> {
    std::fs::create_dir(root.join("d")).unwrap();
    std::fs::write(root.join("d/f"), b"f").unwrap();
    std::fs::write(root.join("d/g"), b"g").unwrap();
    snapshot();
    let tick = || std::thread::sleep(Duration::from_millis(30));
    let mut out = Vec::new();
    for step in SEQUENCE {
        tick();
        let (path, act): (&str, Action) = match *step {
            Step::Read(p) => (p, Box::new(|p| drop(std::fs::read(p).unwrap()))),
            Step::OpenOnly(p) => (p, Box::new(|p| drop(std::fs::File::open(p).unwrap()))),
            Step::List(p) => (
                p,
                Box::new(|p| assert!(std::fs::read_dir(p).unwrap().count() < 100)),
            ),
            Step::Append(p) => (
                p,
                Box::new(|p| {
                    use std::io::Write;
                    let mut f = std::fs::OpenOptions::new().append(true).open(p).unwrap();
                    f.write_all(b"+").unwrap();
                }),
            ),
            Step::AgeAtime(p) => (
                p,
                Box::new(|p| {
                    let m = std::fs::metadata(p).unwrap();
                    let old = libc::timespec {
                        tv_sec: m.mtime() - 2 * 86400,
                        tv_nsec: 0,
                    };
                    let keep = libc::timespec {
                        tv_sec: 0,
                        tv_nsec: libc::UTIME_OMIT,
                    };
                    let c = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
                    // SAFETY: a valid path and two valid timespecs.
                    let r = unsafe {
                        libc::utimensat(libc::AT_FDCWD, c.as_ptr(), [old, keep].as_ptr(), 0)
                    };
                    assert_eq!(r, 0, "utimensat {}", p.display());
                }),
            ),
            Step::NoAtimeFlag(p) => (
                p,
                Box::new(|p| {
                    let st = Command::new("chattr").arg("+A").arg(p).status().unwrap();
                    assert!(st.success(), "chattr +A");
                }),
            ),
        };
        let p = root.join(path);
        let before = atime(&p);
        act(&p);
        let moved = atime(&p) != before;
        out.push((format!("{step:?}"), moved));
    }
    out
}

/// Every atime under `root`, for comparing what a mount showed with what is on disk.
fn atimes(root: &Path) -> Vec<(String, (i64, i64))> {
    ["d", "d/f", "d/g", "snap/d", "snap/d/f"]
        .iter()
        .map(|p| (p.to_string(), atime(&root.join(p))))
        .collect()
}

#[test]
fn atime_moves_as_on_kernel_btrfs() {
    let name = "mount_flags_atime";
    if !require_fuse_mount(name) || !require_root(name) {
        return;
    }
    let dir = TempDir::new(name).unwrap();
    for opts in [
        &[][..],
        &["strictatime"],
        &["noatime"],
        &["nodiratime"],
        &["relatime", "lazytime"],
    ] {
        let label = if opts.is_empty() {
            "default".to_string()
        } else {
            opts.join(",")
        };
        // Kernel btrfs: the reference.
        let kimg = dir.join(format!("k-{label}.img"));
        empty_image(&kimg, 256, &[]).unwrap();
        let kmp = dir.join(format!("k-{label}"));
        std::fs::create_dir_all(&kmp).unwrap();
        let mut kopts = vec!["rw"];
        kopts.extend(opts.iter().copied());
        let k = KernelMount::mount(&kimg, &kmp, &kopts).unwrap();
        let kroot = kmp.clone();
        let want = run_sequence(&kmp, &|| {
            let st = Command::new("btrfs")
                .args(["subvolume", "snapshot", "-r"])
                .arg(&kroot)
                .arg(kroot.join("snap"))
                .output()
                .unwrap();
            assert!(st.status.success(), "{st:?}");
        });
        k.unmount().unwrap();

        let oimg = dir.join(format!("o-{label}.img"));
        empty_image(&oimg, 256, &[]).unwrap();
        let omp = dir.join(format!("o-{label}"));
        let o = OleoMount::mount_rw(Path::new(OLEO), &oimg, &omp, opts).unwrap();
        let oroot = omp.clone();
        let got = run_sequence(&omp, &|| {
            ok(&[
                "subvolume",
                "snapshot",
                "-r",
                oroot.to_str().unwrap(),
                oroot.join("snap").to_str().unwrap(),
            ])
        });
        let shown = atimes(&omp);
        o.unmount().unwrap();
        assert_eq!(
            got, want,
            "{label}: atime moved at other steps than on kernel btrfs"
        );
        // What the mount showed is what is on disk: by oleo again, and by the kernel.
        let o = OleoMount::mount_rw(Path::new(OLEO), &oimg, &omp, &["noatime"]).unwrap();
        assert_eq!(atimes(&omp), shown, "{label}: oleo after a remount");
        o.unmount().unwrap();
        let k = KernelMount::mount(&oimg, &kmp, &["ro", "noatime"]).unwrap();
        assert_eq!(
            atimes(&kmp),
            shown,
            "{label}: the kernel's view of oleo's image"
        );
        k.unmount().unwrap();
        assert_btrfs_check(&oimg, &label);
    }
}

/// BTRFS_IOC_SYNC on a mount: commits the running transaction (kernel btrfs and oleo).
fn btrfs_ioc_sync(mp: &Path) {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(mp).unwrap();
    // SAFETY: _IO(0x94, 8) takes no argument.
    let r = unsafe { libc::ioctl(f.as_raw_fd(), 0x9408 as _, 0) };
    assert_eq!(r, 0, "BTRFS_IOC_SYNC on {}", mp.display());
}

/// The wall clock, in seconds.
fn now_secs() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// Sectors written to a block device so far (/sys/block/NAME/stat, field 7).
fn sectors_written(dev: &Path) -> u64 {
    let name = dev.file_name().unwrap().to_str().unwrap();
    let stat = std::fs::read_to_string(format!("/sys/block/{name}/stat")).unwrap();
    stat.split_whitespace().nth(6).unwrap().parse().unwrap()
}

#[test]
fn a_read_mostly_workload_costs_no_more_than_on_kernel_btrfs() {
    let name = "mount_flags_atime_cost";
    if !require_fuse_mount(name) || !require_root(name) {
        return;
    }
    let files: usize = std::env::var("OLEO_ATIME_FILES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3000);
    let dir = TempDir::new(name).unwrap();
    let fill = |root: &Path| {
        for i in 0..files {
            let d = root.join(format!("d{}", i / 1000));
            if i % 1000 == 0 {
                std::fs::create_dir(&d).unwrap();
            }
            std::fs::write(
                d.join(format!("f{i}")),
                format!("file {i}\n").repeat(1 + i % 7),
            )
            .unwrap();
        }
    };
    let workload = |root: &Path| {
        let st = Command::new("sh")
            .arg("-c")
            .arg("find . -type f -exec cat {} + > /dev/null")
            .current_dir(root)
            .status()
            .unwrap();
        assert!(st.success());
    };
    // Kernel btrfs.
    let kimg = dir.join("k.img");
    empty_image(&kimg, 512, &[]).unwrap();
    let kmp = dir.subdir("k").unwrap();
    let k = KernelMount::mount(&kimg, &kmp, &["rw"]).unwrap();
    fill(&kmp);
    k.unmount().unwrap();
    let kgen = superblock_generation(&kimg).unwrap();
    let k = KernelMount::mount(&kimg, &kmp, &["rw"]).unwrap();
    let kdev = k.device().to_path_buf();
    let kw0 = sectors_written(&kdev);
    let t0 = now_secs();
    workload(&kmp);
    assert!(
        atime(&kmp.join("d0/f0")).0 >= t0,
        "kernel btrfs did not move the atime"
    );
    // What the reads left to write, written: a commit.
    btrfs_ioc_sync(&kmp);
    let kw = sectors_written(&kdev) - kw0;
    k.unmount().unwrap();
    let kcommits = superblock_generation(&kimg).unwrap() - kgen;
    // oleo, on a loop device too.
    let oimg = dir.join("o.img");
    empty_image(&oimg, 512, &[]).unwrap();
    let omp = dir.join("o");
    let o = OleoMount::mount_rw(Path::new(OLEO), &oimg, &omp, &[]).unwrap();
    fill(&omp);
    o.unmount().unwrap();
    let ogen = superblock_generation(&oimg).unwrap();
    let lo = LoopDevice::attach(&oimg, false).unwrap();
    let o = OleoMount::mount_rw(Path::new(OLEO), lo.path(), &omp, &[]).unwrap();
    let ow0 = sectors_written(lo.path());
    let t0 = now_secs();
    workload(&omp);
    assert!(
        atime(&omp.join("d0/f0")).0 >= t0,
        "oleo did not move the atime"
    );
    btrfs_ioc_sync(&omp);
    let ow = sectors_written(lo.path()) - ow0;
    o.unmount().unwrap();
    drop(lo);
    let ocommits = superblock_generation(&oimg).unwrap() - ogen;
    eprintln!(
        "{files} files read: kernel btrfs {kcommits} commits, {} KiB written; oleo {ocommits} commits, {} KiB written",
        kw / 2,
        ow / 2
    );
    assert!(
        ocommits <= kcommits,
        "oleo committed {ocommits} times for reads, kernel btrfs {kcommits}"
    );
    // Both rewrite every leaf holding a read inode once; oleo's tree layout differs, so
    // allow a margin, but nothing like a write per read.
    assert!(
        ow <= kw * 3 / 2 + 2048,
        "oleo wrote {} KiB for reads, kernel btrfs {} KiB",
        ow / 2,
        kw / 2
    );
}

#[test]
fn dirsync_makes_a_new_name_durable_before_it_returns() {
    let name = "mount_flags_dirsync";
    if !require_fuse_mount(name) || !require_root(name) {
        return;
    }
    let dir = TempDir::new(name).unwrap();
    let image = dir.join("ds.img");
    empty_image(&image, 256, &[]).unwrap();
    let mp = dir.join("mnt");
    // A long commit interval: only dirsync can have put these on disk.
    let o = OleoMount::mount_rw(Path::new(OLEO), &image, &mp, &["dirsync", "commit=3600"]).unwrap();
    assert!(has(&mp, "dirsync"), "{:?}", proc_options(&mp));
    std::fs::create_dir(mp.join("made")).unwrap();
    std::fs::File::create(mp.join("made/file")).unwrap();
    std::fs::rename(mp.join("made/file"), mp.join("renamed")).unwrap();
    // The image as a crash right now would leave it.
    let crash = dir.join("crash.img");
    std::fs::copy(&image, &crash).unwrap();
    o.unmount().unwrap();
    let kmp = dir.subdir("k").unwrap();
    // The kernel replays the log tree at mount.
    let k = KernelMount::mount(&crash, &kmp, &["rw"]).unwrap();
    assert!(kmp.join("made").is_dir(), "mkdir lost in the crash state");
    assert!(
        kmp.join("renamed").is_file(),
        "create + rename lost in the crash state"
    );
    assert!(!kmp.join("made/file").exists());
    k.unmount().unwrap();
    assert_btrfs_check(&crash, "dirsync crash state");
}
