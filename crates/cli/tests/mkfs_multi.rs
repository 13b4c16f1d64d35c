//! `oleo mkfs` with several devices and every RAID profile, against the kernel and
//! btrfs-progs:
//! 1. `oleo mkfs -m M -d D IMG...` on sparse images; each image's superblock (progs'
//!    `dump-super`) says which device it is of how many;
//! 2. RAID5/6 metadata: the kernel mounts the set read-only and degraded with each device
//!    (RAID6: each pair) left out, so every tree block on it is rebuilt from the parity
//!    mkfs wrote;
//! 3. every image on a loop device (progs finds the other members of a set among block
//!    devices only), `btrfs check` clean on every member; the kernel mounts the set
//!    (`device=` for each member), writes a few MiB, `btrfs filesystem df/show` report the
//!    profiles and devices; after umount `btrfs check --check-data-csum` is clean again,
//!    and oleo opens the set and reads back what the kernel wrote;
//! 4. for RAID1 on 2 devices and RAID10 on 4 (and a few more), the chunk and device trees
//!    and the summary equal what mkfs.btrfs writes and prints for the same sizes;
//! 5. what must be refused (too few devices for a profile, a device given twice, a device
//!    that is mounted, --rootdir with several devices) is, naming the device.
//!
//! Everything here needs root, loop devices, kernel btrfs and btrfs-progs: without them a
//! test prints `SKIP: ...` (a failure under `CI=true`).

use oleo::{Filesystem, OpenOptions};
use oleo_testkit::mount::LoopDevice;
use oleo_testkit::ops::pattern;
use oleo_testkit::{require_root, KernelMount, TempDir};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const OLEO: &str = env!("CARGO_BIN_EXE_oleo");
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

fn run(cmd: &mut Command) -> (bool, String) {
    let desc = format!("{cmd:?}");
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{desc}: {e}"));
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(!text.contains("panicked"), "{desc} panicked:\n{text}");
    (out.status.success(), text)
}

fn run_ok(cmd: &mut Command) -> String {
    let desc = format!("{cmd:?}");
    let (ok, text) = run(cmd);
    assert!(ok, "{desc} failed:\n{text}");
    text
}

/// `n` sparse images of `size` bytes in `tmp`, named by `prefix`.
fn images(tmp: &TempDir, prefix: &str, sizes: &[u64]) -> Vec<PathBuf> {
    sizes
        .iter()
        .enumerate()
        .map(|(i, &size)| {
            let p = tmp.join(format!("{prefix}{}.img", i + 1));
            std::fs::File::create(&p).unwrap().set_len(size).unwrap();
            p
        })
        .collect()
}

/// Attaches every image (read-only or not) to a loop device.
fn attach(images: &[PathBuf], read_only: bool) -> Vec<LoopDevice> {
    images
        .iter()
        .map(|i| LoopDevice::attach(i, read_only).unwrap_or_else(|e| panic!("losetup {i:?}: {e}")))
        .collect()
}

fn device_opts(loops: &[&LoopDevice]) -> String {
    loops
        .iter()
        .map(|l| format!("device={}", l.path().display()))
        .collect::<Vec<_>>()
        .join(",")
}

/// A kernel mount of a set of loop devices; unmounted on drop.
struct SetMount {
    mnt: PathBuf,
    mounted: bool,
}

impl SetMount {
    fn mount(loops: &[&LoopDevice], mnt: &Path, opts: &str) -> Result<SetMount, String> {
        std::fs::create_dir_all(mnt).unwrap();
        let o = format!("{opts},{}", device_opts(loops));
        let (ok, text) = run(Command::new("mount")
            .args(["-t", "btrfs", "-o", &o])
            .arg(loops[0].path())
            .arg(mnt));
        if !ok {
            let (_, dmesg) = run(Command::new("dmesg").arg("-t"));
            let tail: Vec<&str> = dmesg.lines().rev().take(8).collect();
            return Err(format!("mount -o {o}: {text}\nkernel: {tail:?}"));
        }
        Ok(SetMount {
            mnt: mnt.to_path_buf(),
            mounted: true,
        })
    }

    fn unmount(mut self) {
        self.mounted = false;
        run_ok(Command::new("umount").arg(&self.mnt));
    }
}

impl Drop for SetMount {
    fn drop(&mut self) {
        if self.mounted {
            let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
        }
    }
}

