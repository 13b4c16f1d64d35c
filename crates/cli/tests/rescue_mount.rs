//! Rescue mounts (`-o rescue=...`, `-o sb=N`) of a kernel-made image damaged at known
//! places, one option per damage: without the option the mount refuses or the files fail to
//! read; with it oleo shows every file it still can (counted by walking the mount as a user
//! would, contents compared with what the kernel wrote), at least as many as `btrfs restore`
//! gets from the same image, and logs one line naming what it went around. The image's hash
//! is the same after every mount. A rescue option with `rw` is refused, as by the kernel.
//!
//! Needs root, FUSE, loop devices, kernel btrfs and btrfs-progs (a skip elsewhere, a failure
//! under CI=true).

use oleo_testkit::cmd::{require_tools, run_with_timeout, sh_ok};
use oleo_testkit::damage::{
    files_under, image_hash, leaf_holding, physical_copies, set_super_u64, super_field, write_at,
    write_every_copy,
};
use oleo_testkit::multi_device::file_logical_extents;
use oleo_testkit::{require_fuse_mount, KernelMount, OleoMount, TempDir};
use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const OLEO: &str = env!("CARGO_BIN_EXE_oleo");
const NODESIZE: usize = 16384;

const POPULATE: &str = r#"
set -e
mkdir d1 d2
for i in $(seq 1 300); do echo "file $i" > d1/f$i; echo "two $i" > d2/g$i; done
head -c 3000000 /dev/urandom > big
sync
echo last > last
"#;

/// Each file reached through a mount, with its bytes (None: the read failed).
type Seen = BTreeMap<PathBuf, Option<Vec<u8>>>;
/// Damages a copy of the image in place.
type Damage = Box<dyn Fn(&Fixture, &Path)>;

fn tools() -> bool {
    require_fuse_mount("rescue mounts")
        && require_tools("rescue mounts", &["mkfs.btrfs", "btrfs"], "btrfs-progs")
}

fn correct(orig: &BTreeMap<PathBuf, Vec<u8>>, seen: &Seen) -> usize {
    orig.iter()
        .filter(|(p, data)| seen.get(*p).is_some_and(|d| d.as_ref() == Some(*data)))
        .count()
}

struct Fixture {
    tmp: TempDir,
    clean: PathBuf,
    orig: BTreeMap<PathBuf, Vec<u8>>,
    d1: u64,
    d2: u64,
    big_logical: u64,
}

fn fixture() -> Fixture {
    let tmp = TempDir::new("rescue-mount").unwrap();
    let clean = tmp.join("clean.img");
    sh_ok(
        tmp.path(),
        "truncate -s 512M clean.img && mkfs.btrfs -q -m dup -d single clean.img",
    );
    let mnt = tmp.subdir("kmnt").unwrap();
    let m = KernelMount::mount(&clean, &mnt, &["rw", "noatime"]).unwrap();
    sh_ok(&mnt, POPULATE);
    m.sync().unwrap();
    let orig: BTreeMap<PathBuf, Vec<u8>> = files_under(&mnt)
        .into_iter()
        .map(|(p, d)| (p, d.expect("kernel reads its own files")))
        .collect();
    let ino = |d: &str| std::fs::metadata(mnt.join(d)).unwrap().ino();
    let (d1, d2) = (ino("d1"), ino("d2"));
    let big_logical = file_logical_extents(&mnt.join("big")).unwrap()[0].1;
    m.unmount().unwrap();
    Fixture {
        tmp,
        clean,
        orig,
        d1,
        d2,
        big_logical,
    }
}

/// What oleo shows through a mount with `opts` (None: the mount failed, with its output).
fn through_mount(fx: &Fixture, img: &Path, opts: &[&str]) -> Result<(Seen, String), String> {
    let mnt = fx.tmp.subdir("omnt").unwrap();
    // The daemon's own log (what it says while serving) goes to this file.
    let log_file = fx.tmp.join("oleo.log");
    let _ = std::fs::remove_file(&log_file);
    let log_opt = format!("log={}", log_file.display());
    let mut all = opts.to_vec();
    all.push(&log_opt);
    let m =
        OleoMount::mount_with_timeout(Path::new(OLEO), img, &mnt, &all, Duration::from_secs(30))
            .map_err(|e| e.to_string())?;
    let _dog = m.watchdog(Duration::from_secs(120));
    let seen = files_under(&mnt);
    let mut log = m.log_text();
    m.unmount().unwrap();
    log.push_str(&std::fs::read_to_string(&log_file).unwrap_or_default());
    Ok((seen, log))
}

