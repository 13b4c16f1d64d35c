//! Filling the filesystem: one big file, many small files, xattrs. The operation that
//! does not fit fails with ENOSPC and changes nothing; everything written before stays
//! readable (through oleo after reopening, and through the kernel), `btrfs check` is clean,
//! and after deleting something the space can be used again. Also: memory stays bounded
//! while writing much more than the dirty limit.
//!
//! Needs root and btrfs-progs (prints `SKIP: ...` without them; fails under CI=true).

use oleo::{Error, Filesystem, InodeId, NewInode, OpenOptions, SetAttr, XattrSet};
use oleo_testkit::assert_btrfs_check;
use std::path::{Path, PathBuf};
use std::process::Command;

struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str, mb: u64, args: &[&str]) -> Scratch {
        let dir = std::env::temp_dir().join(format!("oleo-enospc-{name}-{}", std::process::id()));
        let _ = Command::new("umount").arg(dir.join("mnt")).output();
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("mnt")).unwrap();
        let s = Scratch(dir);
        std::fs::File::create(s.image())
            .unwrap()
            .set_len(mb << 20)
            .unwrap();
        let out = Command::new("mkfs.btrfs")
            .arg("-q")
            .arg("-f")
            .args(args)
            .arg(s.image())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "mkfs.btrfs: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        s
    }
    fn image(&self) -> PathBuf {
        self.0.join("image")
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.0.join("mnt")).output();
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (seed as usize * 31 + i / 3) as u8)
        .collect()
}

/// Reads every listed file back through oleo and through the kernel.
fn verify(image: &Path, mnt: &Path, files: &[(Vec<u8>, Vec<u8>)], when: &str) {
    assert_btrfs_check(image, when);
    let fs = Filesystem::open(image, OpenOptions::default()).unwrap();
    for (name, data) in files {
        let id = fs
            .lookup(fs.root(), name)
            .unwrap_or_else(|e| panic!("{when}: {} missing: {e}", String::from_utf8_lossy(name)));
        let got = if data.is_empty() {
            Vec::new()
        } else {
            fs.read(id, 0, data.len() as u32).unwrap()
        };
        assert!(
            got == *data,
            "{when}: {} differs through oleo",
            String::from_utf8_lossy(name)
        );
    }
    drop(fs);
    let st = Command::new("mount")
        .args(["-o", "loop,ro"])
        .arg(image)
        .arg(mnt)
        .status()
        .unwrap();
    assert!(st.success(), "{when}: kernel mount");
    let mut bad = Vec::new();
    for (name, data) in files {
        let p = mnt.join(std::str::from_utf8(name).unwrap());
        if std::fs::read(&p).ok().as_ref() != Some(data) {
            bad.push(String::from_utf8_lossy(name).into_owned());
        }
    }
    Command::new("umount").arg(mnt).status().unwrap();
    assert!(
        bad.is_empty(),
        "{when}: the kernel reads other bytes for {bad:?}"
    );
}

fn init_log() {
    let _ = env_logger::builder().is_test(true).try_init();
}

fn is_enospc(e: &Error) -> bool {
    e.errno() == libc::ENOSPC
}

#[test]
fn one_big_file_until_full() {
    if !oleo_testkit::require_root("one_big_file_until_full") {
        return;
    }
    init_log();
    let s = Scratch::new("big", 256, &[]);
    let fs = Filesystem::open_rw(s.image(), OpenOptions::default()).unwrap();
    let root = fs.root();
    let id = fs.mknod(root, b"big", &NewInode::file(0o644)).unwrap().id;
    let chunk = 1 << 20;
    let mut written = 0u64;
    let err = loop {
        match fs.write(id, written, &pattern(written / chunk as u64, chunk)) {
            Ok(_) => written += chunk as u64,
            Err(e) => break e,
        }
        assert!(written < 1 << 30, "never filled up");
    };
    assert!(is_enospc(&err), "expected ENOSPC, got {err}");
    assert_eq!(
        fs.getattr(id).unwrap().size,
        written,
        "the failed write changed the size"
    );
    fs.sync().expect("commit after ENOSPC");
    eprintln!("big: {} MiB written before ENOSPC", written >> 20);
    assert!(written >= 128 << 20, "only {written} bytes fit in 256 MiB");
    drop(fs);
    let expect: Vec<u8> = (0..written / chunk as u64)
        .flat_map(|i| pattern(i, chunk))
        .collect();
    verify(
        &s.image(),
        &s.0.join("mnt"),
        &[(b"big".to_vec(), expect)],
        "filling with one file",
    );
    // Freeing space makes room again (after the commit that unpins it).
    let fs = Filesystem::open_rw(s.image(), OpenOptions::default()).unwrap();
    let root = fs.root();
    fs.unlink(root, b"big").unwrap();
    let id = fs.mknod(root, b"again", &NewInode::file(0o644)).unwrap().id;
    fs.write(id, 0, &pattern(9, 64 << 20))
        .expect("space is reusable after a delete");
    fs.sync().unwrap();
    drop(fs);
    verify(
        &s.image(),
        &s.0.join("mnt"),
        &[(b"again".to_vec(), pattern(9, 64 << 20))],
        "reuse after delete",
    );
}