/// `btrfs check --readonly` on `dev` (a member of a set whose other members are attached
/// too): exit 0 and nothing suspicious. progs probes every block device for the other
/// members; one of someone else's that is being set up or torn down answers "ERROR: cannot
/// scan /dev/loopN", which is not about this set.
fn check(dev: &Path, ours: &[&LoopDevice], data_csum: bool, when: &str) {
    let mut cmd = Command::new("btrfs");
    cmd.args(["check", "--readonly"]);
    if data_csum {
        cmd.arg("--check-data-csum");
    }
    let (ok, text) = run(cmd.arg(dev));
    let ours: Vec<String> = ours
        .iter()
        .map(|l| l.path().display().to_string())
        .collect();
    let bad: Vec<&str> = text
        .lines()
        .filter(|l| {
            let low = l.to_ascii_lowercase();
            let foreign = l
                .strip_prefix("ERROR: cannot scan ")
                .and_then(|r| r.split(':').next())
                .is_some_and(|d| !ours.iter().any(|o| o == d));
            !foreign
                && ((low.contains("error") && !low.contains("no error"))
                    || low.contains("warning")
                    || low.contains("mismatch")
                    || low.contains("wrong")
                    || low.contains("missing"))
        })
        .collect();
    assert!(
        ok && bad.is_empty(),
        "btrfs check of {} {when}: ok={ok}, suspicious {bad:?}\n{text}",
        dev.display()
    );
}

/// One profile pair on `sizes.len()` devices.
struct Case {
    name: &'static str,
    sizes: &'static [u64],
    /// `-m` and `-d` as given on the command line (None: the default).
    metadata: Option<&'static str>,
    data: Option<&'static str>,
    /// The profiles `btrfs filesystem df` must show.
    want_metadata: &'static str,
    want_data: &'static str,
}

fn oleo_mkfs(case: &Case, images: &[PathBuf]) -> String {
    let mut cmd = Command::new(OLEO);
    cmd.arg("mkfs");
    if let Some(m) = case.metadata {
        cmd.args(["-m", m]);
    }
    if let Some(d) = case.data {
        cmd.args(["-d", d]);
    }
    run_ok(cmd.args(images))
}

/// The summary lists every device and the profiles.
fn check_summary(case: &Case, out: &str, images: &[PathBuf]) {
    let name = case.name;
    assert!(
        out.contains(&format!("Number of devices:  {}\n", images.len())),
        "{name}:\n{out}"
    );
    assert!(
        out.contains("Devices:\n   ID        SIZE  PATH\n"),
        "{name}:\n{out}"
    );
    for (i, img) in images.iter().enumerate() {
        let line = format!("  {:>3}  ", i + 1);
        assert!(
            out.lines()
                .any(|l| l.starts_with(&line) && l.ends_with(&img.display().to_string())),
            "{name}: no device line for {}:\n{out}",
            img.display()
        );
    }
    let profile_line =
        |kind: &str, p: &str| format!("  {kind}:{}{p:<8} ", " ".repeat(17 - kind.len()));
    assert!(
        out.contains(&profile_line("Metadata", case.want_metadata)),
        "{name}:\n{out}"
    );
    assert!(
        out.contains(&profile_line("System", case.want_metadata)),
        "{name}:\n{out}"
    );
    assert!(
        out.contains(&profile_line("Data", case.want_data)),
        "{name}:\n{out}"
    );
}

/// progs' dump-super of each image: which device of how many, the same fsid everywhere.
fn check_supers(case: &Case, images: &[PathBuf]) {
    let total: u64 = case.sizes.iter().sum();
    let mut fsid = None;
    let mut dev_uuids = Vec::new();
    for (i, img) in images.iter().enumerate() {
        let text = run_ok(
            Command::new("btrfs")
                .args(["inspect-internal", "dump-super"])
                .arg(img),
        );
        let field = |k: &str| -> String {
            text.lines()
                .filter_map(|l| l.trim().split_once(char::is_whitespace))
                .find(|(key, _)| *key == k)
                .map(|(_, v)| v.trim().to_string())
                .unwrap_or_else(|| panic!("{}: no {k} in dump-super:\n{text}", case.name))
        };
        assert_eq!(
            field("num_devices"),
            images.len().to_string(),
            "{}",
            case.name
        );
        assert_eq!(field("total_bytes"), total.to_string(), "{}", case.name);
        assert_eq!(
            field("dev_item.devid"),
            (i + 1).to_string(),
            "{}",
            case.name
        );
        assert_eq!(
            field("dev_item.total_bytes"),
            case.sizes[i].to_string(),
            "{}",
            case.name
        );
        let f = field("fsid");
        assert_eq!(fsid.get_or_insert(f.clone()), &f, "{}: fsid", case.name);
        dev_uuids.push(field("dev_item.uuid"));
    }
    dev_uuids.sort();
    dev_uuids.dedup();
    assert_eq!(dev_uuids.len(), images.len(), "{}: device uuids", case.name);
}

