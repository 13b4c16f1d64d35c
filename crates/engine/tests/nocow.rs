//! NOCOW files and preallocated extents written in place, checked against the kernel and
//! btrfs-progs: an overwrite of a NOCOW file keeps its extent (same address, same item
//! generation, no new extent item), a write into prealloc splits the item as the kernel
//! does, an extent shared with a snapshot or a reflink is copied once and then written in
//! place again, the flags read back through the kernel's `lsattr`, random operations
//! match a reference, concurrent in-place writers never write through a snapshot, and
//! crash states keep metadata consistent and fsynced data intact.
//!
//! Needs root, kernel btrfs and btrfs-progs (a skip elsewhere, a failure under CI=true).

mod common;

use common::extents::{data_extent_refs, extent_items, kernel_reads};
use common::{open_top_rw as open_rw, resolve};
use oleo::fileattr::fs_flags;
use oleo::{FallocMode, Filesystem, InodeId, NewInode};
use oleo_testkit::ops::{pattern, put, Rng};
use oleo_testkit::{assert_btrfs_check, KernelMount, TempDir};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// (path, contents) of files as a snapshot saw them.
type Files = Vec<(String, Vec<u8>)>;

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;

fn setup(label: &str, mb: u64) -> Option<(TempDir, PathBuf)> {
    common::scratch_image("nocow tests", label, mb, &[])
}

fn new_file(fs: &Filesystem, dir: InodeId, name: &str, nocow: bool) -> InodeId {
    let id = fs
        .mknod(dir, name.as_bytes(), &NewInode::file(0o644))
        .expect("create")
        .id;
    if nocow {
        fs.set_fs_flags(id, fs_flags::NOCOW).expect("chattr +C");
        assert_ne!(fs.get_fs_flags(id).unwrap() & fs_flags::NOCOW, 0);
    }
    id
}

fn read_all(fs: &Filesystem, id: InodeId) -> Vec<u8> {
    let size = fs.getattr(id).expect("getattr").size;
    let mut out = Vec::new();
    while (out.len() as u64) < size {
        let chunk = fs.read(id, out.len() as u64, 4 << 20).expect("read");
        assert!(!chunk.is_empty(), "short read at {}", out.len());
        out.extend_from_slice(&chunk);
    }
    out
}

/// Data extent items in the extent tree.
fn data_extents(image: &Path) -> usize {
    data_extent_refs(image).len()
}

fn lsattr(image: &Path, mnt: &Path, paths: &[&str]) -> Vec<String> {
    let m = KernelMount::mount(image, mnt, &["ro"]).expect("kernel mount");
    let out = paths
        .iter()
        .map(|p| {
            let o = Command::new("lsattr")
                .arg("-d")
                .arg(m.path().join(p))
                .output()
                .expect("lsattr");
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .next()
                .unwrap_or("")
                .to_string()
        })
        .collect();
    drop(m);
    out
}

