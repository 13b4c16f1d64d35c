//! Data written in order lies in one extent, as the kernel's delayed allocation lays it
//! out: oleo allocates per write (a FUSE WRITE carries at most 1 MiB), and a write that
//! continues a file's newest extent is put right after it and grows it
//! (`Transaction::join_previous`). Checked against the kernel's layout of the same writes,
//! and for exactness where the grown extent is overwritten, truncated, reflinked, fsynced
//! or committed between writes: the items and reference counts, `btrfs check
//! --check-data-csum`, and every byte read back by oleo and by the kernel.
//!
//! Needs root, kernel btrfs and btrfs-progs (a skip elsewhere, a failure under CI=true).

mod common;

use common::extents::{data_extent_refs, extent_items, kernel_reads};
use common::open_top_rw as open_rw;
use oleo::{Filesystem, InodeId, NewInode, SetAttr};
use oleo_testkit::ops::{pattern, put};
use oleo_testkit::{assert_btrfs_check, KernelMount};
use std::collections::BTreeMap;
use std::path::Path;

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;

fn new_file(fs: &Filesystem, name: &str) -> InodeId {
    fs.mknod(fs.root(), name.as_bytes(), &NewInode::file(0o644))
        .expect("create")
        .id
}

/// Writes `len` bytes at `off` in pieces of `piece` bytes, in order, into the file and
/// its model.
fn write_in_order(
    fs: &Filesystem,
    f: InodeId,
    model: &mut Vec<u8>,
    off: u64,
    len: u64,
    piece: u64,
    seed: u64,
) {
    let mut at = off;
    while at < off + len {
        let n = piece.min(off + len - at);
        let data = pattern(seed + at, n as usize);
        assert_eq!(fs.write(f, at, &data).expect("write"), n as usize);
        put(model, at, &data);
        at += n;
    }
}

/// The regular EXTENT_DATA items of `ino`: (file offset, disk address, extent offset,
/// length).
fn regular(image: &Path, ino: u64) -> Vec<(u64, u64, u64, u64)> {
    extent_items(image, 5, ino)
        .into_iter()
        .filter(|i| i.5 == "regular")
        .map(|i| (i.0, i.2, i.3, i.4))
        .collect()
}

/// The csum tree's items: (key offset, bytes) of each, as dump-tree prints them.
fn csum_items(image: &Path) -> Vec<(u64, u64)> {
    let out = std::process::Command::new("btrfs")
        .args(["inspect-internal", "dump-tree", "-t", "csum"])
        .arg(image)
        .output()
        .expect("dump-tree");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.trim_start().starts_with("item ") && l.contains("EXTENT_CSUM"))
        .map(|l| {
            let words: Vec<&str> = l.split_whitespace().collect();
            let off = words[5]
                .trim_end_matches(')')
                .parse()
                .expect("csum key offset");
            let size = words.last().and_then(|w| w.parse().ok()).expect("itemsize");
            (off, size)
        })
        .collect()
}

/// 6 MiB written in 256 KiB pieces, in order, into a fresh filesystem: one item and one
/// extent, as the kernel makes of the same writes (buffered, then synced), and its sums in
/// as many csum items as the kernel's (each write's sums appended to the item before).
#[test]
fn data_written_in_order_is_one_extent_as_the_kernel_makes_it() {
    let Some((tmp, image)) = common::scratch_image("data extent tests", "oleo-join-seq", 256, &[])
    else {
        return;
    };
    let kimage = tmp.join("kernel-image");
    oleo_testkit::image::empty_image(&kimage, 256, &[]).expect("mkfs.btrfs");
    let fs = open_rw(&image);
    let f = new_file(&fs, "seq");
    let mut model = Vec::new();
    write_in_order(&fs, f, &mut model, 0, 6 * MIB, 256 * KIB, 1);
    fs.close().expect("close");

    let m = KernelMount::mount(&kimage, &tmp.join("kmnt"), &["rw", "noatime"]).expect("mount");
    std::fs::write(m.path().join("seq"), &model).expect("kernel write");
    drop(m);

    let ours = regular(&image, f.ino);
    let theirs = regular(&kimage, 257);
    assert_eq!(ours.len(), 1, "one extent: {ours:?}");
    assert_eq!(
        ours.iter().map(|i| (i.0, i.2, i.3)).collect::<Vec<_>>(),
        theirs.iter().map(|i| (i.0, i.2, i.3)).collect::<Vec<_>>(),
        "items (file offset, extent offset, length): oleo's, then the kernel's"
    );
    assert_eq!(data_extent_refs(&image), data_extent_refs(&kimage));
    let sizes = |image: &Path| csum_items(image).iter().map(|i| i.1).collect::<Vec<_>>();
    assert_eq!(
        sizes(&image),
        sizes(&kimage),
        "csum item sizes: oleo's, then the kernel's"
    );
    assert_btrfs_check(&image, "writes in order");
    kernel_reads(&image, &tmp.join("mnt"), &BTreeMap::from([("seq", model)]));
}

