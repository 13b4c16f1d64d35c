//! Scrub, read repair of tree blocks, and device error counters, against the kernel: a
//! RAID1 set the kernel made and filled, one copy of some data sectors and of a tree block
//! damaged on the raw image. oleo's scrub must find and repair what the kernel's scrub
//! finds on an identical copy of the damaged set (same counters), leave `btrfs check
//! --check-data-csum` and a later kernel scrub clean, persist DEV_STATS the kernel reads,
//! and change nothing when read-only.
//!
//! Needs root, loop devices, kernel btrfs and btrfs-progs (a skip elsewhere, a failure
//! under CI=true).

use oleo::{Filesystem, OpenOptions, ScrubOptions, ScrubProgress};
use oleo_testkit::multi_device::{self as md, Manifest};
use oleo_testkit::{require_root, TempDir};
use std::path::{Path, PathBuf};

const MIB: u64 = 1 << 20;

/// A RAID1 set of two images filled by the kernel, with its manifest.
fn raid1_set(dir: &Path, name: &str) -> (Vec<PathBuf>, Manifest, Vec<(u64, u64, u64)>) {
    let images = md::mkfs_set(dir, name, 2, 256 * MIB, "raid1", "raid1").expect("mkfs");
    let mnt = dir.join(format!("{name}-kmnt"));
    let k = md::KernelSet::mount(&images, &[], &mnt, &[]).expect("kernel mount");
    let manifest = md::fill(k.root(), 7).expect("fill");
    let big = md::PATTERN_FILES
        .iter()
        .max_by_key(|f| f.2)
        .map(|f| k.root().join(f.1))
        .expect("pattern files");
    let extents = md::file_logical_extents(&big).expect("fiemap");
    k.unmount().expect("unmount");
    (images, manifest, extents)
}

fn open(images: &[PathBuf], rw: bool) -> Filesystem {
    let opts = OpenOptions {
        devices: images[1..].to_vec(),
        read_only: !rw,
        ..OpenOptions::default()
    };
    if rw {
        Filesystem::open_rw(&images[0], opts).expect("open read-write")
    } else {
        Filesystem::open(&images[0], opts).expect("open")
    }
}

/// The physical place of copy `devid` of logical `l`.
fn copy_on(images: &[PathBuf], l: u64, devid: u64) -> (PathBuf, u64) {
    let chunks = md::chunk_map_all(images).expect("chunk map");
    let (_, phys) = md::copies(&chunks, l)
        .into_iter()
        .find(|c| c.0 == devid)
        .unwrap_or_else(|| panic!("no copy of {l} on devid {devid}"));
    (md::image_of_devid(images, devid).expect("image"), phys)
}

/// Damages 3 data sectors on devid 1 and 2 on devid 2 (different places).
fn damage_data(images: &[PathBuf], extents: &[(u64, u64, u64)]) {
    let (_, l, len) = extents[0];
    assert!(len >= 64 * 4096, "a large extent to damage");
    let (img, p) = copy_on(images, l + 4096, 1);
    md::overwrite(&img, p, 3 * 4096, 0xa5).unwrap();
    let (img, p) = copy_on(images, l + 40 * 4096, 2);
    md::overwrite(&img, p, 2 * 4096, 0x5a).unwrap();
}

/// Damages the copy on devid 1 of tree block `root` (in every set of `sets`: the same
/// place, the sets being copies).
fn damage_tree_block(sets: &[&[PathBuf]], root: u64) {
    let (_, p) = copy_on(sets[0], root, 1);
    for images in sets {
        let img = md::image_of_devid(images, 1).unwrap();
        md::overwrite(&img, p + 100, 200, 0x11).unwrap();
    }
}

/// Damages data copies and the root tree's root block on devid 1.
fn damage(images: &[PathBuf], extents: &[(u64, u64, u64)]) {
    damage_data(images, extents);
    let root = open(images, false).superblock().root;
    damage_tree_block(&[images], root);
}

