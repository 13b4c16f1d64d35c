//! Lookups in directories made by this process answer "no such name" without the
//! filesystem's lock (`transaction/name_sets.rs`). That answer must never be wrong: every
//! way a name enters such a directory (create, mknod, mkdir, symlink, link, rename from
//! elsewhere, an exchange, a subvolume, a snapshot, an O_TMPFILE file linked in) makes the
//! name found at once, a removed and re-made name is found, a subvolume's deletion and a
//! reopen leave nothing stale, and a name created by one thread is found by another as
//! soon as the create returns. After it all `btrfs check` is clean.
//!
//! Needs root and btrfs-progs (prints `SKIP: ...` without them; fails under CI=true).

use oleo::{Error, Filesystem, InodeId, NewInode, OpenOptions, RenameFlags};
use oleo_testkit::{assert_btrfs_check, TempDir};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

fn absent(fs: &Filesystem, dir: InodeId, name: &[u8]) -> bool {
    matches!(fs.lookup(dir, name), Err(Error::NotFound))
}

fn found(fs: &Filesystem, dir: InodeId, name: &[u8]) -> InodeId {
    fs.lookup(dir, name)
        .unwrap_or_else(|e| panic!("{}: {e:?}", String::from_utf8_lossy(name)))
}

/// A fresh 256 MiB image opened for writing; None (after a SKIP line) without root.
fn fresh(name: &str) -> Option<(TempDir, PathBuf, Filesystem)> {
    if !oleo_testkit::require_root(name) {
        return None;
    }
    let dir = TempDir::new(name).unwrap();
    let image = dir.join("image");
    oleo_testkit::empty_image(&image, 256, &[]).unwrap();
    let fs = Filesystem::open_rw(&image, OpenOptions::default()).unwrap();
    Some((dir, image, fs))
}