/// Every set of devices a profile with `tolerated` failures survives losing, as lists of
/// indexes: each device alone, or each pair.
fn losses(n: usize, tolerated: usize) -> Vec<Vec<usize>> {
    match tolerated {
        1 => (0..n).map(|i| vec![i]).collect(),
        _ => (0..n)
            .flat_map(|i| (i + 1..n).map(move |j| vec![i, j]))
            .collect(),
    }
}

/// The kernel mounts the fresh set read-only with `lost` left out: the tree blocks on the
/// missing devices come back from parity (or from the other copies).
fn degraded_mounts(case: &Case, tmp: &TempDir, images: &[PathBuf], tolerated: usize) {
    for lost in losses(images.len(), tolerated) {
        let present: Vec<PathBuf> = (0..images.len())
            .filter(|i| !lost.contains(i))
            .map(|i| images[i].clone())
            .collect();
        let loops = attach(&present, true);
        let refs: Vec<&LoopDevice> = loops.iter().collect();
        let mnt = tmp.join("degraded");
        let m = SetMount::mount(&refs, &mnt, "ro,degraded").unwrap_or_else(|e| {
            panic!(
                "{}: degraded mount without device(s) {lost:?} failed: {e}",
                case.name
            )
        });
        assert_eq!(std::fs::read_dir(&mnt).unwrap().count(), 0, "{}", case.name);
        let df = run_ok(Command::new("btrfs").args(["filesystem", "df"]).arg(&mnt));
        assert!(
            df.contains(&format!("Metadata, {}:", case.want_metadata)),
            "{}: {df}",
            case.name
        );
        m.unmount();
    }
}

fn round_trip(case: &Case) {
    if !require_root(&format!("mkfs_multi {}", case.name)) {
        return;
    }
    let tmp = TempDir::new(&format!("mkfs-multi-{}", case.name)).unwrap();
    let imgs = images(&tmp, "dev", case.sizes);
    let out = oleo_mkfs(case, &imgs);
    check_summary(case, &out, &imgs);
    check_supers(case, &imgs);

    let tolerated = match case.want_metadata {
        "RAID5" => Some(1),
        "RAID6" => Some(2),
        _ => None,
    };
    if let Some(t) = tolerated {
        degraded_mounts(case, &tmp, &imgs, t);
    }

    let loops = attach(&imgs, false);
    let refs: Vec<&LoopDevice> = loops.iter().collect();
    for l in &loops {
        check(l.path(), &refs, false, "of the fresh set");
    }
    let mnt = tmp.join("mnt");
    let m =
        SetMount::mount(&refs, &mnt, "rw,noatime").unwrap_or_else(|e| panic!("{}: {e}", case.name));
    let data = pattern(case.sizes.len() as u64, 6 * MIB as usize);
    {
        use std::io::Write;
        let mut f = std::fs::File::create(mnt.join("data.bin")).unwrap();
        f.write_all(&data).unwrap();
        f.sync_all().unwrap();
    }
    std::fs::write(mnt.join("small.txt"), b"written by the kernel\n").unwrap();
    run_ok(Command::new("sync").arg("-f").arg(&mnt));
    let df = run_ok(Command::new("btrfs").args(["filesystem", "df"]).arg(&mnt));
    for (kind, want) in [
        ("Data", case.want_data),
        ("Metadata", case.want_metadata),
        ("System", case.want_metadata),
    ] {
        let lines: Vec<&str> = df
            .lines()
            .filter(|l| l.starts_with(&format!("{kind},")))
            .collect();
        assert!(
            !lines.is_empty()
                && lines
                    .iter()
                    .all(|l| l.starts_with(&format!("{kind}, {want}:"))),
            "{}: {kind} is not all {want}:\n{df}",
            case.name
        );
    }
    let show = run_ok(Command::new("btrfs").args(["filesystem", "show"]).arg(&mnt));
    assert!(
        show.contains(&format!("Total devices {} ", imgs.len())),
        "{}: {show}",
        case.name
    );
    for (i, l) in loops.iter().enumerate() {
        let line = format!("devid {:>4} size ", i + 1);
        assert!(
            show.lines()
                .any(|s| s.contains(&line) && s.ends_with(&l.path().display().to_string())),
            "{}: device {} not shown:\n{show}",
            case.name,
            l.path().display()
        );
    }
    m.unmount();
    for l in &loops {
        check(l.path(), &refs, true, "after the kernel wrote to the set");
    }
    drop(refs);
    drop(loops);
    // oleo opens the set too and reads back what the kernel wrote.
    let fs = Filesystem::open(
        &imgs[0],
        OpenOptions {
            devices: imgs[1..].to_vec(),
            ..OpenOptions::default()
        },
    )
    .unwrap_or_else(|e| panic!("{}: oleo cannot open the set: {e}", case.name));
    let id = fs.lookup(fs.root(), b"data.bin").unwrap();
    let mut got = Vec::new();
    while got.len() < data.len() {
        let chunk = fs.read(id, got.len() as u64, 1 << 20).unwrap();
        assert!(!chunk.is_empty(), "{}: short read", case.name);
        got.extend_from_slice(&chunk);
    }
    assert!(got == data, "{}: oleo reads other data", case.name);
}