/// Files `btrfs restore` gets right from the image.
fn btrfs_restore(fx: &Fixture, img: &Path) -> usize {
    let dest = fx.tmp.join("brestore");
    let _ = std::fs::remove_dir_all(&dest);
    std::fs::create_dir_all(&dest).unwrap();
    let _ = run_with_timeout(
        Command::new("btrfs")
            .args(["restore", "-i"])
            .arg(img)
            .arg(&dest)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null()),
        Duration::from_secs(120),
    );
    correct(&fx.orig, &files_under(&dest))
}

/// The byte offset, in a leaf, of its free space (between item headers and item data).
fn free_space_in_leaf(img: &Path, leaf: u64) -> u64 {
    let dump = Command::new("btrfs")
        .args(["inspect-internal", "dump-tree", "--noscan", "-b"])
        .arg(leaf.to_string())
        .arg(img)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&dump.stdout);
    let first = text
        .lines()
        .find(|l| l.starts_with("leaf "))
        .unwrap_or_else(|| panic!("dump-tree -b {leaf}: {text}"));
    let w: Vec<&str> = first.split_whitespace().collect();
    let items: u64 = w[w.iter().position(|x| *x == "items").unwrap() + 1]
        .parse()
        .unwrap();
    let free: u64 = w[w.iter().position(|x| *x == "space").unwrap() + 1]
        .parse()
        .unwrap();
    assert!(
        free > 4,
        "leaf {leaf} has no free space to scribble on: {first}"
    );
    101 + items * 25 + free / 2
}

struct Case {
    name: &'static str,
    damage: Damage,
    option: &'static str,
    /// What the option's log line says.
    logged: &'static str,
}

#[test]
fn rescue_options_show_what_the_plain_mount_cannot() {
    if !tools() {
        return;
    }
    let fx = fixture();
    let all = fx.orig.len();
    let zero_block = |img: &Path, logical: u64| {
        for p in physical_copies(img, logical).unwrap() {
            write_at(img, p, &[0u8; NODESIZE]).unwrap();
        }
    };
    let cases = vec![
        Case {
            name: "root tree root, both copies",
            damage: Box::new(move |_, img| zero_block(img, super_field(img, "root").unwrap())),
            option: "rescue=usebackuproot",
            logged: "rescue: usebackuproot: root tree of generation",
        },
        Case {
            name: "a directory's index leaf, both copies",
            damage: Box::new(move |fx, img| {
                let leaf = leaf_holding(img, "5", &fx.d1.to_string(), "DIR_INDEX").unwrap();
                zero_block(img, leaf)
            }),
            option: "rescue=ignorebadroots",
            logged: "rescue: ignorebadroots: tree block",
        },
        Case {
            name: "the csum tree's first leaf, both copies",
            damage: Box::new(move |_, img| {
                let leaf = leaf_holding(img, "csum", "EXTENT_CSUM", "EXTENT_CSUM").unwrap();
                zero_block(img, leaf)
            }),
            option: "rescue=ignorebadroots",
            logged: "rescue: ignorebadroots:",
        },
        Case {
            name: "a data sector of big",
            damage: Box::new(|fx, img| {
                write_every_copy(img, fx.big_logical + 8192, 0, b"XXXX").unwrap()
            }),
            option: "rescue=ignoredatacsums",
            logged: "rescue: ignoredatacsums: data at logical",
        },
        Case {
            name: "a byte of a leaf's free space, both copies",
            damage: Box::new(move |fx, img| {
                let leaf = leaf_holding(img, "5", &fx.d2.to_string(), "DIR_INDEX").unwrap();
                let at = free_space_in_leaf(img, leaf);
                write_every_copy(img, leaf, at, b"Y").unwrap()
            }),
            option: "rescue=ignoremetacsums",
            logged: "rescue: ignoremetacsums: tree block",
        },
        Case {
            name: "the primary superblock",
            damage: Box::new(|_, img| write_at(img, 65536, &[0u8; 4096]).unwrap()),
            option: "sb=1",
            logged: "rescue: sb=1: using superblock copy 1",
        },
    ];
    eprintln!("| damage | option | plain mount | rescue mount | btrfs restore | of |");
    eprintln!("|---|---|---|---|---|---|");
    for case in &cases {
        let img = fx.tmp.join("case.img");
        std::fs::copy(&fx.clean, &img).unwrap();
        (case.damage)(&fx, &img);
        let before = image_hash(&img).unwrap();
        let plain_seen = through_mount(&fx, &img, &[]).map(|(s, _)| s);
        let plain = plain_seen.as_ref().map(|s| correct(&fx.orig, s));
        let (seen, log) = through_mount(&fx, &img, &[case.option])
            .unwrap_or_else(|e| panic!("{}: mount -o {} failed: {e}", case.name, case.option));
        let rescued = correct(&fx.orig, &seen);
        let theirs = btrfs_restore(&fx, &img);
        assert_eq!(
            image_hash(&img).unwrap(),
            before,
            "{}: image changed",
            case.name
        );
        let plain_n = plain.as_ref().map_or(0, |n| *n);
        eprintln!(
            "| {} | {} | {} | {rescued} | {theirs} | {all} |",
            case.name,
            case.option,
            plain
                .as_ref()
                .map_or("refused".to_string(), |n| n.to_string())
        );
        assert!(
            plain_n < all,
            "{}: the damage did not show without {}",
            case.name,
            case.option
        );
        // Data that fails its checksum everywhere is wrong either way: what the option
        // changes is that it reads at all (checked below).
        let more = rescued > plain_n || case.option == "rescue=ignoredatacsums";
        assert!(
            more && rescued >= theirs,
            "{}: -o {} shows {rescued} files right, plain {plain_n}, btrfs restore {theirs}",
            case.name,
            case.option
        );
        assert!(
            log.contains(case.logged),
            "{}: no log line {:?}:\n{log}",
            case.name,
            case.logged
        );
        if case.option == "rescue=ignoredatacsums" {
            let plain_big = plain_seen
                .as_ref()
                .ok()
                .and_then(|s| s.get(Path::new("big")));
            assert_eq!(plain_big, Some(&None), "big read without the option");
            // The one damaged file reads, with exactly the damaged bytes different.
            let got = seen[Path::new("big")].as_ref().expect("big reads");
            let want = &fx.orig[Path::new("big")];
            let diff: Vec<usize> = (0..want.len()).filter(|&i| got[i] != want[i]).collect();
            assert_eq!(diff, (8192..8196).collect::<Vec<_>>(), "big's damage");
            assert_eq!(rescued, all - 1);
        }
    }
}