#[test]
fn in_place_writes_keep_their_extents_and_shared_ones_are_copied_once() {
    let Some((tmp, image)) = setup("oleo-nocow-inplace", 512) else {
        return;
    };
    let fs = open_rw(&image);
    let top = fs.root();
    fs.create_subvolume(top, b"vol", 0, 0).expect("subvolume");
    let vol = resolve(&fs, "vol");
    let f = new_file(&fs, vol, "db", true);
    let mut model = pattern(1, MIB as usize);
    fs.write(f, 0, &model).expect("write");
    fs.sync().expect("commit");
    let ino = f.ino;
    let items = extent_items(&image, vol.subvol, ino);
    let extents = data_extents(&image);
    let layout = fs.file_extents(f).expect("extents");
    // Aligned, unaligned, sub-sector and multi-extent overwrites.
    for (i, (at, len)) in [
        (4096, 4096),
        (10_000, 3000),
        (65_536, 131_072),
        (MIB - 512, 512),
        (1, 1),
    ]
    .into_iter()
    .enumerate()
    {
        let data = pattern(100 + i as u64, len as usize);
        assert_eq!(fs.write(f, at, &data).expect("overwrite"), data.len());
        put(&mut model, at, &data);
    }
    fs.sync().expect("commit");
    assert_eq!(
        fs.file_extents(f).unwrap(),
        layout,
        "an overwrite moved data"
    );
    assert_eq!(
        extent_items(&image, vol.subvol, ino),
        items,
        "an overwrite changed items"
    );
    assert_eq!(data_extents(&image), extents, "an overwrite allocated");
    assert_eq!(read_all(&fs, f), model);

    // A snapshot shares every extent: the next write copies the range it covers, once.
    fs.snapshot(vol.subvol, top, b"snap", true)
        .expect("snapshot");
    let snap_model = model.clone();
    let data = pattern(200, 4096);
    fs.write(f, 8192, &data).unwrap();
    put(&mut model, 8192, &data);
    let copied = fs.file_extents(f).unwrap();
    assert_ne!(
        copied, layout,
        "a write into a snapshotted extent stayed in place"
    );
    let data = pattern(201, 4096);
    fs.write(f, 8192, &data).unwrap();
    put(&mut model, 8192, &data);
    assert_eq!(
        fs.file_extents(f).unwrap(),
        copied,
        "the copy is this file's alone: in place"
    );

    // A reflink shares them too; a checksummed file gets a copy instead of a clone.
    let g = new_file(&fs, vol, "clone", true);
    assert_eq!(fs.copy_file_range(f, 0, g, 0, MIB).unwrap(), MIB);
    let mut g_model = model.clone();
    let h = new_file(&fs, vol, "summed", false);
    assert_eq!(fs.copy_file_range(f, 0, h, 0, MIB).unwrap(), MIB);
    let before = fs.file_extents(f).unwrap();
    let data = pattern(300, 8192);
    fs.write(f, 512 * KIB, &data).unwrap();
    put(&mut model, 512 * KIB, &data);
    assert_ne!(
        fs.file_extents(f).unwrap(),
        before,
        "a write into a cloned extent stayed in place"
    );
    let data = pattern(301, 4096);
    fs.write(g, 0, &data).unwrap();
    put(&mut g_model, 0, &data);
    assert_eq!(read_all(&fs, f), model);
    assert_eq!(read_all(&fs, g), g_model);
    let snap = resolve(&fs, "snap/db");
    assert_eq!(
        read_all(&fs, snap),
        snap_model,
        "the snapshot saw a later write"
    );
    let summed = read_all(&fs, h);
    fs.close().expect("close");
    if let Err(e) = oleo_testkit::btrfs_check(&image, true) {
        panic!("btrfs check --check-data-csum: {e}");
    }
    assert_btrfs_check(&image, "after in-place writes");
    let mut expect = BTreeMap::new();
    expect.insert("vol/db".to_string(), model);
    expect.insert("vol/clone".to_string(), g_model);
    expect.insert("vol/summed".to_string(), summed);
    expect.insert("snap/db".to_string(), snap_model);
    let mnt = tmp.join("mnt");
    kernel_reads(&image, &mnt, &expect);
    let flags = lsattr(&image, &mnt, &["vol/db", "vol/clone", "vol/summed"]);
    assert!(
        flags[0].contains('C') && flags[1].contains('C'),
        "lsattr: {flags:?}"
    );
    assert!(!flags[2].contains('C'), "lsattr: {flags:?}");
}

/// fallocate, commit, write 4 KiB at 16 KiB of a checksummed file: the kernel's layout
/// (btrfs-format.md §15.2): prealloc, regular, prealloc on one extent, one csum item.
#[test]
fn writes_into_prealloc_split_it_as_the_kernel_does() {
    let Some((tmp, image)) = setup("oleo-nocow-prealloc", 256) else {
        return;
    };
    let fs = open_rw(&image);
    let top = fs.root();
    let f = new_file(&fs, top, "p", false);
    fs.fallocate(f, 0, 64 * KIB, FallocMode::Allocate { keep_size: false })
        .expect("fallocate");
    fs.sync().expect("commit");
    let data = pattern(7, 4096);
    fs.write(f, 16 * KIB, &data).expect("write");
    // Unaligned, within one sector: the rest of the sector reads as zeros.
    let small = pattern(8, 100);
    fs.write(f, 41 * KIB + 10, &small).expect("write");
    fs.close().expect("close");
    let items = extent_items(&image, 5, f.ino);
    let bytenr = items[0].2;
    let kinds: Vec<(u64, u64, u64, &str)> = items
        .iter()
        .map(|i| (i.0, i.2, i.3, i.5.as_str()))
        .collect();
    assert_eq!(
        kinds,
        vec![
            (0, bytenr, 0, "prealloc"),
            (16 * KIB, bytenr, 16 * KIB, "regular"),
            (20 * KIB, bytenr, 20 * KIB, "prealloc"),
            (40 * KIB, bytenr, 40 * KIB, "regular"),
            (44 * KIB, bytenr, 44 * KIB, "prealloc"),
        ],
        "items: {items:?}"
    );
    assert_eq!(data_extents(&image), 1, "no new extent");
    if let Err(e) = oleo_testkit::btrfs_check(&image, true) {
        panic!("btrfs check --check-data-csum: {e}");
    }
    let mut model = vec![0u8; 64 * KIB as usize];
    put(&mut model, 16 * KIB, &data);
    put(&mut model, 41 * KIB + 10, &small);
    let mut expect = BTreeMap::new();
    expect.insert("p".to_string(), model);
    kernel_reads(&image, &tmp.join("mnt"), &expect);
}