#[test]
fn every_way_into_a_directory_made_here_is_found_at_once() {
    let Some((_dir, image, fs)) = fresh("names_every_way_in") else {
        return;
    };
    let root = fs.root();
    let d = fs.mkdir(root, b"d", &NewInode::dir(0o755)).unwrap().id;
    let elsewhere = fs.mkdir(root, b"e", &NewInode::dir(0o755)).unwrap().id;
    assert!(absent(&fs, d, b"file"));

    let file = fs.mknod(d, b"file", &NewInode::file(0o644)).unwrap().id;
    assert_eq!(found(&fs, d, b"file"), file);
    fs.mknod(d, b"fifo", &NewInode::with_mode(libc::S_IFIFO | 0o644))
        .unwrap();
    found(&fs, d, b"fifo");
    let sub = fs.mkdir(d, b"sub", &NewInode::dir(0o755)).unwrap().id;
    found(&fs, d, b"sub");
    fs.symlink(d, b"link", b"file", 0, 0).unwrap();
    found(&fs, d, b"link");
    fs.link(file, d, b"hard").unwrap();
    assert_eq!(found(&fs, d, b"hard"), file);

    // From a directory made here into another, and into the one made here from one that
    // was not (the root).
    let moved = fs
        .mknod(elsewhere, b"moved", &NewInode::file(0o644))
        .unwrap()
        .id;
    fs.rename(elsewhere, b"moved", d, b"moved-in", RenameFlags::default())
        .unwrap();
    assert_eq!(found(&fs, d, b"moved-in"), moved);
    assert!(absent(&fs, elsewhere, b"moved"));
    fs.mknod(root, b"from-root", &NewInode::file(0o644))
        .unwrap();
    fs.rename(root, b"from-root", sub, b"arrived", RenameFlags::default())
        .unwrap();
    found(&fs, sub, b"arrived");
    let x = fs
        .mknod(elsewhere, b"x", &NewInode::file(0o644))
        .unwrap()
        .id;
    let y = fs.mknod(sub, b"y", &NewInode::file(0o644)).unwrap().id;
    let exchange = RenameFlags {
        exchange: true,
        ..Default::default()
    };
    fs.rename(elsewhere, b"x", sub, b"y", exchange).unwrap();
    assert_eq!(found(&fs, sub, b"y"), x);
    assert_eq!(found(&fs, elsewhere, b"x"), y);

    let tmp = fs.tmpfile(d, &NewInode::file(0o600)).unwrap().id;
    fs.link(tmp, d, b"was-tmp").unwrap();
    assert_eq!(found(&fs, d, b"was-tmp"), tmp);

    let subvol = fs.create_subvolume(d, b"subvol", 0, 0).unwrap();
    assert_eq!(found(&fs, d, b"subvol").subvol, subvol);
    let snap = fs.snapshot(subvol, d, b"snap", false).unwrap();
    assert_eq!(found(&fs, d, b"snap").subvol, snap);
    // Inside the new subvolume: its root was not made by mkdir here, but names made in it
    // are found all the same.
    let sroot = found(&fs, d, b"subvol");
    let inner = fs.mkdir(sroot, b"inner", &NewInode::dir(0o755)).unwrap().id;
    fs.mknod(inner, b"deep", &NewInode::file(0o644)).unwrap();
    found(&fs, inner, b"deep");
    fs.delete_subvolume(d, b"snap").unwrap();
    assert!(absent(&fs, d, b"snap"));

    // Gone and made again.
    fs.unlink(d, b"file").unwrap();
    assert!(absent(&fs, d, b"file"));
    let again = fs.mknod(d, b"file", &NewInode::file(0o644)).unwrap().id;
    assert_eq!(found(&fs, d, b"file"), again);
    fs.rmdir(sub, b"..").unwrap_err();
    assert!(absent(&fs, d, b"never"));
    // "." and ".." are never "no such name".
    assert_eq!(found(&fs, d, b"."), d);
    assert_eq!(found(&fs, d, b".."), root);
    fs.sync().unwrap();
    drop(fs);

    // Reopened: the same names, from the tree.
    let fs = Filesystem::open_rw(&image, OpenOptions::default()).unwrap();
    let d = found(&fs, fs.root(), b"d");
    for name in [
        &b"file"[..],
        b"fifo",
        b"sub",
        b"link",
        b"hard",
        b"moved-in",
        b"was-tmp",
        b"subvol",
    ] {
        found(&fs, d, name);
    }
    assert!(absent(&fs, d, b"snap"));
    drop(fs);
    assert_btrfs_check(&image, "after the names");
}

/// One thread creates names in a directory made here while another looks each up as soon
/// as the create has returned: never "no such name".
#[test]
fn a_name_is_found_by_another_thread_as_soon_as_its_create_returns() {
    let Some((_dir, image, fs)) = fresh("names_across_threads") else {
        return;
    };
    let fs = Arc::new(fs);
    let d = fs.mkdir(fs.root(), b"d", &NewInode::dir(0o755)).unwrap().id;
    const N: u64 = 20_000;
    let made = Arc::new(AtomicU64::new(0));
    let looker = {
        let (fs, made) = (Arc::clone(&fs), Arc::clone(&made));
        std::thread::spawn(move || {
            let mut checked = 0;
            while checked < N {
                let upto = made.load(Ordering::Acquire);
                while checked < upto {
                    let name = format!("f{checked}");
                    assert!(
                        fs.lookup(d, name.as_bytes()).is_ok(),
                        "{name} not found after its create returned"
                    );
                    // A name not made yet (or never) may be absent, never an error.
                    match fs.lookup(d, format!("g{checked}").as_bytes()) {
                        Err(Error::NotFound) => {}
                        r => panic!("g{checked}: {r:?}"),
                    }
                    checked += 1;
                }
                std::hint::spin_loop();
            }
        })
    };
    for i in 0..N {
        fs.mknod(d, format!("f{i}").as_bytes(), &NewInode::file(0o644))
            .unwrap();
        made.store(i + 1, Ordering::Release);
    }
    looker.join().unwrap();
    fs.sync().unwrap();
    drop(fs);
    assert_btrfs_check(&image, "after the names");
}