/// Rescue options need a read-only mount: `rw` with one is refused (the kernel's words),
/// and without `ro` the mount is read-only.
#[test]
fn rescue_options_refuse_rw_and_imply_ro() {
    if !tools() {
        return;
    }
    let tmp = TempDir::new("rescue-ro").unwrap();
    let img = tmp.join("img");
    sh_ok(tmp.path(), "truncate -s 256M img && mkfs.btrfs -q img");
    let mnt = tmp.subdir("mnt").unwrap();
    for opt in [
        "rescue=ignorebadroots",
        "rescue=all",
        "sb=1",
        "rescue=nologreplay",
    ] {
        let o = Command::new(OLEO)
            .args(["mount", "-o"])
            .arg(format!("rw,{opt}"))
            .arg(&img)
            .arg(&mnt)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{opt}: rw mount accepted");
        assert!(
            err.contains("must be used with ro mount option"),
            "{opt}: {err}"
        );
    }
    let bad = Command::new(OLEO)
        .args(["mount", "-o", "rescue=bogus"])
        .arg(&img)
        .arg(&mnt)
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&bad.stderr).contains("rescue=bogus: not a rescue option"));
    let before = image_hash(&img).unwrap();
    let o = Command::new(OLEO)
        .args(["mount", "-o", "rescue=all"])
        .arg(&img)
        .arg(&mnt)
        .status()
        .unwrap();
    assert!(o.success());
    let ro = std::fs::write(mnt.join("x"), b"x");
    let _ = Command::new("umount").arg(&mnt).status();
    assert_eq!(
        ro.map_err(|e| e.raw_os_error()),
        Err(Some(libc::EROFS)),
        "a rescue mount took a write"
    );
    assert_eq!(image_hash(&img).unwrap(), before);
}

/// A read-only mount of `img` with `opts`: what it shows, and what oleo logged.
fn shown(tmp: &TempDir, img: &Path, opts: &[&str]) -> (Seen, String) {
    let mnt = tmp.subdir("omnt").unwrap();
    let log_file = tmp.join("oleo.log");
    let _ = std::fs::remove_file(&log_file);
    let log_opt = format!("log={}", log_file.display());
    let mut all = opts.to_vec();
    all.push(&log_opt);
    let m = OleoMount::mount(Path::new(OLEO), img, &mnt, &all)
        .unwrap_or_else(|e| panic!("-o ro,{}: {e}", opts.join(",")));
    let seen = files_under(&mnt);
    let mut log = m.log_text();
    m.unmount().unwrap();
    log.push_str(&std::fs::read_to_string(&log_file).unwrap_or_default());
    (seen, log)
}

