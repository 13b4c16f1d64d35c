//! Delayed items (`delayed_inode`): directory entries created, renamed and removed while
//! their DIR_INDEX items wait in memory read exactly as if they were in the tree: readdir
//! lists them in index order with offsets that stay valid across the batch write, a listing
//! resumed from any offset continues where it stopped, and the directory's size counts
//! them. After the commit, `btrfs check` is clean and the kernel lists the same names.
//!
//! Needs root and btrfs-progs (prints `SKIP: ...` without them; fails under CI=true).

use oleo::{Filesystem, InodeId, NewInode, OpenOptions, RenameFlags};
use oleo_testkit::{assert_btrfs_check, KernelMount, TempDir};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// A fresh 256 MiB image in its own temporary directory.
fn scratch(name: &str) -> (TempDir, PathBuf) {
    let dir = TempDir::new(name).unwrap();
    let image = dir.join("image");
    oleo_testkit::empty_image(&image, 256, &[]).unwrap();
    (dir, image)
}

/// (offset, name) of every entry from `from` on.
fn listing(fs: &Filesystem, dir: InodeId, from: u64) -> Vec<(u64, Vec<u8>)> {
    let mut out = Vec::new();
    fs.readdir(dir, from, &mut |e| {
        out.push((e.next_offset, e.name));
        true
    })
    .unwrap();
    out
}

/// A listing taken `step` entries at a time, each part resumed from the last offset.
fn listing_in_parts(fs: &Filesystem, dir: InodeId, step: usize) -> Vec<(u64, Vec<u8>)> {
    let mut out: Vec<(u64, Vec<u8>)> = Vec::new();
    loop {
        let from = out.last().map_or(0, |e| e.0);
        let mut part = Vec::new();
        fs.readdir(dir, from, &mut |e| {
            part.push((e.next_offset, e.name));
            part.len() < step
        })
        .unwrap();
        if part.is_empty() {
            return out;
        }
        out.extend(part);
    }
}

fn scratch_dirsize(names: &BTreeMap<Vec<u8>, ()>) -> u64 {
    names.keys().map(|n| 2 * n.len() as u64).sum()
}

#[test]
fn queued_entries_list_as_if_inserted() {
    if !oleo_testkit::require_root("queued_entries_list_as_if_inserted") {
        return;
    }
    let (scratch_dir, image) = scratch("delayed_list");
    let fs = Filesystem::open_rw(&image, OpenOptions::default()).unwrap();
    let root = fs.root();
    let dir = fs.mkdir(root, b"d", &NewInode::dir(0o755)).unwrap().id;
    let mut names = BTreeMap::new();
    // Some entries in the tree (committed), then more queued on top of them.
    for i in 0..150 {
        let n = format!("old-{i:04}").into_bytes();
        fs.mknod(dir, &n, &NewInode::file(0o644)).unwrap();
        names.insert(n, ());
    }
    fs.sync().unwrap();
    for i in 0..200 {
        let n = format!("new-{i:04}").into_bytes();
        fs.mknod(dir, &n, &NewInode::file(0o644)).unwrap();
        names.insert(n, ());
    }
    // Removals of both kinds: entries in the tree and entries still queued.
    for i in (0..150).step_by(3) {
        let n = format!("old-{i:04}").into_bytes();
        fs.unlink(dir, &n).unwrap();
        names.remove(&n);
    }
    for i in (0..200).step_by(4) {
        let n = format!("new-{i:04}").into_bytes();
        fs.unlink(dir, &n).unwrap();
        names.remove(&n);
    }
    // A rename within the directory gets a new index: it lists last.
    fs.rename(dir, b"old-0001", dir, b"renamed", RenameFlags::default())
        .unwrap();
    names.remove(b"old-0001".as_slice());
    names.insert(b"renamed".to_vec(), ());

    let before = listing(&fs, dir, 0);
    let listed: Vec<Vec<u8>> = before.iter().map(|e| e.1.clone()).collect();
    let mut sorted = listed.clone();
    sorted.sort();
    assert_eq!(sorted, names.keys().cloned().collect::<Vec<_>>());
    assert_eq!(listed.last().unwrap(), b"renamed", "index order");
    assert!(
        before.windows(2).all(|w| w[0].0 < w[1].0),
        "offsets grow in listing order"
    );
    assert_eq!(
        listing_in_parts(&fs, dir, 7),
        before,
        "a listing resumed in parts"
    );
    // Resuming from the middle gives the rest.
    let mid = before[before.len() / 2].0;
    assert_eq!(
        listing(&fs, dir, mid),
        before[before.len() / 2 + 1..].to_vec()
    );
    assert_eq!(fs.getattr(dir).unwrap().size, scratch_dirsize(&names));

    // After the batch write the same entries at the same offsets.
    fs.sync().unwrap();
    assert_eq!(listing(&fs, dir, 0), before, "the commit moved entries");
    assert_eq!(fs.getattr(dir).unwrap().size, scratch_dirsize(&names));
    fs.close().unwrap();
    assert_btrfs_check(&image, "after queued entries were committed");

    let mnt = scratch_dir.subdir("mnt").unwrap();
    let k = KernelMount::mount(&image, &mnt, &["ro"]).unwrap();
    let mut kernel: Vec<Vec<u8>> = std::fs::read_dir(mnt.join("d"))
        .unwrap()
        .map(|e| {
            use std::os::unix::ffi::OsStrExt;
            e.unwrap().file_name().as_bytes().to_vec()
        })
        .collect();
    kernel.sort();
    let size = std::fs::metadata(mnt.join("d")).unwrap().len();
    k.unmount().unwrap();
    assert_eq!(kernel, names.keys().cloned().collect::<Vec<_>>());
    assert_eq!(size, scratch_dirsize(&names), "the kernel's directory size");
}