macro_rules! cases {
    ($($test:ident: $case:expr;)*) => {$(
        #[test]
        fn $test() {
            round_trip(&$case);
        }
    )*};
}

cases! {
    raid1_on_2: Case {
        name: "raid1-x2",
        sizes: &[GIB, GIB],
        metadata: Some("raid1"),
        data: Some("raid1"),
        want_metadata: "RAID1",
        want_data: "RAID1",
    };
    raid10_on_4: Case {
        name: "raid10-x4",
        sizes: &[GIB, GIB, GIB, GIB],
        metadata: Some("raid10"),
        data: Some("RAID10"),
        want_metadata: "RAID10",
        want_data: "RAID10",
    };
    raid1c3_on_3: Case {
        name: "raid1c3-x3",
        sizes: &[GIB, GIB, GIB],
        metadata: Some("raid1c3"),
        data: Some("raid1c3"),
        want_metadata: "RAID1C3",
        want_data: "RAID1C3",
    };
    raid1c4_on_4: Case {
        name: "raid1c4-x4",
        sizes: &[GIB, GIB, GIB, GIB],
        metadata: Some("raid1c4"),
        data: Some("raid1c4"),
        want_metadata: "RAID1C4",
        want_data: "RAID1C4",
    };
    raid0_data_on_3: Case {
        name: "raid0-raid1-x3",
        sizes: &[GIB, GIB, GIB],
        metadata: Some("raid1"),
        data: Some("raid0"),
        want_metadata: "RAID1",
        want_data: "RAID0",
    };
    raid0_metadata_on_3: Case {
        name: "raid0-x3",
        sizes: &[GIB, GIB, 768 * MIB],
        metadata: Some("raid0"),
        data: Some("raid0"),
        want_metadata: "RAID0",
        want_data: "RAID0",
    };
    raid5_data_on_3: Case {
        name: "raid5-raid1-x3",
        sizes: &[GIB, GIB, GIB],
        metadata: Some("raid1"),
        data: Some("raid5"),
        want_metadata: "RAID1",
        want_data: "RAID5",
    };
    raid6_data_on_4: Case {
        name: "raid6-raid1c3-x4",
        sizes: &[GIB, GIB, GIB, GIB],
        metadata: Some("raid1c3"),
        data: Some("raid6"),
        want_metadata: "RAID1C3",
        want_data: "RAID6",
    };
    raid5_metadata_on_3: Case {
        name: "raid5-x3",
        sizes: &[GIB, GIB, GIB],
        metadata: Some("raid5"),
        data: Some("raid5"),
        want_metadata: "RAID5",
        want_data: "RAID5",
    };
    raid6_metadata_on_4: Case {
        name: "raid6-x4",
        sizes: &[GIB, GIB, GIB, GIB],
        metadata: Some("raid6"),
        data: Some("raid6"),
        want_metadata: "RAID6",
        want_data: "RAID6",
    };
    dup_metadata_on_2: Case {
        name: "dup-single-x2",
        sizes: &[GIB, 512 * MIB],
        metadata: Some("dup"),
        data: Some("single"),
        want_metadata: "DUP",
        want_data: "single",
    };
    defaults_on_2: Case {
        name: "defaults-x2",
        sizes: &[GIB, GIB],
        metadata: None,
        data: None,
        want_metadata: "RAID1",
        want_data: "single",
    };
}