/// A grown extent stays exact whatever happens to it: overwritten in its middle,
/// truncated and appended to, reflinked and appended to, fsynced between writes (the log
/// names it with its length then: it grows no more in that transaction), committed between
/// writes, written out of order.
#[test]
fn grown_extents_stay_exact_through_overwrites_truncates_reflinks_fsyncs_and_commits() {
    let Some((tmp, image)) =
        common::scratch_image("data extent tests", "oleo-join-mixed", 512, &[])
    else {
        return;
    };
    let fs = open_rw(&image);
    let mut models: BTreeMap<&str, Vec<u8>> = BTreeMap::new();
    let mut ids: BTreeMap<&str, InodeId> = BTreeMap::new();
    for name in [
        "over",
        "trunc",
        "src",
        "clone",
        "fsynced",
        "committed",
        "shuffled",
    ] {
        ids.insert(name, new_file(&fs, name));
        models.insert(name, Vec::new());
    }
    macro_rules! w {
        ($name:expr, $off:expr, $len:expr, $piece:expr, $seed:expr) => {
            write_in_order(
                &fs,
                ids[$name],
                models.get_mut($name).unwrap(),
                $off,
                $len,
                $piece,
                $seed,
            )
        };
    }
    // Grown, then 1 MiB in its middle written again: the extent stays, referenced twice.
    w!("over", 0, 4 * MIB, 512 * KIB, 10);
    w!("over", MIB + 4 * KIB, MIB, MIB, 11);
    // Grown, cut inside it, grown again past the cut.
    w!("trunc", 0, 2 * MIB, 256 * KIB, 20);
    let cut = 3 * MIB / 2 + 4 * KIB;
    fs.setattr(
        ids["trunc"],
        &SetAttr {
            size: Some(cut),
            ..Default::default()
        },
    )
    .expect("truncate");
    models.get_mut("trunc").unwrap().truncate(cut as usize);
    w!("trunc", cut, MIB, 256 * KIB, 21);
    // Grown, reflinked whole into another file, then grown no more (two references).
    w!("src", 0, 2 * MIB, 512 * KIB, 30);
    fs.reflink(ids["src"], 0, ids["clone"], 0, 2 * MIB)
        .expect("reflink");
    *models.get_mut("clone").unwrap() = models["src"].clone();
    w!("src", 2 * MIB, MIB, 512 * KIB, 31);
    w!("clone", 2 * MIB, MIB, 512 * KIB, 32);
    // Fsynced between writes.
    w!("fsynced", 0, MIB, 256 * KIB, 40);
    fs.fsync(ids["fsynced"], false).expect("fsync");
    w!("fsynced", MIB, MIB, 256 * KIB, 41);
    fs.fsync(ids["fsynced"], false).expect("fsync");
    // Committed between writes.
    w!("committed", 0, MIB, 256 * KIB, 50);
    fs.sync().expect("commit");
    w!("committed", MIB, MIB, 256 * KIB, 51);
    // Out of order: 0-1, 2-3, then 1-2 MiB.
    w!("shuffled", 0, MIB, 512 * KIB, 60);
    w!("shuffled", 2 * MIB, MIB, 512 * KIB, 61);
    w!("shuffled", MIB, MIB, 512 * KIB, 62);
    for (name, want) in &models {
        let got = fs.read(ids[name], 0, 8 * MIB as u32).expect("read");
        assert!(
            got == *want,
            "oleo reads {name} differently before the commit"
        );
    }
    fs.close().expect("close");

    let items = |name: &str| regular(&image, ids[name].ino);
    // The overwritten range cut the grown extent in two items around the new one.
    let over = items("over");
    assert_eq!(over.len(), 3, "{over:?}");
    assert_eq!(
        over[0].1, over[2].1,
        "both ends map the grown extent: {over:?}"
    );
    assert_eq!(
        (over[2].2, over[2].3),
        (2 * MIB + 4 * KIB, 2 * MIB - 4 * KIB)
    );
    // Fsynced: two extents (the second write did not grow the logged one).
    let fsynced = items("fsynced");
    assert_eq!(fsynced.len(), 2, "{fsynced:?}");
    assert_ne!(fsynced[0].1, fsynced[1].1);
    // Out of order: the 2-3 MiB write was placed where the gap would end, and the gap's
    // write joined both.
    let shuffled = items("shuffled");
    assert_eq!(shuffled.len(), 1, "{shuffled:?}");
    assert_eq!((shuffled[0].2, shuffled[0].3), (0, 3 * MIB));
    // Committed: two extents, one per transaction.
    assert_eq!(items("committed").len(), 2, "{:?}", items("committed"));
    // The reflinked extent kept its length: the file and its clone each map all of it.
    let src = items("src");
    let clone = items("clone");
    assert_eq!(src[0].1, clone[0].1, "shared: {src:?} {clone:?}");
    assert_eq!((src[0].2, src[0].3), (0, 2 * MIB));
    assert_eq!((clone[0].2, clone[0].3), (0, 2 * MIB));
    assert_btrfs_check(&image, "grown extents");
    kernel_reads(&image, &tmp.join("mnt"), &models);
    // And oleo again, from disk.
    let fs = open_rw(&image);
    for (name, want) in &models {
        let got = fs.read(ids[name], 0, 8 * MIB as u32).expect("read");
        assert!(
            got == *want,
            "oleo reads {name} differently after the commit"
        );
    }
}