/// Writes that fill a prealloc extent piece by piece, in and out of order, then the
/// gap between two written runs: oleo's items and the extent's reference count equal the
/// kernel's after the same writes (each its own ordered extent: an fsync after each), one
/// regular item for the written run as btrfs_mark_extent_written merges them, not one per
/// write. `btrfs check` clean, the kernel reads the data.
#[test]
fn fills_of_prealloc_merge_as_the_kernel_merges_them() {
    let Some((tmp, image)) = setup("oleo-nocow-prealloc-merge", 256) else {
        return;
    };
    let kimage = tmp.join("kernel-image");
    oleo_testkit::image::empty_image(&kimage, 256, &[]).expect("mkfs.btrfs");
    // (offset, length) in KiB: three in a row, one before them, one after a gap, the gap.
    let writes: [(u64, u64); 6] = [(16, 4), (20, 4), (24, 8), (12, 4), (40, 4), (32, 8)];
    let fs = open_rw(&image);
    let top = fs.root();
    let f = new_file(&fs, top, "p", false);
    fs.fallocate(f, 0, 64 * KIB, FallocMode::Allocate { keep_size: false })
        .expect("fallocate");
    fs.sync().expect("commit");
    let mut model = vec![0u8; 64 * KIB as usize];
    for (i, &(off, len)) in writes.iter().enumerate() {
        let data = pattern(i as u64 + 1, (len * KIB) as usize);
        fs.write(f, off * KIB, &data).expect("write");
        put(&mut model, off * KIB, &data);
    }
    fs.close().expect("close");

    let mnt = tmp.join("kmnt");
    let m = KernelMount::mount(&kimage, &mnt, &["rw", "noatime"]).expect("kernel mount");
    let path = m.path().join("p");
    std::fs::write(&path, b"").expect("create");
    xfs_io(&path, &["falloc 0 64k", "fsync"]);
    Command::new("sync").status().expect("sync");
    for (i, &(off, len)) in writes.iter().enumerate() {
        let data = pattern(i as u64 + 1, (len * KIB) as usize);
        let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        std::os::unix::fs::FileExt::write_all_at(&file, &data, off * KIB).expect("write");
        file.sync_all().expect("fsync");
    }
    m.unmount().expect("unmount");

    let shape = |image: &Path| -> Vec<(u64, u64, u64, String)> {
        let ino = if image == kimage { 257 } else { f.ino };
        extent_items(image, 5, ino)
            .into_iter()
            .map(|i| (i.0, i.3, i.4, i.5))
            .collect()
    };
    let ours = shape(&image);
    assert_eq!(ours, shape(&kimage), "items: oleo's, then the kernel's");
    // 12..44 KiB written in six pieces: one regular item, between two prealloc ones.
    assert_eq!(
        ours.iter().filter(|i| i.3 == "regular").count(),
        1,
        "one written run: {ours:?}"
    );
    assert_eq!(data_extent_refs(&image), data_extent_refs(&kimage));
    assert_btrfs_check(&image, "the fills");
    let expect = BTreeMap::from([("p".to_string(), model)]);
    kernel_reads(&image, &tmp.join("mnt"), &expect);
}