#[test]
fn many_small_files_until_full() {
    if !oleo_testkit::require_root("many_small_files_until_full") {
        return;
    }
    let s = Scratch::new("small", 128, &["--nodesize", "4096"]);
    let fs = Filesystem::open_rw(s.image(), OpenOptions::default()).unwrap();
    let root = fs.root();
    let mut files: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
    let mut i = 0u64;
    let err = loop {
        let name = format!("file-{i:06}").into_bytes();
        // A mix of inline (small) and regular (a few sectors) files.
        let data = pattern(i, if i.is_multiple_of(3) { 700 } else { 9000 });
        let r = fs.mknod(root, &name, &NewInode::file(0o644)).and_then(|a| {
            fs.write(a.id, 0, &data)?;
            Ok(a.id)
        });
        match r {
            Ok(_) => files.push((name, data)),
            Err(e) => {
                // The file may exist (created) with its data refused: it must be empty.
                if let Ok(id) = fs.lookup(root, &name) {
                    assert_eq!(fs.getattr(id).unwrap().size, 0);
                    files.push((name, Vec::new()));
                }
                break e;
            }
        }
        i += 1;
        assert!(i < 1_000_000, "never filled up");
    };
    assert!(is_enospc(&err), "expected ENOSPC, got {err}");
    fs.sync().unwrap();
    eprintln!("small: {} files before ENOSPC", files.len());
    drop(fs);
    verify(
        &s.image(),
        &s.0.join("mnt"),
        &files,
        "filling with small files",
    );
}

#[test]
fn xattrs_until_full() {
    if !oleo_testkit::require_root("xattrs_until_full") {
        return;
    }
    let s = Scratch::new("xattr", 128, &[]);
    let fs = Filesystem::open_rw(s.image(), OpenOptions::default()).unwrap();
    let root = fs.root();
    let mut ids: Vec<InodeId> = Vec::new();
    for n in 0..20 {
        ids.push(
            fs.mknod(root, format!("x{n}").as_bytes(), &NewInode::file(0o644))
                .unwrap()
                .id,
        );
    }
    let value = vec![b'v'; 3000];
    let mut count = 0u64;
    let err = loop {
        let id = ids[(count % 20) as usize];
        match fs.setxattr(
            id,
            format!("user.a{count}").as_bytes(),
            &value,
            XattrSet::Create,
        ) {
            Ok(()) => count += 1,
            Err(e) => break e,
        }
        assert!(count < 10_000_000, "never filled up");
    };
    assert!(is_enospc(&err), "expected ENOSPC, got {err}");
    fs.sync().unwrap();
    eprintln!("xattrs: {count} xattrs of 3000 bytes before ENOSPC");
    drop(fs);
    assert_btrfs_check(&s.image(), "filling with xattrs");
    let fs = Filesystem::open(s.image(), OpenOptions::default()).unwrap();
    let total: usize = ids.iter().map(|&id| fs.listxattr(id).unwrap().len()).sum();
    assert_eq!(total as u64, count);
    assert_eq!(fs.getxattr(ids[0], b"user.a0").unwrap(), value);
}

