//! `oleo filesystem show | df | usage` against `btrfs filesystem show | df | usage` on the
//! same filesystems: sets made by mkfs.btrfs and filled by a kernel mount, then unmounted
//! and read by oleo (from the image files, from the same images on loop devices, through
//! an oleo FUSE mount) and by btrfs on a read-only kernel mount.
//!
//! Compared byte for byte. What must differ is masked, and only that: the kernel names a
//! device /dev/loopN where oleo names the image file, so oleo on image files is compared
//! with the kernel's output with each loop device replaced by its image (oleo on the loop
//! devices themselves is compared unchanged, tables included). `show` on images prints
//! progs's unmounted form and on a mount its mounted form: both are compared with progs's
//! mounted output, which reads the same for a complete set.
//!
//! The kernel mount is read-only on writable loop devices: a read-only loop device makes
//! the kernel mark every block group read-only and reduce its data profile to single,
//! which changes "Free (statfs, df)"; oleo reports what a writable mount reports.
//!
//! Needs root, loop devices, kernel btrfs and FUSE: a skip elsewhere, a failure under CI=true.

use std::path::{Path, PathBuf};
use std::process::Command;

use oleo_testkit::multi_device::{fill, mkfs_set, KernelSet};
use oleo_testkit::*;

const OLEO: &str = env!("CARGO_BIN_EXE_oleo");

/// The option sets each tool runs with (the mount point or `--image`s follow).
const VIEWS: &[&[&str]] = &[
    &["show"],
    &["show", "--raw"],
    &["df"],
    &["df", "-k"],
    &["df", "-H"],
    &["usage"],
    &["usage", "-T"],
    &["usage", "-b"],
    &["usage", "-m", "-T"],
    &["usage", "--si", "-g"],
];

/// A set: `ndevs` images of `size` bytes (or of `sizes`), `mkfs.btrfs -d DATA -m METADATA`.
struct Set {
    name: &'static str,
    ndevs: usize,
    size: u64,
    /// Sizes of the images, when they differ (then `ndevs` and `size` are not used).
    sizes: &'static [u64],
    data: &'static str,
    metadata: &'static str,
    /// Images to make bigger after mkfs: (index, new size), a device with slack.
    grow: &'static [(usize, u64)],
    /// Members the degraded comparison leaves out (none: no degraded comparison).
    leave_out: &'static [usize],
    /// Also compare through an oleo FUSE mount.
    fuse: bool,
    /// After the fill, convert one data chunk to this profile (`btrfs balance start
    /// -dconvert=P,limit=1`): a mix of profiles.
    convert_one: Option<&'static str>,
}

impl Set {
    const fn new(name: &'static str, ndevs: usize, size: u64, data: &'static str) -> Set {
        Set {
            name,
            ndevs,
            size,
            sizes: &[],
            data,
            metadata: data,
            grow: &[],
            leave_out: &[],
            fuse: false,
            convert_one: None,
        }
    }
}

/// Images of different sizes, `mkfs.btrfs -f -q -d DATA -m METADATA` over all.
fn mkfs_unequal(dir: &Path, set: &Set) -> Vec<PathBuf> {
    let images: Vec<PathBuf> = (1..=set.sizes.len())
        .map(|i| dir.join(format!("{}-{i}.img", set.name)))
        .collect();
    for (img, &size) in images.iter().zip(set.sizes) {
        std::fs::File::create(img).unwrap().set_len(size).unwrap();
    }
    let mkfs = oleo_testkit::env::mkfs_btrfs_for(&[]).unwrap_or_else(|| "mkfs.btrfs".into());
    run(Command::new(mkfs)
        .args(["-f", "-q", "-d", set.data, "-m", set.metadata])
        .args(&images));
    images
}

const MIB: u64 = 1 << 20;

struct Output {
    stdout: String,
    stderr: String,
}