/// Thousands of fills at random places of a 32 MiB prealloc file, so that its items fill
/// many leaves: most fills change their leaf in place (cut, merged with a neighbour), and
/// those that meet a full leaf go item by item. The items tile the file (each starts where
/// the one before ends, written where written, prealloc elsewhere), the data reads back as
/// written through oleo and the kernel, and `btrfs check` accepts the references and sums.
#[test]
fn many_fills_of_prealloc_across_leaves() {
    let Some((tmp, image)) = setup("oleo-nocow-many-fills", 256) else {
        return;
    };
    let size = 32 * MIB;
    let fs = open_rw(&image);
    let f = new_file(&fs, fs.root(), "p", false);
    fs.fallocate(f, 0, size, FallocMode::Allocate { keep_size: false })
        .expect("fallocate");
    fs.sync().expect("commit");
    let mut model = vec![0u8; size as usize];
    let mut written = vec![false; (size / 4096) as usize];
    let mut rng = Rng::new(7);
    for i in 0..6000u64 {
        let sector = rng.below(size / 4096);
        // Mostly single sectors; some two at once, and some runs that close gaps between
        // written neighbours (merging both).
        let len = match rng.below(8) {
            0 => 8192,
            1 => 4096 * (1 + rng.below(6)),
            _ => 4096,
        }
        .min(size - sector * 4096);
        let at = sector * 4096;
        let data = pattern(i, len as usize);
        fs.write(f, at, &data).expect("write");
        put(&mut model, at, &data);
        for s in sector..sector + len / 4096 {
            written[s as usize] = true;
        }
        if i % 2000 == 1999 {
            fs.sync().expect("commit");
        }
    }
    assert!(read_all(&fs, f) == model, "oleo reads other data");
    fs.close().expect("close");
    let items = extent_items(&image, 5, f.ino);
    let mut end = 0;
    for (off, _, _, _, len, kind) in &items {
        assert_eq!(
            *off, end,
            "a gap or an overlap before the item at {off}: {items:?}"
        );
        let sectors = &written[(off / 4096) as usize..((off + len) / 4096) as usize];
        let want = if sectors[0] { "regular" } else { "prealloc" };
        assert_eq!(kind, want, "item at {off}");
        assert!(
            sectors.iter().all(|&w| w == sectors[0]),
            "the item at {off} mixes written and unwritten sectors"
        );
        end = off + len;
    }
    assert_eq!(end, size);
    assert!(items.len() > 1000, "only {} items", items.len());
    assert_btrfs_check(&image, "the fills");
    if let Err(e) = oleo_testkit::btrfs_check(&image, true) {
        panic!("btrfs check --check-data-csum: {e}");
    }
    let expect = BTreeMap::from([("p".to_string(), model)]);
    kernel_reads(&image, &tmp.join("mnt"), &expect);
}

/// A fill of preallocated space checks the file as a copy-on-write write does: an
/// immutable file refuses it with EPERM and nothing changes; cleared, the write lands.
#[test]
fn fills_of_an_immutable_file_are_refused() {
    let Some((_tmp, image)) = setup("oleo-nocow-prealloc-immutable", 256) else {
        return;
    };
    let fs = open_rw(&image);
    let f = new_file(&fs, fs.root(), "p", false);
    fs.fallocate(f, 0, 64 * KIB, FallocMode::Allocate { keep_size: false })
        .expect("fallocate");
    fs.set_fs_flags(f, fs_flags::IMMUTABLE).expect("chattr +i");
    let data = pattern(3, 4096);
    let e = fs
        .write(f, 8 * KIB, &data)
        .expect_err("a write into an immutable file");
    assert_eq!(e.errno(), libc::EPERM, "{e}");
    assert_eq!(read_all(&fs, f), vec![0u8; 64 * KIB as usize]);
    fs.set_fs_flags(f, 0).expect("chattr -i");
    fs.write(f, 8 * KIB, &data).expect("write");
    let mut model = vec![0u8; 64 * KIB as usize];
    put(&mut model, 8 * KIB, &data);
    assert_eq!(read_all(&fs, f), model);
    fs.close().expect("close");
}

fn xfs_io(path: &Path, cmds: &[&str]) {
    let mut c = Command::new("xfs_io");
    for cmd in cmds {
        c.args(["-c", cmd]);
    }
    let st = c.arg(path).status().expect("xfs_io");
    assert!(st.success(), "xfs_io {cmds:?}");
}

/// Seeded random operations on NOCOW and checksummed files (writes anywhere, fallocate
/// with and without KEEP_SIZE, hole punching, truncation, reflinks, snapshots, commits),
/// compared with a reference after every step's file and at the end through the kernel.
#[test]
fn random_operations_on_nocow_and_prealloc_files_match_a_reference() {
    random_case("oleo-nocow-random", &[], 13);
}