fn sparse_copy(from: &Path, to: &Path) {
    let ok = std::process::Command::new("cp")
        .arg("--sparse=always")
        .arg(from)
        .arg(to)
        .status()
        .unwrap()
        .success();
    assert!(ok, "cp {} {}", from.display(), to.display());
}

fn total(stats: &std::collections::BTreeMap<u64, ScrubProgress>) -> ScrubProgress {
    let mut t = ScrubProgress::default();
    for s in stats.values() {
        t.add(s);
    }
    t
}

fn file_bytes(fs: &Filesystem, rel: &Path) -> Option<Vec<u8>> {
    let id = fs
        .resolve_path(fs.root(), rel.as_os_str().as_encoded_bytes())
        .ok()?;
    let size = fs.getattr(id).ok()?.size;
    let mut out = Vec::new();
    while (out.len() as u64) < size {
        let chunk = fs.read(id, out.len() as u64, 1 << 20).ok()?;
        if chunk.is_empty() {
            break;
        }
        out.extend_from_slice(&chunk);
    }
    Some(out)
}

fn hash_file(p: &Path) -> u64 {
    use std::hash::Hasher;
    use std::io::Read;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    let mut f = std::fs::File::open(p).unwrap();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).unwrap();
        if n == 0 {
            break h.finish();
        }
        h.write(&buf[..n]);
    }
}

/// corruption_errs of each device in devid order, as `btrfs device stats` prints them.
fn corruption_by_devid(mnt: &Path) -> Vec<u64> {
    let out = std::process::Command::new("btrfs")
        .args(["device", "stats", "-T"])
        .arg(mnt)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    // Id Path Write Read Flush Corruption Generation
    text.lines()
        .skip(2)
        .filter_map(|l| l.split_whitespace().nth(5)?.parse().ok())
        .collect()
}

#[test]
fn scrub_repairs_as_the_kernel_does() {
    if !require_root("scrub_repairs_as_the_kernel_does") {
        return;
    }
    let dir = TempDir::new("scrub-repair").unwrap();
    let (images, manifest, extents) = raid1_set(dir.path(), "s");
    damage_data(&images, &extents);
    // The kernel's scrub of an identical copy is the reference.
    let kimages: Vec<PathBuf> = images
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let q = dir.join(format!("k-{i}.img"));
            sparse_copy(p, &q);
            q
        })
        .collect();
    // The tree block is damaged once oleo has opened the set: a read at open that met the
    // bad copy would queue its repair before the scrub looks.
    let fs = open(&images, true);
    let root = fs.superblock().root;
    damage_tree_block(&[&images, &kimages], root);
    // A copy's fsid equals the original's: the kernel must not see both sets at once.
    // Read-only (mounted ro, scrub -r): a read at mount of the bad tree block copy must
    // not repair it before the scrub looks, so its counts are deterministic.
    let (kstats, kdev) = {
        let k = md::KernelSet::mount(&kimages, &[], &dir.join("kmnt2"), &["ro"]).expect("mount");
        let s = k.scrub(false).expect("kernel scrub");
        let d = corruption_by_devid(k.root());
        k.unmount().unwrap();
        (s, d)
    };
    let stats = fs
        .scrub(&ScrubOptions::default(), &mut |_| {})
        .expect("scrub");
    let t = total(&stats);
    eprintln!("oleo: {t:?}\nkernel: {:?}", kstats.fields);
    for (field, ours) in [
        ("csum_errors", t.csum_errors),
        ("verify_errors", t.verify_errors),
        ("read_errors", t.read_errors),
        ("data_bytes_scrubbed", t.data_bytes_scrubbed),
        ("tree_bytes_scrubbed", t.tree_bytes_scrubbed),
        ("tree_extents_scrubbed", t.tree_extents_scrubbed),
    ] {
        assert_eq!(
            ours,
            kstats.get(field),
            "{field}: oleo {ours}, kernel {}",
            kstats.get(field)
        );
    }
    // What the kernel found, oleo repaired.
    assert_eq!(t.corrected_errors, t.csum_errors + t.verify_errors, "{t:?}");
    assert_eq!(t.uncorrectable_errors, 0, "{t:?}");
    let dev: Vec<u64> = fs
        .device_stats()
        .unwrap()
        .iter()
        .map(|(_, v)| v[3])
        .collect();
    assert_eq!(
        dev, kdev,
        "corruption_errs per device: oleo {dev:?}, kernel {kdev:?}"
    );
    fs.close().unwrap();
    // Repaired on disk: progs finds nothing, and the kernel's scrub neither.
    let check = md::offline_check(&images).expect("btrfs check");
    assert!(
        check.clean,
        "btrfs check after oleo's scrub:\n{}",
        check.output
    );
    let k = md::KernelSet::mount(&images, &[], &dir.join("kmnt"), &[]).expect("mount");
    let after = k.scrub(false).expect("kernel scrub");
    assert_eq!(
        after.get("csum_errors") + after.get("verify_errors"),
        0,
        "{:?}",
        after.fields
    );
    manifest.check_dir(k.root()).expect("contents");
    // The counters oleo persisted are what the kernel finds in DEV_STATS.
    assert_eq!(
        corruption_by_devid(k.root()),
        kdev,
        "btrfs device stats after oleo's scrub"
    );
    k.unmount().unwrap();
}