fn run(cmd: &mut Command) -> Output {
    let described = format!("{cmd:?}");
    let out = cmd.output().unwrap_or_else(|e| panic!("{described}: {e}"));
    let o = Output {
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    assert!(
        out.status.success(),
        "{described} failed ({}):\n{}{}",
        out.status,
        o.stdout,
        o.stderr
    );
    o
}

/// `btrfs filesystem VIEW MNT`. btrfs-progs scans every block device to find the mount's
/// members; a loop device another test detaches or attaches at that moment can make one
/// scan fail ("not a valid btrfs filesystem", seen once in CI), so a failure is tried again.
fn btrfs(view: &[&str], mnt: &Path) -> Output {
    for _ in 0..3 {
        let out = Command::new("btrfs")
            .arg("filesystem")
            .args(view)
            .arg(mnt)
            .output()
            .unwrap();
        if out.status.success() {
            return Output {
                stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
                stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            };
        }
        std::thread::sleep(std::time::Duration::from_millis(300));
    }
    run(Command::new("btrfs").arg("filesystem").args(view).arg(mnt))
}

/// `oleo filesystem VIEW --image A --image B ...`.
fn oleo_images(view: &[&str], images: &[PathBuf]) -> Output {
    let mut c = Command::new(OLEO);
    c.arg("filesystem").args(view);
    for i in images {
        c.arg("--image").arg(i);
    }
    // The engine's warning about a degraded open is not progs's output.
    c.env("RUST_LOG", "error");
    run(&mut c)
}

/// `oleo filesystem VIEW MNT`.
fn oleo_mount(view: &[&str], mnt: &Path) -> Output {
    run(Command::new(OLEO)
        .arg("filesystem")
        .args(view)
        .arg(mnt)
        .env("RUST_LOG", "error"))
}

/// The stderr lines progs prints about mixed profiles (df only); nothing else is expected.
fn warnings(o: &Output) -> Vec<&str> {
    o.stderr
        .lines()
        .filter(|l| l.starts_with("WARNING:"))
        .collect()
}

/// Replaces each device path by its image (longest first: /dev/loop1 is in /dev/loop10).
fn substitute(text: &str, map: &[(String, String)]) -> String {
    let mut pairs: Vec<&(String, String)> = map.iter().collect();
    pairs.sort_by_key(|(from, _)| std::cmp::Reverse(from.len()));
    let mut out = text.to_string();
    for (i, (from, _)) in pairs.iter().enumerate() {
        out = out.replace(from.as_str(), &format!("\u{0}{i}\u{0}"));
    }
    for (i, (_, to)) in pairs.iter().enumerate() {
        out = out.replace(&format!("\u{0}{i}\u{0}"), to);
    }
    out
}

/// Collects every mismatch instead of stopping at the first.
#[derive(Default)]
struct Diffs(Vec<String>);

impl Diffs {
    fn check(&mut self, what: &str, want: &str, got: &str) {
        if want != got {
            self.0.push(format!(
                "{what}: differs\n--- btrfs\n{want}--- oleo\n{got}---"
            ));
        }
    }

    fn check_output(&mut self, what: &str, want: &Output, got: &Output, map: &[(String, String)]) {
        self.check(what, &substitute(&want.stdout, map), &got.stdout);
        let (w, g) = (warnings(want), warnings(got));
        if w != g {
            self.0
                .push(format!("{what}: warnings differ: btrfs {w:?}, oleo {g:?}"));
        }
    }

    fn assert_none(self, set: &str) {
        assert!(
            self.0.is_empty(),
            "{set}: {} differences\n{}",
            self.0.len(),
            self.0.join("\n")
        );
    }
}

/// `oleo mount -o ro[,degraded] A B ... MNT`, unmounted on drop.
struct FuseMount {
    mnt: PathBuf,
}

impl FuseMount {
    fn mount(images: &[PathBuf], mnt: &Path, degraded: bool) -> FuseMount {
        let mut c = Command::new(OLEO);
        c.arg("mount")
            .arg("-o")
            .arg(if degraded { "ro,degraded" } else { "ro" })
            .args(images)
            .arg(mnt)
            .env("RUST_LOG", "error");
        run(&mut c);
        assert!(
            is_mounted(mnt),
            "oleo mount returned but {mnt:?} is not mounted"
        );
        FuseMount {
            mnt: mnt.to_path_buf(),
        }
    }
}

impl Drop for FuseMount {
    fn drop(&mut self) {
        for _ in 0..50 {
            if !is_mounted(&self.mnt) {
                return;
            }
            let _ = Command::new("umount").arg(&self.mnt).status();
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
    }
}

/// A read-only kernel mount on writable loop devices (see the module comment), of the
/// members in `present`; unmounted, then the loop devices forgotten and detached, on drop.
struct KernelRo {
    mnt: PathBuf,
    loops: Vec<LoopDevice>,
}

impl KernelRo {
    fn mount(images: &[PathBuf], mnt: &Path, degraded: bool) -> KernelRo {
        let loops: Vec<LoopDevice> = images
            .iter()
            .map(|i| LoopDevice::attach(i, false).expect("losetup"))
            .collect();
        let mut opts = vec!["ro".to_string()];
        if degraded {
            opts.push("degraded".into());
        }
        opts.extend(
            loops[1..]
                .iter()
                .map(|l| format!("device={}", l.path().display())),
        );
        run(Command::new("mount")
            .args(["-t", "btrfs", "-o", &opts.join(",")])
            .arg(loops[0].path())
            .arg(mnt));
        KernelRo {
            mnt: mnt.to_path_buf(),
            loops,
        }
    }

    fn devices(&self) -> Vec<PathBuf> {
        self.loops.iter().map(|l| l.path().to_path_buf()).collect()
    }
}

impl Drop for KernelRo {
    fn drop(&mut self) {
        for _ in 0..50 {
            if !is_mounted(&self.mnt) {
                break;
            }
            let _ = Command::new("umount").arg(&self.mnt).status();
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        // The loop devices go after the unmount (LoopDevice's drop forgets and detaches).
        self.loops.clear();
    }
}

/// A table (`-T`) aligns its columns on the longest device path: when the loop devices oleo
/// read have names of another length than the kernel's (another test took a loop device
/// in between, loop9 against loop10), the columns differ in width and nothing else.
fn misaligned(view: &[&str], map: &[(String, String)]) -> bool {
    view.contains(&"-T") && map.iter().any(|(k, o)| k.len() != o.len())
}

/// A scrub report without what changes from run to run (start time, duration, rate).
fn scrub_report(text: &str) -> String {
    text.lines()
        .filter(|l| {
            !["Scrub started:", "Duration:", "Rate:"]
                .iter()
                .any(|f| l.starts_with(f))
        })
        .map(|l| format!("{l}\n"))
        .collect()
}

/// `btrfs scrub start -Br [-d]` on a read-only kernel mount against `oleo scrub start -r
/// [-d]` on the image files: the same summary (and nothing else), the same "Total to scrub"
/// (every copy counted, per device with -d).
fn check_scrub(images: &[PathBuf], mnt: &Path, dir: &TempDir, diffs: &mut Diffs) {
    let state = dir.subdir("state").unwrap();
    for per_device in [false, true] {
        let flags: &[&str] = if per_device { &["-Br", "-d"] } else { &["-Br"] };
        let k = KernelRo::mount(images, mnt, false);
        let want = run(Command::new("btrfs")
            .args(["scrub", "start"])
            .args(flags)
            .arg(mnt));
        let names: Vec<(String, String)> = k
            .devices()
            .iter()
            .zip(images)
            .map(|(d, i)| (d.display().to_string(), i.display().to_string()))
            .collect();
        drop(k);
        let mut c = Command::new(OLEO);
        c.args(["scrub", "start", "-r"])
            .env("XDG_STATE_HOME", &state);
        if per_device {
            c.arg("-d");
        }
        for i in images {
            c.arg("--image").arg(i);
        }
        let got = run(&mut c);
        diffs.check(
            &format!("scrub {flags:?}"),
            &substitute(&scrub_report(&want.stdout), &names),
            &scrub_report(&got.stdout),
        );
        diffs.check(&format!("scrub {flags:?} stderr"), "", &got.stderr);
    }
}

/// `btrfs subvolume list` (plain and `-a`) on a read-only kernel mount against `oleo
/// subvolume list --image A --image B ...`: every device of the set given.
fn check_subvolume_list(images: &[PathBuf], mnt: &Path, diffs: &mut Diffs) {
    let k = KernelRo::mount(images, mnt, false);
    let want: Vec<Output> = [&[][..], &["-a"][..]]
        .iter()
        .map(|flags| {
            run(Command::new("btrfs")
                .args(["subvolume", "list"])
                .args(*flags)
                .arg(mnt))
        })
        .collect();
    drop(k);
    for (flags, want) in [&[][..], &["-a"][..]].iter().zip(&want) {
        let mut c = Command::new(OLEO);
        c.args(["subvolume", "list"]).args(*flags);
        for i in images {
            c.arg("--image").arg(i);
        }
        let got = run(&mut c);
        diffs.check(
            &format!("subvolume list {flags:?}"),
            &want.stdout,
            &got.stdout,
        );
    }
}

/// What btrfs prints for each view on a kernel mount of `images` (loop device paths), and
/// what oleo prints on the same loop devices before the mount.
fn kernel_and_loops(
    images: &[PathBuf],
    mnt: &Path,
    degraded: bool,
) -> (Vec<Output>, Vec<Output>, Vec<(String, String)>) {
    let k = KernelRo::mount(images, mnt, degraded);
    let devices = k.devices();
    let btrfs_out: Vec<Output> = VIEWS.iter().map(|v| btrfs(v, mnt)).collect();
    drop(k);
    // Attached again after the kernel let go: oleo reads the members as block devices.
    let loops: Vec<LoopDevice> = images
        .iter()
        .map(|i| LoopDevice::attach(i, false).expect("losetup"))
        .collect();
    let paths: Vec<PathBuf> = loops.iter().map(|l| l.path().to_path_buf()).collect();
    let oleo_out: Vec<Output> = VIEWS.iter().map(|v| oleo_images(v, &paths)).collect();
    // The kernel's loop names now stand for these.
    let map = devices
        .iter()
        .zip(&paths)
        .map(|(k, o)| (k.display().to_string(), o.display().to_string()))
        .collect();
    drop(loops);
    (btrfs_out, oleo_out, map)
}

fn check_set(set: &Set) {
    let what = format!("filesystem_cmd {}", set.name);
    if !(require_root(&what) && require_fuse(&what)) {
        return;
    }
    let dir = TempDir::new(&format!("fscmd-{}", set.name)).unwrap();
    let base = std::fs::canonicalize(dir.path()).unwrap();
    let images = if set.sizes.is_empty() {
        mkfs_set(&base, set.name, set.ndevs, set.size, set.data, set.metadata).expect("mkfs.btrfs")
    } else {
        mkfs_unequal(&base, set)
    };
    for &(i, size) in set.grow {
        std::fs::OpenOptions::new()
            .write(true)
            .open(&images[i])
            .and_then(|f| f.set_len(size))
            .unwrap();
    }
    let mnt = dir.subdir("mnt").unwrap();
    {
        let k = KernelSet::mount(&images, &[], &mnt, &[]).expect("kernel mount");
        fill(k.root(), seed(0x5eed)).expect("fill");
        // Subvolumes for `subvolume list` to list.
        run(Command::new("btrfs")
            .args(["subvolume", "create"])
            .arg(k.root().join("sv")));
        run(Command::new("btrfs")
            .args(["subvolume", "snapshot", "-r"])
            .arg(k.root())
            .arg(k.root().join("snap")));
        k.unmount().expect("kernel unmount");
    }
    if let Some(profile) = set.convert_one {
        let k = KernelSet::mount(&images, &[], &mnt, &[]).expect("kernel mount");
        run(Command::new("btrfs")
            .args(["balance", "start", &format!("-dconvert={profile},limit=1")])
            .arg(k.root()));
        k.unmount().expect("kernel unmount");
    }
    let mut diffs = Diffs::default();

    // The whole set: loop devices (exact), image files and a FUSE mount (paths substituted).
    let (kernel, on_loops, loop_map) = kernel_and_loops(&images, &mnt, false);
    if set.convert_one.is_some() {
        let df = VIEWS.iter().position(|v| *v == ["df"]).unwrap();
        assert!(
            !warnings(&kernel[df]).is_empty(),
            "{}: the balance left no second profile:\n{}",
            set.name,
            kernel[df].stdout
        );
    }
    for ((view, k), o) in VIEWS.iter().zip(&kernel).zip(&on_loops) {
        if misaligned(view, &loop_map) {
            continue;
        }
        diffs.check_output(&format!("{view:?} on loop devices"), k, o, &loop_map);
    }
    let image_map: Vec<(String, String)> = loop_map
        .iter()
        .zip(&images)
        .map(|((_, dev), img)| (dev.clone(), img.display().to_string()))
        .collect();
    let kernel_names: Vec<(String, String)> = loop_map
        .iter()
        .zip(&image_map)
        .map(|((k, _), (_, img))| (k.clone(), img.clone()))
        .collect();
    for (view, k) in VIEWS.iter().zip(&kernel) {
        // Tables align on the longest path: only compared on loop devices.
        if view.contains(&"-T") {
            continue;
        }
        let o = oleo_images(view, &images);
        diffs.check_output(&format!("{view:?} on image files"), k, &o, &kernel_names);
    }
    if set.fuse {
        let fuse_mnt = dir.subdir("fuse").unwrap();
        let m = FuseMount::mount(&images, &fuse_mnt, false);
        for (view, k) in VIEWS.iter().zip(&kernel) {
            if view.contains(&"-T") {
                continue;
            }
            let o = oleo_mount(view, &fuse_mnt);
            diffs.check_output(&format!("{view:?} on a FUSE mount"), k, &o, &kernel_names);
        }
        drop(m);
    }

    check_scrub(&images, &mnt, &dir, &mut diffs);
    check_subvolume_list(&images, &mnt, &mut diffs);

    // Degraded: members left out, on both sides.
    if !set.leave_out.is_empty() {
        let present: Vec<PathBuf> = images
            .iter()
            .enumerate()
            .filter(|(i, _)| !set.leave_out.contains(i))
            .map(|(_, p)| p.clone())
            .collect();
        let (kernel, on_loops, loop_map) = kernel_and_loops(&present, &mnt, true);
        for ((view, k), o) in VIEWS.iter().zip(&kernel).zip(&on_loops) {
            // Images: progs's unmounted `show` (no MISSING lines); compared on the mount.
            if view[0] == "show" || misaligned(view, &loop_map) {
                continue;
            }
            diffs.check_output(
                &format!("{view:?} degraded, on loop devices"),
                k,
                o,
                &loop_map,
            );
        }
        if set.fuse {
            let kernel_names: Vec<(String, String)> = loop_map
                .iter()
                .zip(&present)
                .map(|((k, _), img)| (k.clone(), img.display().to_string()))
                .collect();
            let fuse_mnt = dir.subdir("fuse").unwrap();
            let m = FuseMount::mount(&present, &fuse_mnt, true);
            for (view, k) in VIEWS.iter().zip(&kernel) {
                if view.contains(&"-T") {
                    continue;
                }
                let o = oleo_mount(view, &fuse_mnt);
                diffs.check_output(
                    &format!("{view:?} degraded, on a FUSE mount"),
                    k,
                    &o,
                    &kernel_names,
                );
            }
            drop(m);
        }
    }
    diffs.assert_none(set.name);
}

#[test]
fn single_device_default_mkfs() {
    check_set(&Set {
        grow: &[(0, 800 * MIB)],
        fuse: true,
        metadata: "dup",
        ..Set::new("single", 1, 768 * MIB, "single")
    });
}

#[test]
fn raid1_on_two_devices() {
    check_set(&Set {
        leave_out: &[1],
        fuse: true,
        ..Set::new("raid1", 2, 1024 * MIB, "raid1")
    });
}

#[test]
fn raid10_on_four_devices() {
    check_set(&Set::new("raid10", 4, 512 * MIB, "raid10"));
}

#[test]
fn raid1c3_on_three_devices_one_bigger() {
    check_set(&Set {
        grow: &[(2, 700 * MIB)],
        leave_out: &[0],
        ..Set::new("raid1c3", 3, 640 * MIB, "raid1c3")
    });
}

#[test]
fn raid0_data_raid1_metadata_on_three_devices() {
    check_set(&Set {
        metadata: "raid1",
        fuse: true,
        ..Set::new("raid0-raid1", 3, 1024 * MIB, "raid0")
    });
}

#[test]
fn dup_metadata_on_two_devices() {
    check_set(&Set {
        metadata: "dup",
        ..Set::new("dup", 2, 700 * MIB, "single")
    });
}

#[test]
fn raid1_on_three_unequal_devices() {
    check_set(&Set {
        sizes: &[600 * MIB, 900 * MIB, 1500 * MIB],
        ..Set::new("raid1-unequal", 3, 0, "raid1")
    });
}

#[test]
fn raid1_with_one_data_chunk_converted_to_single() {
    check_set(&Set {
        convert_one: Some("single"),
        fuse: true,
        ..Set::new("raid1-mixed", 2, 1024 * MIB, "raid1")
    });
}