/// The same where holes are explicit extent items (mkfs -O ^no-holes): a write that
/// grows a file through preallocated space past its end leaves a hole item before it.
#[test]
fn random_operations_with_explicit_holes() {
    random_case("oleo-nocow-random-holes", &["-O", "^no-holes"], 31);
}

fn random_case(label: &str, mkfs: &[&str], default_seed: u64) {
    let Some((tmp, image)) = common::scratch_image("nocow tests", label, 512, mkfs) else {
        return;
    };
    let seed = oleo_testkit::seed(default_seed);
    eprintln!("seed {seed} (OLEO_TEST_SEED replays it)");
    let mut rng = Rng::new(seed);
    let fs = open_rw(&image);
    let top = fs.root();
    fs.create_subvolume(top, b"vol", 0, 0).expect("subvolume");
    let vol = resolve(&fs, "vol");
    let nocow_dir = fs
        .mkdir(vol, b"nocow", &NewInode::dir(0o755))
        .expect("mkdir")
        .id;
    fs.set_fs_flags(nocow_dir, fs_flags::NOCOW)
        .expect("chattr +C dir");
    let mut files: Vec<(String, InodeId, Vec<u8>)> = Vec::new();
    for i in 0..6 {
        let nocow = i % 2 == 0;
        let (dir, path) = if nocow {
            (nocow_dir, "vol/nocow")
        } else {
            (vol, "vol")
        };
        let name = format!("f{i}");
        let id = fs
            .mknod(dir, name.as_bytes(), &NewInode::file(0o644))
            .expect("create")
            .id;
        // Inherited from the directory, as the kernel's btrfs_inherit_iflags does.
        assert_eq!(fs.get_fs_flags(id).unwrap() & fs_flags::NOCOW != 0, nocow);
        files.push((format!("{path}/{name}"), id, Vec::new()));
    }
    let mut snapshots: Vec<(String, Files)> = Vec::new();
    let steps = 1500;
    for step in 0..steps {
        let i = rng.below(files.len() as u64) as usize;
        let id = files[i].1;
        let size = files[i].2.len() as u64;
        match rng.below(20) {
            0..=9 => {
                let at = if size > 0 && rng.below(4) > 0 {
                    rng.below(size)
                } else {
                    rng.below(2 * MIB)
                };
                let len = [1, 512, 4096, 5000, 65_536, 300_000][rng.below(6) as usize];
                let data = pattern(seed ^ step, len);
                fs.write(id, at, &data).expect("write");
                put(&mut files[i].2, at, &data);
            }
            10..=11 => {
                let at = rng.below(2 * MIB) / 4096 * 4096;
                let len = (1 + rng.below(64)) * 4096;
                let keep_size = rng.below(2) == 0;
                fs.fallocate(id, at, len, FallocMode::Allocate { keep_size })
                    .expect("fallocate");
                if !keep_size && at + len > size {
                    files[i].2.resize((at + len) as usize, 0);
                }
            }
            12 => {
                if size > 0 {
                    let at = rng.below(size);
                    let len = 1 + rng.below(100_000);
                    fs.fallocate(id, at, len, FallocMode::PunchHole)
                        .expect("punch");
                    let end = (at + len).min(size) as usize;
                    files[i].2[at as usize..end].fill(0);
                }
            }
            13 => {
                let to = rng.below(size + 1);
                let set = oleo::SetAttr {
                    size: Some(to),
                    ..Default::default()
                };
                fs.setattr(id, &set).expect("truncate");
                files[i].2.resize(to as usize, 0);
            }
            14..=15 => {
                // A reflink (or a copy between checksummed and NOCOW files).
                let j = rng.below(files.len() as u64) as usize;
                if j != i && size > 0 {
                    let src_off = rng.below(size) / 4096 * 4096;
                    let dst_off = rng.below(MIB) / 4096 * 4096;
                    let len = (1 + rng.below(32)) * 4096;
                    let n = fs
                        .copy_file_range(id, src_off, files[j].1, dst_off, len)
                        .expect("copy");
                    let src = files[i].2[src_off as usize..(src_off + n) as usize].to_vec();
                    put(&mut files[j].2, dst_off, &src);
                }
            }
            16 => {
                let name = format!("snap{step}");
                fs.snapshot(vol.subvol, top, name.as_bytes(), rng.below(2) == 0)
                    .expect("snapshot");
                let content = files
                    .iter()
                    .map(|(p, _, m)| (p.clone(), m.clone()))
                    .collect();
                snapshots.push((name, content));
            }
            17 => {
                fs.sync().expect("commit");
            }
            _ => {
                fs.fsync(id, false).expect("fsync");
            }
        }
        let got = read_all(&fs, files[i].1);
        assert!(
            got == files[i].2,
            "step {step}: {} differs from the reference",
            files[i].0
        );
    }
    let mut expect = BTreeMap::new();
    for (path, id, model) in &files {
        assert!(read_all(&fs, *id) == *model, "{path} differs at the end");
        expect.insert(path.clone(), model.clone());
    }
    for (name, content) in &snapshots {
        for (path, model) in content {
            let p = path.replacen("vol", name, 1);
            let id = resolve(&fs, &p);
            assert!(
                read_all(&fs, id) == *model,
                "{p} changed after its snapshot"
            );
            expect.insert(p, model.clone());
        }
    }
    fs.close().expect("close");
    if let Err(e) = oleo_testkit::btrfs_check(&image, true) {
        panic!("btrfs check --check-data-csum: {e}");
    }
    assert_btrfs_check(&image, "after random operations");
    kernel_reads(&image, &tmp.join("mnt"), &expect);
}