/// The items of a `dump-tree` listing that say where things are: chunk items, dev items
/// and dev extents with their keys, without uuids, tree block headers, item offsets and
/// the device statistics (mkfs.btrfs writes none, oleo zeroed ones).
fn placement(dump: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut keep = false;
    for line in dump.lines() {
        let t = line.trim();
        if t.starts_with("item ") {
            let key = t
                .split_once("key ")
                .and_then(|(_, k)| k.split(" itemoff").next())
                .unwrap_or(t);
            keep = !key.contains("PERSISTENT_ITEM");
            if keep {
                out.push(key.to_string());
            }
        } else if keep
            && !t.is_empty()
            && !t.contains("uuid")
            && !t.contains("fsid")
            && !t.starts_with("leaf ")
            && !t.starts_with("node ")
        {
            out.push(t.to_string());
        }
    }
    out
}

fn dump_tree(tree: &str, images: &[PathBuf]) -> String {
    run_ok(
        Command::new("btrfs")
            .args(["inspect-internal", "dump-tree", "--noscan", "-t", tree])
            .args(images),
    )
}

/// The summary lines that do not name this run (uuid, paths).
fn summary_lines(out: &str) -> Vec<String> {
    out.lines()
        .skip_while(|l| !l.starts_with("Label:"))
        .filter(|l| !l.starts_with("UUID:"))
        .map(|l| match l.rsplit_once("  ") {
            Some((head, path)) if path.ends_with(".img") => {
                format!(
                    "{head}  {}",
                    Path::new(path).file_name().unwrap().to_string_lossy()
                )
            }
            _ => l.to_string(),
        })
        .collect()
}