#[test]
fn read_only_scrub_reports_and_writes_nothing() {
    if !require_root("read_only_scrub_reports_and_writes_nothing") {
        return;
    }
    let dir = TempDir::new("scrub-ro").unwrap();
    let (images, _, extents) = raid1_set(dir.path(), "r");
    damage(&images, &extents);
    let before: Vec<u64> = images.iter().map(|p| hash_file(p)).collect();
    let fs = open(&images, false);
    let opts = ScrubOptions {
        readonly: true,
        ..ScrubOptions::default()
    };
    let t = total(&fs.scrub(&opts, &mut |_| {}).expect("scrub"));
    drop(fs);
    assert_eq!((t.csum_errors, t.verify_errors), (5, 4), "{t:?}");
    // Counted as corrected, as the kernel's `scrub -r` counts what a good copy could fix.
    assert_eq!(t.corrected_errors, 9, "{t:?}");
    let after: Vec<u64> = images.iter().map(|p| hash_file(p)).collect();
    assert_eq!(before, after, "a read-only scrub changed the images");
}

#[test]
fn reads_repair_a_bad_tree_block_copy() {
    if !require_root("reads_repair_a_bad_tree_block_copy") {
        return;
    }
    let dir = TempDir::new("scrub-meta").unwrap();
    let (images, manifest, _) = raid1_set(dir.path(), "m");
    let root = open(&images, false).superblock().root;
    // The copy oleo reads first (it spreads reads by address), so that a read meets it.
    let chunks = md::chunk_map_all(&images).expect("chunk map");
    let copies = md::copies(&chunks, root);
    let first = ((root >> 20) % 2) as usize;
    let (bad_dev, good_dev) = (copies[first].0, copies[1 - first].0);
    let (img, p) = copy_on(&images, root, bad_dev);
    md::overwrite(&img, p + 100, 200, 0x11).unwrap();
    let (img2, p2) = copy_on(&images, root, good_dev);
    let good = md::read_image(&img2, p2, 16384).unwrap();
    let fs = open(&images, true);
    manifest
        .check_with(|rel| file_bytes(&fs, rel))
        .expect("contents read through the good copy");
    fs.close().unwrap();
    let repaired = md::read_image(&img, p, 16384).unwrap();
    assert!(
        repaired == good,
        "the bad copy of tree block {root} was not rewritten"
    );
    let check = md::offline_check(&images).expect("btrfs check");
    assert!(check.clean, "btrfs check:\n{}", check.output);
}