/// Writers overwrite their own blocks of one NOCOW file in place from several threads
/// while snapshots are taken: every snapshot reads the same when taken and at the end
/// (no in-place write went through a shared extent), and the file holds each block's
/// last write.
#[test]
fn concurrent_in_place_writers_never_write_through_a_snapshot() {
    let Some((tmp, image)) = setup("oleo-nocow-concurrent", 512) else {
        return;
    };
    const BLOCK: usize = 16 * 1024;
    const BLOCKS: u64 = 64;
    const WRITERS: u64 = 4;
    let fs = std::sync::Arc::new(open_rw(&image));
    let top = fs.root();
    fs.create_subvolume(top, b"vol", 0, 0).expect("subvolume");
    let vol = resolve(&fs, "vol");
    let f = new_file(&fs, vol, "db", true);
    fs.write(f, 0, &vec![0u8; BLOCK * BLOCKS as usize]).unwrap();
    fs.sync().unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let (fs, stop) = (fs.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut last = BTreeMap::new();
                let mut n = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let b = w + WRITERS * (n % (BLOCKS / WRITERS));
                    let data = pattern(w << 32 | n, BLOCK);
                    fs.write(f, b * BLOCK as u64, &data).expect("write");
                    last.insert(b, data);
                    n += 1;
                }
                (n, last)
            })
        })
        .collect();
    let mut taken = Vec::new();
    for s in 0..6 {
        std::thread::sleep(std::time::Duration::from_millis(60));
        let name = format!("snap{s}");
        fs.snapshot(vol.subvol, top, name.as_bytes(), true)
            .expect("snapshot");
        let id = resolve(&fs, &format!("{name}/db"));
        taken.push((name, read_all(&fs, id)));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut model = vec![0u8; BLOCK * BLOCKS as usize];
    for w in writers {
        let (n, last) = w.join().unwrap();
        assert!(n > 10, "a writer made {n} writes");
        for (b, data) in last {
            put(&mut model, b * BLOCK as u64, &data);
        }
    }
    assert!(read_all(&fs, f) == model, "the file lost a write");
    let mut expect = BTreeMap::new();
    for (name, content) in &taken {
        let id = resolve(&fs, &format!("{name}/db"));
        assert!(
            read_all(&fs, id) == *content,
            "{name} changed after it was taken"
        );
        expect.insert(format!("{name}/db"), content.clone());
    }
    expect.insert("vol/db".to_string(), model);
    let fs = std::sync::Arc::try_unwrap(fs).ok().expect("writers done");
    fs.close().expect("close");
    assert_btrfs_check(&image, "after concurrent in-place writes");
    kernel_reads(&image, &tmp.join("mnt"), &expect);
}