#[test]
fn dirty_metadata_stays_bounded() {
    if !oleo_testkit::require_root("dirty_metadata_stays_bounded") {
        return;
    }
    let s = Scratch::new("bounded", 1024, &[]);
    // A small cache: the dirty limit is half of it, at least 4 MiB.
    let opts = OpenOptions {
        cache_bytes: 8 << 20,
        ..Default::default()
    };
    let fs = Filesystem::open_rw(s.image(), opts).unwrap();
    let root = fs.root();
    let mut peak = 0;
    let gen0 = fs.superblock().generation;
    for n in 0..20_000u64 {
        let id = fs
            .mknod(root, format!("f{n}").as_bytes(), &NewInode::file(0o644))
            .unwrap()
            .id;
        fs.write(id, 0, &pattern(n, 5000)).unwrap();
        peak = peak.max(fs.dirty_bytes());
    }
    let commits = fs.superblock().generation - gen0;
    eprintln!(
        "bounded: peak dirty metadata {} KiB, {commits} commits on the way",
        peak >> 10
    );
    assert!(
        peak <= (4 << 20) + (1 << 20),
        "dirty metadata grew to {peak} bytes"
    );
    assert!(commits >= 1, "the limit never forced a commit");
    fs.sync().unwrap();
    drop(fs);
    assert_btrfs_check(&s.image(), "bounded writeback");
}

/// Data block groups that hold a superblock copy (at 64 MiB on the device): those bytes are
/// neither used nor free, and must not be counted as available, or the write that needs
/// them fails with ENOSPC instead of getting a new chunk (found by the fsync-write bench).
#[test]
fn superblock_copies_are_not_free_space() {
    if !oleo_testkit::require_root("superblock_copies_are_not_free_space") {
        return;
    }
    let s = Scratch::new("sbcopy", 2048, &["-d", "single", "-m", "single"]);
    let fs = Filesystem::open_rw(s.image(), OpenOptions::default()).unwrap();
    let root = fs.root();
    let id = fs.mknod(root, b"f", &NewInode::file(0o644)).unwrap().id;
    let piece = 64 << 10;
    for i in 0..(400u64 << 20) / piece as u64 {
        fs.write(id, i * piece as u64, &pattern(i, piece))
            .unwrap_or_else(|e| panic!("write at {} MiB: {e}", (i * piece as u64) >> 20));
        if i % 64 == 0 {
            fs.sync().unwrap();
        }
    }
    fs.sync().unwrap();
    drop(fs);
    let expect: Vec<u8> = (0..(400u64 << 20) / piece as u64)
        .flat_map(|i| pattern(i, piece))
        .collect();
    verify(
        &s.image(),
        &s.0.join("mnt"),
        &[(b"f".to_vec(), expect)],
        "writing across a superblock copy",
    );
}

/// statfs asked again and again while the checksum and extent trees grow (the global
/// reserve it subtracts is kept while the root tree stays the same) equals statfs of the
/// same commit opened afresh, after every commit.
#[test]
fn statfs_follows_the_trees_across_commits() {
    if !oleo_testkit::require_root("statfs_follows_the_trees_across_commits") {
        return;
    }
    // Small nodes: the trees outgrow the reserve's floor within a few thousand writes.
    let s = Scratch::new("statfs", 512, &["--nodesize", "4096"]);
    for round in 0..4u64 {
        let fs = Filesystem::open_rw(s.image(), OpenOptions::default()).unwrap();
        let root = fs.root();
        let name = format!("f{round}");
        let id = fs
            .mknod(root, name.as_bytes(), &NewInode::file(0o644))
            .unwrap()
            .id;
        let before = fs.statfs().unwrap();
        // 4 KiB pieces: an extent item and a checksum item each.
        for i in 0..3000u64 {
            fs.write(id, i * 8192, &pattern(round * 10_000 + i, 4096))
                .unwrap();
            if i % 500 == 0 {
                let _ = fs.statfs().unwrap();
            }
        }
        fs.sync().unwrap();
        let after = fs.statfs().unwrap();
        assert_ne!(
            before, after,
            "round {round}: the writes changed nothing statfs shows"
        );
        drop(fs);
        let fresh = Filesystem::open(s.image(), OpenOptions::default()).unwrap();
        assert_eq!(
            after,
            fresh.statfs().unwrap(),
            "round {round}: statfs of the session and of the same commit opened afresh"
        );
    }
    assert_btrfs_check(&s.image(), "after the rounds");
}