/// More entries than the queue holds, from several threads into one directory and into
/// one each: the queue is written in batches on the way, and every name is there once.
#[test]
fn queue_overflows_write_batches() {
    if !oleo_testkit::require_root("queue_overflows_write_batches") {
        return;
    }
    let (_dir, image) = scratch("delayed_batches");
    let fs = Filesystem::open_rw(&image, OpenOptions::default()).unwrap();
    let root = fs.root();
    let shared = fs.mkdir(root, b"shared", &NewInode::dir(0o755)).unwrap().id;
    std::thread::scope(|sc| {
        for t in 0..4 {
            let fs = &fs;
            sc.spawn(move || {
                let own_name = format!("own-{t}").into_bytes();
                let own = fs.mkdir(root, &own_name, &NewInode::dir(0o755)).unwrap().id;
                for i in 0..1500 {
                    let n = format!("t{t}-{i:05}").into_bytes();
                    fs.mknod(shared, &n, &NewInode::file(0o644)).unwrap();
                    fs.mknod(own, &n, &NewInode::file(0o644)).unwrap();
                    if i % 5 == 0 {
                        fs.unlink(own, &n).unwrap();
                    }
                }
            });
        }
    });
    assert_eq!(listing(&fs, shared, 0).len(), 6000);
    for t in 0..4 {
        let own = fs.lookup(root, format!("own-{t}").as_bytes()).unwrap();
        assert_eq!(listing(&fs, own, 0).len(), 1200);
    }
    fs.close().unwrap();
    assert_btrfs_check(&image, "after 10,800 queued creates");
    let fs = Filesystem::open(&image, OpenOptions::default()).unwrap();
    let shared = fs.lookup(fs.root(), b"shared").unwrap();
    assert_eq!(listing(&fs, shared, 0).len(), 6000, "after reopening");
}

/// A create of a taken name fails before anything changes (its DIR_ITEM goes in first):
/// EEXIST, the transaction goes on, and the next create gets the inode number and
/// directory index the failed one would have had, as on the kernel, where the VFS
/// refuses the name before btrfs numbers anything.
#[test]
fn a_taken_name_costs_no_number() {
    if !oleo_testkit::require_root("a_taken_name_costs_no_number") {
        return;
    }
    let (_scratch_dir, image) = scratch("delayed_taken");
    let fs = Filesystem::open_rw(&image, OpenOptions::default()).unwrap();
    let root = fs.root();
    let a = fs.mknod(root, b"a", &NewInode::file(0o644)).unwrap().id;
    for taken in [&b"a"[..], b"a"] {
        let e = fs.mknod(root, taken, &NewInode::file(0o644)).unwrap_err();
        assert_eq!(e.errno(), libc::EEXIST, "{e}");
        let e = fs.mkdir(root, taken, &NewInode::dir(0o755)).unwrap_err();
        assert_eq!(e.errno(), libc::EEXIST, "{e}");
    }
    let b = fs.mknod(root, b"b", &NewInode::file(0o644)).unwrap().id;
    assert_eq!(b.ino, a.ino + 1, "a failed create used up an inode number");
    let offsets: Vec<u64> = listing(&fs, root, 0).iter().map(|e| e.0).collect();
    assert_eq!(offsets, [3, 4], "directory indexes 2 and 3, without a gap");
    fs.sync().unwrap();
    drop(fs);
    assert_btrfs_check(&image, "after failed creates");
}