/// Writers fill their own blocks of a preallocated file from several threads (a fill's
/// item change is queued when its write returns and applied later, in a batch with
/// others), each reading its block back at once, one of them fsyncing, while snapshots
/// are taken: a read right after a write returns sees it, a snapshot holds every write
/// that returned before it began (and nothing older) and never changes after, and at the
/// end the file holds each block's last write, `btrfs check` is clean and the kernel
/// reads the same. Checksummed and NOCOW files both.
#[test]
fn queued_prealloc_fills_are_seen_by_reads_fsyncs_and_snapshots() {
    use std::sync::{Arc, Mutex};
    let Some((tmp, image)) = setup("oleo-prealloc-queued", 512) else {
        return;
    };
    const BLOCK: usize = 4096;
    const BLOCKS: u64 = 512;
    const WRITERS: u64 = 4;
    let fs = Arc::new(open_rw(&image));
    let top = fs.root();
    fs.create_subvolume(top, b"vol", 0, 0).expect("subvolume");
    let vol = resolve(&fs, "vol");
    let files: Vec<InodeId> = [("sums", false), ("nocow", true)]
        .iter()
        .map(|&(name, nocow)| {
            let f = new_file(&fs, vol, name, nocow);
            fs.fallocate(
                f,
                0,
                BLOCK as u64 * BLOCKS,
                FallocMode::Allocate { keep_size: false },
            )
            .expect("fallocate");
            f
        })
        .collect();
    fs.sync().unwrap();
    // Per file and block, every write that returned, in order (one writer per block).
    type History = Vec<Vec<Vec<Vec<u8>>>>;
    let history: Arc<Mutex<History>> = Arc::new(Mutex::new(vec![
        vec![Vec::new(); BLOCKS as usize];
        files.len()
    ]));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let (fs, stop, history, files) =
                (fs.clone(), stop.clone(), history.clone(), files.clone());
            std::thread::spawn(move || {
                let mut n = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let (fi, f) = ((n % 2) as usize, files[(n % 2) as usize]);
                    // Blocks of this writer in a scattered order: most fills split a
                    // prealloc item, some land on written blocks.
                    let b = w + WRITERS * ((n * 37 + w * 11) % (BLOCKS / WRITERS));
                    let data = pattern(w << 40 | n, BLOCK);
                    fs.write(f, b * BLOCK as u64, &data).expect("write");
                    history.lock().unwrap()[fi][b as usize].push(data.clone());
                    let back = fs.read(f, b * BLOCK as u64, BLOCK as u32).expect("read");
                    assert!(back == data, "a read right after a write missed it");
                    if w == 0 && n.is_multiple_of(64) {
                        fs.fsync(f, false).expect("fsync");
                    }
                    n += 1;
                }
                n
            })
        })
        .collect();
    let mut taken = Vec::new();
    for s in 0..5 {
        std::thread::sleep(std::time::Duration::from_millis(80));
        // What had returned before the snapshot began: each block holds this write or a
        // later one in the snapshot.
        let before: Vec<Vec<usize>> = history
            .lock()
            .unwrap()
            .iter()
            .map(|f| f.iter().map(Vec::len).collect())
            .collect();
        let name = format!("snap{s}");
        fs.snapshot(vol.subvol, top, name.as_bytes(), true)
            .expect("snapshot");
        let contents: Vec<Vec<u8>> = ["sums", "nocow"]
            .iter()
            .map(|f| read_all(&fs, resolve(&fs, &format!("{name}/{f}"))))
            .collect();
        taken.push((name, before, contents));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for w in writers {
        let n = w.join().unwrap();
        assert!(n > 20, "a writer made {n} writes");
    }
    let history = history.lock().unwrap();
    let zeros = vec![0u8; BLOCK];
    for (name, before, contents) in &taken {
        for (fi, content) in contents.iter().enumerate() {
            for b in 0..BLOCKS as usize {
                let got = &content[b * BLOCK..(b + 1) * BLOCK];
                let writes = &history[fi][b];
                let ok = if before[fi][b] == 0 {
                    got == zeros || writes.iter().any(|d| d == got)
                } else {
                    writes[before[fi][b] - 1..].iter().any(|d| d == got)
                };
                assert!(
                    ok,
                    "{name}: block {b} of file {fi} holds a write older than the snapshot"
                );
            }
        }
    }
    let mut expect = BTreeMap::new();
    for (fi, (f, name)) in files.iter().zip(["sums", "nocow"]).enumerate() {
        let mut model = vec![0u8; BLOCK * BLOCKS as usize];
        for (b, writes) in history[fi].iter().enumerate() {
            if let Some(last) = writes.last() {
                put(&mut model, (b * BLOCK) as u64, last);
            }
        }
        assert!(read_all(&fs, *f) == model, "{name} lost a write");
        expect.insert(format!("vol/{name}"), model);
    }
    for (name, _, contents) in &taken {
        for (f, content) in ["sums", "nocow"].iter().zip(contents) {
            let now = read_all(&fs, resolve(&fs, &format!("{name}/{f}")));
            assert!(now == *content, "{name}/{f} changed after it was taken");
            expect.insert(format!("{name}/{f}"), content.clone());
        }
    }
    drop(history);
    let fs = Arc::try_unwrap(fs).ok().expect("writers done");
    fs.close().expect("close");
    assert_btrfs_check(&image, "after queued prealloc fills");
    kernel_reads(&image, &tmp.join("mnt"), &expect);
}