/// The same devices and profiles through mkfs.btrfs and through oleo: equal chunk trees,
/// device trees and summaries (mkfs.btrfs's temporary 4 MiB SYSTEM chunk, kept with `-m
/// single`, says sub_stripes 0 where oleo writes the kernel's 1; not among these cases).
fn same_as_mkfs_btrfs(name: &str, sizes: &[u64], args: &[&str]) {
    if !require_root(&format!("mkfs_multi {name} against mkfs.btrfs")) {
        return;
    }
    let tmp = TempDir::new(&format!("mkfs-multi-cmp-{name}")).unwrap();
    tmp.subdir("progs").unwrap();
    tmp.subdir("oleo").unwrap();
    // The same file names in two directories: the summaries name them alike.
    let progs: Vec<PathBuf> = images(&tmp, "progs/dev", sizes);
    let ours: Vec<PathBuf> = images(&tmp, "oleo/dev", sizes);
    let stdout = |cmd: &mut Command| {
        let desc = format!("{cmd:?}");
        let out = cmd.stdin(Stdio::null()).output().unwrap();
        assert!(
            out.status.success(),
            "{desc}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let progs_out = stdout(Command::new("mkfs.btrfs").arg("-f").args(args).args(&progs));
    let our_out = stdout(
        Command::new(OLEO)
            .args(["mkfs", "-f"])
            .args(args)
            .args(&ours),
    );
    for tree in ["chunk", "dev"] {
        let want = placement(&dump_tree(tree, &progs));
        let got = placement(&dump_tree(tree, &ours));
        assert!(
            !want.is_empty(),
            "{name}: empty {tree} tree from mkfs.btrfs"
        );
        assert_eq!(
            got, want,
            "{name}: the {tree} tree differs from mkfs.btrfs's (left oleo, right progs)"
        );
    }
    assert_eq!(
        summary_lines(&our_out),
        summary_lines(&progs_out),
        "{name}: summary (left oleo, right mkfs.btrfs)"
    );
}

#[test]
fn raid1_on_2_places_chunks_as_mkfs_btrfs() {
    same_as_mkfs_btrfs("raid1-x2", &[GIB, GIB], &["-m", "raid1", "-d", "raid1"]);
}

#[test]
fn raid10_on_4_places_chunks_as_mkfs_btrfs() {
    same_as_mkfs_btrfs(
        "raid10-x4",
        &[GIB, GIB, GIB, GIB],
        &["-m", "raid10", "-d", "raid10"],
    );
}

#[test]
fn mixed_sizes_place_chunks_as_mkfs_btrfs() {
    same_as_mkfs_btrfs(
        "raid1c3-raid6-mixed",
        &[GIB, 3 * GIB, 512 * MIB, 2 * GIB],
        &["-m", "raid1c3", "-d", "raid6"],
    );
    same_as_mkfs_btrfs("defaults-x3", &[GIB, 700 * MIB, 2 * GIB], &[]);
    same_as_mkfs_btrfs(
        "dup-raid0-x2",
        &[GIB, 2 * GIB],
        &["-m", "dup", "-d", "raid0"],
    );
}

#[test]
fn refuses_what_mkfs_btrfs_refuses() {
    let tmp = TempDir::new("mkfs-multi-refusals").unwrap();
    let a = tmp.join("a.img");
    let b = tmp.join("b.img");
    let mkfs = |args: &[&str], targets: &[&Path]| {
        run(Command::new(OLEO)
            .args(["mkfs", "--size", "256M"])
            .args(args)
            .args(targets))
    };
    for (args, n, want) in [
        (
            &["-m", "raid1c3"][..],
            2,
            "unable to create FS with metadata profile RAID1C3 (have 2 devices but 3 devices are required)",
        ),
        (
            &["-d", "raid10"],
            1,
            "unable to create FS with data profile RAID10 (have 1 devices but 2 devices are required)",
        ),
        (
            &["-d", "raid1c4", "-m", "raid6"],
            3,
            "unable to create FS with data profile RAID1C4 (have 3 devices but 4 devices are required)",
        ),
        (&["-m", "raid1"], 1, "metadata profile RAID1 (have 1 devices"),
        (&["-d", "raid7"], 2, "unknown data profile raid7"),
    ] {
        let targets: Vec<PathBuf> = (0..n).map(|i| tmp.join(format!("t{i}.img"))).collect();
        let refs: Vec<&Path> = targets.iter().map(PathBuf::as_path).collect();
        let (ok, text) = mkfs(args, &refs);
        assert!(!ok && text.contains(want), "{args:?} on {n}: {text}");
        assert!(
            targets.iter().all(|t| !t.exists()),
            "{args:?}: a refused mkfs created files"
        );
    }
    // The same device twice, under one name or two.
    let (ok, text) = mkfs(&[], &[&a, &b, &a]);
    assert!(!ok && text.contains("a.img is given twice"), "{text}");
    assert!(!a.exists() && !b.exists());
    std::fs::File::create(&a)
        .unwrap()
        .set_len(256 * MIB)
        .unwrap();
    let other_name = tmp.path().join(".").join("a.img");
    let (ok, text) = mkfs(&[], &[&a, &other_name]);
    assert!(!ok && text.contains("given twice"), "{text}");
    // --rootdir fills one device only (as with mkfs.btrfs).
    let (ok, text) = mkfs(&["--rootdir", "/etc/ssl"], &[&a, &b]);
    assert!(!ok && text.contains("limited to a single device"), "{text}");
    assert!(!b.exists());
}

#[test]
fn refuses_a_mounted_member() {
    if !require_root("mkfs_multi refuses_a_mounted_member") {
        return;
    }
    let tmp = TempDir::new("mkfs-multi-mounted").unwrap();
    let busy = tmp.join("busy.img");
    run_ok(
        Command::new(OLEO)
            .args(["mkfs", "-q", "--size", "256M"])
            .arg(&busy),
    );
    let km = KernelMount::mount(&busy, &tmp.join("mnt"), &["rw"]).unwrap();
    let fresh = tmp.join("fresh.img");
    // Through its loop device, and through its image file.
    for member in [km.device().to_path_buf(), busy.clone()] {
        let (ok, text) = run(Command::new(OLEO)
            .args(["mkfs", "-f", "--size", "256M"])
            .arg(&fresh)
            .arg(&member));
        assert!(
            !ok && text.contains(&member.display().to_string()) && text.contains("mounted"),
            "{}: {text}",
            member.display()
        );
        assert!(
            !fresh.exists(),
            "the refused mkfs left {} behind",
            fresh.display()
        );
    }
    km.unmount().unwrap();
}