/// Seed 001's ENOSPC rule: empty files made from many threads (their directory index and
/// inode items queued, `delayed_inode`) until the metadata runs out. Every create that
/// returned success is there after the commit, through oleo and the kernel, and the
/// directory lists exactly those names.
#[test]
fn empty_files_from_many_threads_until_full() {
    if !oleo_testkit::require_root("empty_files_from_many_threads_until_full") {
        return;
    }
    init_log();
    let s = Scratch::new("threads", 128, &["--nodesize", "4096", "-m", "single"]);
    let fs = Filesystem::open_rw(s.image(), OpenOptions::default()).unwrap();
    let root = fs.root();
    // Data takes half the device first, so that the metadata fills sooner.
    let ballast = fs
        .mknod(root, b"ballast", &NewInode::file(0o644))
        .unwrap()
        .id;
    for i in 0..56u64 {
        fs.write(ballast, i << 20, &pattern(i, 1 << 20)).unwrap();
    }
    fs.sync().unwrap();
    let made: Vec<Vec<Vec<u8>>> = std::thread::scope(|sc| {
        let handles: Vec<_> = (0..8)
            .map(|t| {
                let fs = &fs;
                sc.spawn(move || {
                    let mut mine = Vec::new();
                    for i in 0u64.. {
                        let name = format!("t{t}-{i:07}").into_bytes();
                        match fs.mknod(root, &name, &NewInode::file(0o644)) {
                            Ok(_) => mine.push(name),
                            Err(e) => {
                                assert!(is_enospc(&e), "thread {t}: expected ENOSPC, got {e}");
                                assert!(
                                    fs.lookup(root, &name).is_err(),
                                    "a failed create left its name"
                                );
                                return mine;
                            }
                        }
                        assert!(i < 2_000_000, "never filled up");
                    }
                    unreachable!()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut files: Vec<(Vec<u8>, Vec<u8>)> = made
        .into_iter()
        .flatten()
        .map(|n| (n, Vec::new()))
        .collect();
    files.sort();
    eprintln!("threads: {} empty files before ENOSPC", files.len());
    assert!(files.len() > 5_000, "filled up too early");
    // The queued items of the last creates fit in what they reserved.
    fs.sync().unwrap();
    let mut listed = Vec::new();
    fs.readdir(root, 0, &mut |e| {
        listed.push(e.name);
        true
    })
    .unwrap();
    listed.sort();
    listed.retain(|n| n != b"ballast");
    let names: Vec<Vec<u8>> = files.iter().map(|(n, _)| n.clone()).collect();
    if listed != names {
        let set: std::collections::BTreeSet<&Vec<u8>> = listed.iter().collect();
        let missing: Vec<&Vec<u8>> = names.iter().filter(|n| !set.contains(n)).collect();
        let first = missing.first().map(|n| {
            (
                String::from_utf8_lossy(n).into_owned(),
                fs.lookup(root, n).is_ok(),
            )
        });
        eprintln!(
            "missing {} from {:?} to {:?}",
            missing.len(),
            first,
            missing
                .last()
                .map(|n| String::from_utf8_lossy(n).into_owned())
        );
        panic!(
            "the listing ({} names) differs from the creates that succeeded ({}), first at {first:?}",
            listed.len(),
            names.len()
        );
    }
    drop(fs);
    verify(
        &s.image(),
        &s.0.join("mnt"),
        &files,
        "filling with empty files",
    );
}

/// Growing a file whose last sector is partial (or inline) rewrites that sector: a
/// truncate up, an extending write and a write into an inline file need data space like
/// any write. With data full they fail with ENOSPC and change nothing; they never abort
/// the transaction (dbench's SET_FILE_INFORMATION did, turning the mount read-only).
#[test]
fn growing_a_partial_last_sector_with_data_full() {
    if !oleo_testkit::require_root("growing_a_partial_last_sector_with_data_full") {
        return;
    }
    init_log();
    let s = Scratch::new("grow", 256, &[]);
    let fs = Filesystem::open_rw(s.image(), OpenOptions::default()).unwrap();
    let root = fs.root();
    let new = |name: &[u8], data: &[u8]| {
        let id = fs.mknod(root, name, &NewInode::file(0o644)).unwrap().id;
        fs.write(id, 0, data).unwrap();
        id
    };
    let regular = new(b"regular", &pattern(1, 5000));
    let inline = new(b"inline", &pattern(2, 100));
    let writer = new(b"inline-write", &pattern(3, 100));
    fs.sync().unwrap();
    // Fill data: big pieces, then sector by sector, committing so nothing stays pinned.
    let ballast = fs
        .mknod(root, b"ballast", &NewInode::file(0o644))
        .unwrap()
        .id;
    let mut size = 0u64;
    for piece in [1u64 << 20, 4096] {
        loop {
            match fs.write(ballast, size, &pattern(4, piece as usize)) {
                Ok(_) => size += piece,
                Err(e) if is_enospc(&e) => break,
                Err(e) => panic!("ballast: {e}"),
            }
            assert!(size < 1 << 30, "never filled up");
        }
        fs.sync().unwrap();
    }
    let grow = |id: InodeId, to: u64| {
        fs.setattr(
            id,
            &SetAttr {
                size: Some(to),
                ..SetAttr::default()
            },
        )
    };
    let mut expect = vec![
        (b"regular".to_vec(), pattern(1, 5000)),
        (b"inline".to_vec(), pattern(2, 100)),
        (b"inline-write".to_vec(), pattern(3, 100)),
    ];
    let mut results = Vec::new();
    for (i, (id, to)) in [(regular, 1u64 << 20), (inline, 8192)]
        .into_iter()
        .enumerate()
    {
        match grow(id, to) {
            Ok(_) => expect[i].1.resize(to as usize, 0),
            Err(e) => assert!(is_enospc(&e), "truncate up: expected ENOSPC, got {e}"),
        }
        results.push(fs.getattr(id).unwrap().size);
    }
    match fs.write(writer, 3000, &pattern(5, 3000)) {
        Ok(_) => {
            expect[2].1.resize(3000, 0);
            expect[2].1.extend(pattern(5, 3000));
        }
        Err(e) => assert!(is_enospc(&e), "write into inline: expected ENOSPC, got {e}"),
    }
    eprintln!(
        "grow: ballast {} KiB, sizes after growing {results:?}",
        size >> 10
    );
    // The transaction goes on: a metadata-only change and a commit still work.
    fs.mkdir(root, b"still-writable", &NewInode::dir(0o755))
        .unwrap();
    fs.sync().expect("commit after ENOSPC");
    for (name, data) in &expect {
        let id = fs.lookup(root, name).unwrap();
        assert_eq!(fs.getattr(id).unwrap().size, data.len() as u64);
    }
    drop(fs);
    verify(
        &s.image(),
        &s.0.join("mnt"),
        &expect,
        "growing at full data",
    );
}

/// A file overwritten again and again within one transaction: its earlier extents, written
/// in that same transaction, are freed by a commit (their references cancel out), so a
/// caller short of space (FUSE's ENOSPC guard, a reservation) must see a commit would help.
/// Then three times the free space goes through a 200 MiB file.
#[test]
fn overwriting_in_a_loop_reuses_space_within_a_transaction() {
    if !oleo_testkit::require_root("overwriting_in_a_loop") {
        return;
    }
    init_log();
    let s = Scratch::new("loop", 512, &[]);
    let fs = Filesystem::open_rw(s.image(), OpenOptions::default()).unwrap();
    let id = fs
        .mknod(fs.root(), b"loop", &NewInode::file(0o644))
        .unwrap()
        .id;
    let chunk = 1 << 20;
    let size = 200u64 << 20;
    let write_pass = |pass: u64| {
        let mut at = 0;
        while at < size {
            fs.write(id, at, &pattern(pass * 1000 + at / chunk as u64, chunk))
                .unwrap_or_else(|e| panic!("pass {pass} at {at}: {e}"));
            at += chunk as u64;
        }
    };
    write_pass(0);
    write_pass(1);
    let before = fs.data_available().unwrap();
    assert!(
        fs.reclaim_data_space().unwrap(),
        "the first pass's extents are freed by a commit"
    );
    let after = fs.data_available().unwrap();
    assert!(
        after >= before + (180 << 20),
        "a commit gave back {} bytes",
        after.saturating_sub(before)
    );
    assert!(
        !fs.reclaim_data_space().unwrap(),
        "nothing left to give back"
    );
    for pass in 2..5 {
        write_pass(pass);
    }
    fs.sync().unwrap();
    drop(fs);
    let expect: Vec<u8> = (0..size / chunk as u64)
        .flat_map(|i| pattern(4000 + i, chunk))
        .collect();
    verify(
        &s.image(),
        &s.0.join("mnt"),
        &[(b"loop".to_vec(), expect)],
        "overwritten in a loop",
    );
}