/// Crash states while a NOCOW file is overwritten in place, with fsyncs between: at
/// every crash point `btrfs check` is clean, and each sector holds what it held at the
/// last fsync before the crash or something written after it (in-place data is old or
/// new per sector, never anything else).
#[test]
fn crash_states_of_in_place_writes() {
    use common::crash::{crash_image, sparse_copy};
    const SECTOR: usize = 4096;
    const SECTORS: usize = 64;
    let Some((tmp, image)) = setup("oleo-nocow-crash", 256) else {
        return;
    };
    let fs = open_rw(&image);
    let top = fs.root();
    let f = new_file(&fs, top, "db", true);
    fs.write(f, 0, &vec![0u8; SECTOR * SECTORS]).unwrap();
    fs.close().unwrap();
    let base = tmp.join("base");
    sparse_copy(&image, &base);
    let fs = open_rw(&image);
    let f = resolve(&fs, "db");
    let layout = fs.file_extents(f).unwrap();
    fs.start_io_recording();
    let mut rng = Rng::new(oleo_testkit::seed(17));
    // Per sector, the versions written and the event count when each was written.
    let mut current = vec![vec![0u8; SECTOR]; SECTORS];
    // (events so far, sector contents) at each fsync's return.
    let mut synced: Vec<(usize, Vec<Vec<u8>>)> = vec![(0, current.clone())];
    // (events before, events after, sector, data) of every sector written.
    let mut writes: Vec<(usize, usize, usize, Vec<u8>)> = Vec::new();
    let mut events = Vec::new();
    for op in 0..120u64 {
        let first = rng.below(SECTORS as u64) as usize;
        let count = (1 + rng.below(4) as usize).min(SECTORS - first);
        let data = pattern(1000 + op, count * SECTOR);
        let before = events.len();
        fs.write(f, (first * SECTOR) as u64, &data).unwrap();
        events.extend(fs.take_io_recording());
        assert_eq!(
            fs.file_extents(f).unwrap(),
            layout,
            "write {op} was not in place"
        );
        for k in 0..count {
            let sector = data[k * SECTOR..(k + 1) * SECTOR].to_vec();
            current[first + k] = sector.clone();
            writes.push((before, events.len(), first + k, sector));
        }
        if rng.below(4) == 0 {
            fs.fsync(f, false).unwrap();
            events.extend(fs.take_io_recording());
            synced.push((events.len(), current.clone()));
        }
    }
    drop(fs);
    let crash = tmp.join("crash");
    let mut cuts: Vec<usize> = (0..24)
        .map(|_| rng.below(events.len() as u64 + 1) as usize)
        .collect();
    cuts.extend(synced.iter().map(|s| s.0));
    cuts.sort();
    cuts.dedup();
    for n in cuts {
        crash_image(&base, &crash, &events, n, &mut rng);
        assert_btrfs_check(
            &crash,
            &format!("a crash after {n} of {} events", events.len()),
        );
        let (at, state) = synced.iter().rev().find(|s| s.0 <= n).unwrap();
        let fs = open_rw(&crash);
        let got = read_all(&fs, resolve(&fs, "db"));
        drop(fs);
        assert_eq!(got.len(), SECTOR * SECTORS);
        for s in 0..SECTORS {
            let have = &got[s * SECTOR..(s + 1) * SECTOR];
            let ok = have == state[s].as_slice()
                || writes
                    .iter()
                    .any(|(b, e, i, d)| *i == s && *e > *at && *b < n && d.as_slice() == have);
            let which: Vec<_> = writes
                .iter()
                .filter(|(_, _, i, d)| *i == s && d.as_slice() == have)
                .map(|(b, e, _, _)| (*b, *e))
                .collect();
            assert!(
                ok,
                "crash at {n}: sector {s} holds neither its fsynced data nor a later write \
                 (last fsync at {at}; that data was written at {which:?}; zeros: {})",
                have.iter().all(|&b| b == 0)
            );
        }
    }
}