/// A mount of `img` with `opts` that must fail: what oleo said. (In the background, so
/// that a mount wrongly accepted returns, and is unmounted before the failure.)
fn refused(img: &Path, mnt: &Path, opts: &str) -> String {
    let o = Command::new(OLEO)
        .args(["mount", "-o", opts])
        .arg(img)
        .arg(mnt)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    if o.status.success() {
        let _ = Command::new("umount").arg(mnt).status();
        panic!("-o {opts}: mounted: {err}");
    }
    assert_ne!(o.status.code(), Some(101), "-o {opts}: panicked: {err}");
    err
}

/// Superblock `flags` the kernel does not mount with (a bit it does not know, an
/// interrupted btrfstune's CHANGING_FSID; checksums recomputed, so only the flag is wrong)
/// are refused, rw and ro, naming the flag, as the kernel refuses them;
/// `-o ro,rescue=ignoresuperflags` mounts the filesystem and shows its files. A flag the
/// kernel mounts with but oleo cannot write with (ERROR) is refused for writing only. And
/// a superblock field that fails its sanity check (the primary's generation zeroed):
/// a writable mount is refused naming the field, a read-only one uses the copy that
/// passes. The image never changes.
#[test]
fn super_flags_and_a_bad_super_field_refuse_writes() {
    if !tools() {
        return;
    }
    let tmp = TempDir::new("rescue-superflags").unwrap();
    let clean = tmp.join("clean.img");
    sh_ok(
        tmp.path(),
        "truncate -s 256M clean.img && mkfs.btrfs -q clean.img",
    );
    let kmnt = tmp.subdir("kmnt").unwrap();
    let m = KernelMount::mount(&clean, &kmnt, &["rw"]).unwrap();
    sh_ok(
        &kmnt,
        "echo hello > f && mkdir d && head -c 100000 /dev/urandom > d/g",
    );
    let orig: BTreeMap<PathBuf, Vec<u8>> = files_under(&kmnt)
        .into_iter()
        .map(|(p, d)| (p, d.unwrap()))
        .collect();
    m.unmount().unwrap();
    let mnt = tmp.subdir("mnt").unwrap();
    let img = tmp.join("img");
    let copies = [0, 1];
    const FLAGS: usize = 56;
    const GENERATION: usize = 72;
    let written = 1u64;
    for (bit, name) in [(1u64 << 50, "bit 50"), (1 << 35, "CHANGING_FSID")] {
        std::fs::copy(&clean, &img).unwrap();
        set_super_u64(&img, &copies, FLAGS, written | bit).unwrap();
        let before = image_hash(&img).unwrap();
        assert!(
            KernelMount::mount(&img, &kmnt, &["ro"]).is_err(),
            "{name}: the kernel mounts it"
        );
        for opts in ["rw", "ro"] {
            let err = refused(&img, &mnt, opts);
            assert!(
                err.contains(&format!("superblock flags {name}"))
                    && err.contains("rescue=ignoresuperflags"),
                "{name}, -o {opts}: {err}"
            );
        }
        let err = refused(&img, &mnt, "rw,rescue=ignoresuperflags");
        assert!(err.contains("must be used with ro"), "{name}: {err}");
        let (seen, log) = shown(&tmp, &img, &["rescue=ignoresuperflags"]);
        assert_eq!(correct(&orig, &seen), orig.len(), "{name}: {log}");
        assert!(
            log.contains(&format!(
                "rescue: ignoresuperflags: superblock flags {name}"
            )),
            "{name}: {log}"
        );
        assert_eq!(image_hash(&img).unwrap(), before, "{name}: image changed");
    }

    // ERROR: the kernel mounts it (then refuses to write); oleo reads it, never writes.
    std::fs::copy(&clean, &img).unwrap();
    set_super_u64(&img, &copies, FLAGS, written | 1 << 2).unwrap();
    let before = image_hash(&img).unwrap();
    let err = refused(&img, &mnt, "rw");
    assert!(err.contains("superblock flag ERROR"), "{err}");
    let (seen, log) = shown(&tmp, &img, &[]);
    assert_eq!(correct(&orig, &seen), orig.len(), "ERROR: {log}");
    assert_eq!(image_hash(&img).unwrap(), before, "ERROR: image changed");

    // The primary's generation zeroed (checksum good).
    std::fs::copy(&clean, &img).unwrap();
    set_super_u64(&img, &[0], GENERATION, 0).unwrap();
    let before = image_hash(&img).unwrap();
    let err = refused(&img, &mnt, "rw");
    assert!(
        err.contains("field generation is 0") && err.contains("refusing to write"),
        "{err}"
    );
    let (seen, log) = shown(&tmp, &img, &[]);
    assert_eq!(correct(&orig, &seen), orig.len(), "generation: {log}");
    assert!(log.contains("field generation is 0"), "{log}");
    assert_eq!(
        image_hash(&img).unwrap(),
        before,
        "generation: image changed"
    );
}
