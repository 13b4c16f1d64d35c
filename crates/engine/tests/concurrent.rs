//! Many threads through one `&Filesystem`: seeded random operations (create, write,
//! truncate, rename, unlink, mkdir, reads) by N threads at once, each on its own directory
//! and on a directory they all share (names carry the thread, so each thread's model is
//! exact whatever the interleaving), with commits forced at random moments by a thread of
//! their own and by the workers. Then every thread's files must read back as its model
//! says, through oleo, then `btrfs check --readonly --check-data-csum`, then a kernel mount
//! (same tree and bytes), a kernel write, and oleo again.
//!
//! Needs root and btrfs-progs (SKIP without; a failure under CI=true). `OLEO_TEST_SEED`
//! replays a seed's operation sequences (the interleaving is the scheduler's).

use oleo::{FileKind, Filesystem, InodeId, NewInode, OpenOptions, SetAttr};
use oleo_testkit::ops::Rng;
use oleo_testkit::{assert_btrfs_check, empty_image, require_root, KernelMount, TempDir};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// A thread's view: path under the root ("t3/f7", "shared/t3-f2") -> content.
type Files = BTreeMap<String, Vec<u8>>;

fn bytes(rng: &mut Rng, len: usize) -> Vec<u8> {
    let fill = rng.next() as u8;
    (0..len).map(|i| fill.wrapping_add((i / 7) as u8)).collect()
}

fn lookup_path(fs: &Filesystem, path: &str) -> InodeId {
    fs.resolve_path(fs.root(), path.as_bytes())
        .unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn split(path: &str) -> (&str, &str) {
    path.rsplit_once('/').expect("a path with a directory")
}

/// One worker: `ops` random operations; returns its model.
fn worker(fs: &Filesystem, t: usize, seed: u64, ops: usize) -> Files {
    let mut rng = Rng::new(seed ^ (t as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let own = format!("t{t}");
    let root = fs.root();
    let dir = fs
        .mkdir(root, own.as_bytes(), &NewInode::dir(0o755))
        .unwrap()
        .id;
    let shared = lookup_path(fs, "shared");
    let mut files = Files::new();
    let mut next = 0u64;
    for step in 0..ops {
        let names: Vec<String> = files.keys().cloned().collect();
        let pick = |rng: &mut Rng| names[rng.below(names.len() as u64) as usize].clone();
        let what = rng.below(100);
        let ctx = |op: &str| format!("thread {t} step {step} ({op}), seed {seed}");
        match what {
            // Create, in its own directory or the shared one.
            0..=14 => {
                next += 1;
                let (parent, path) = if rng.chance(30) {
                    (shared, format!("shared/t{t}-f{next}"))
                } else {
                    (dir, format!("{own}/f{next}"))
                };
                let name = split(&path).1.to_string();
                fs.mknod(parent, name.as_bytes(), &NewInode::file(0o644))
                    .unwrap_or_else(|e| panic!("{}: {e}", ctx("create")));
                files.insert(path, Vec::new());
            }
            // Write somewhere in a file (often past its end, leaving a hole).
            15..=54 if !names.is_empty() => {
                let path = pick(&mut rng);
                let id = lookup_path(fs, &path);
                let big = rng.chance(5);
                let len = if big {
                    (1 << 20) + rng.below(1 << 19) as usize
                } else {
                    1 + rng.below(96 << 10) as usize
                };
                let off = rng.below(512 << 10) as usize;
                let data = bytes(&mut rng, len);
                fs.write(id, off as u64, &data)
                    .unwrap_or_else(|e| panic!("{}: {e}", ctx("write")));
                let f = files.get_mut(&path).unwrap();
                if f.len() < off + len {
                    f.resize(off + len, 0);
                }
                f[off..off + len].copy_from_slice(&data);
            }
            // Truncate.
            55..=61 if !names.is_empty() => {
                let path = pick(&mut rng);
                let id = lookup_path(fs, &path);
                let size = rng.below(600 << 10);
                let set = SetAttr {
                    size: Some(size),
                    ..SetAttr::default()
                };
                fs.setattr(id, &set)
                    .unwrap_or_else(|e| panic!("{}: {e}", ctx("truncate")));
                files.get_mut(&path).unwrap().resize(size as usize, 0);
            }
            // Rename within its directory, sometimes over another of its files.
            62..=71 if !names.is_empty() => {
                let from = pick(&mut rng);
                let (d, name) = split(&from);
                let to = if rng.chance(40) {
                    pick(&mut rng)
                } else {
                    next += 1;
                    if d == "shared" {
                        format!("shared/t{t}-f{next}")
                    } else {
                        format!("{own}/f{next}")
                    }
                };
                // Across the two directories too.
                let (td, tname) = split(&to);
                let parent = |d: &str| if d == "shared" { shared } else { dir };
                fs.rename(
                    parent(d),
                    name.as_bytes(),
                    parent(td),
                    tname.as_bytes(),
                    Default::default(),
                )
                .unwrap_or_else(|e| panic!("{} {from} -> {to}: {e}", ctx("rename")));
                if from != to {
                    let content = files.remove(&from).unwrap();
                    files.insert(to, content);
                }
            }
            // Unlink.
            72..=79 if !names.is_empty() => {
                let path = pick(&mut rng);
                let (d, name) = split(&path);
                let parent = if d == "shared" { shared } else { dir };
                fs.unlink(parent, name.as_bytes())
                    .unwrap_or_else(|e| panic!("{}: {e}", ctx("unlink")));
                files.remove(&path);
            }
            // Read a file back while the others write and commit.
            80..=93 if !names.is_empty() => {
                let path = pick(&mut rng);
                let id = lookup_path(fs, &path);
                let want = &files[&path];
                let off = rng.below(want.len() as u64 + 1);
                let got = fs.read(id, off, 128 << 10).unwrap();
                let end = (off as usize + (128 << 10)).min(want.len());
                assert!(
                    got == want[off as usize..end],
                    "{}: {path} at {off} reads other bytes",
                    ctx("read")
                );
            }
            // Make everything durable (a thread's fsync).
            94..=96 => {
                fs.sync().unwrap_or_else(|e| panic!("{}: {e}", ctx("sync")));
            }
            _ => {}
        }
    }
    files
}

/// Every thread's files, as oleo shows them, against the models.
fn compare_oleo(fs: &Filesystem, models: &[Files], threads: usize) {
    let mut want = Files::new();
    for m in models {
        want.extend(m.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
    let mut got = Files::new();
    let mut dirs = vec!["shared".to_string()];
    dirs.extend((0..threads).map(|t| format!("t{t}")));
    for d in dirs {
        let id = lookup_path(fs, &d);
        let mut entries = Vec::new();
        fs.readdir(id, 0, &mut |e| {
            entries.push(e);
            true
        })
        .unwrap();
        for e in entries {
            assert_eq!(e.kind, FileKind::File);
            let size = fs.getattr(e.id).unwrap().size;
            let mut data = Vec::new();
            while (data.len() as u64) < size {
                let chunk = fs.read(e.id, data.len() as u64, 1 << 20).unwrap();
                assert!(!chunk.is_empty());
                data.extend_from_slice(&chunk);
            }
            got.insert(format!("{d}/{}", String::from_utf8_lossy(&e.name)), data);
        }
    }
    compare(&want, &got, "oleo");
}

fn compare(want: &Files, got: &Files, who: &str) {
    let w: Vec<_> = want.keys().collect();
    let g: Vec<_> = got.keys().collect();
    assert_eq!(w, g, "{who} lists other files than the threads made");
    for (path, data) in want {
        assert!(
            got[path] == *data,
            "{who}: {path} holds other bytes ({} vs {} long)",
            got[path].len(),
            data.len()
        );
    }
}

/// What the kernel shows of the same tree.
fn kernel_files(root: &std::path::Path) -> Files {
    let mut out = Files::new();
    for d in std::fs::read_dir(root).unwrap() {
        let d = d.unwrap();
        let dname = d.file_name().into_string().unwrap();
        if dname == "kernel" {
            continue;
        }
        for f in std::fs::read_dir(d.path()).unwrap() {
            let f = f.unwrap();
            let name = f.file_name().into_string().unwrap();
            out.insert(format!("{dname}/{name}"), std::fs::read(f.path()).unwrap());
        }
    }
    out
}

/// `small_cache`: no forced commits, and a cache so small that the dirty limit commits
/// (those commits are written by the thread that went over the limit, outside the lock).
fn run(threads: usize, ops: usize, small_cache: bool) {
    let name = format!(
        "concurrent-{threads}{}",
        if small_cache { "-small" } else { "" }
    );
    if !require_root(&name) {
        return;
    }
    let seed = oleo_testkit::seed(1);
    eprintln!("{name}: seed {seed} (OLEO_TEST_SEED={seed} replays the operations)");
    let dir = TempDir::new(&name).unwrap();
    let image = dir.join("image");
    empty_image(&image, 3072, &[]).unwrap();
    let options = OpenOptions {
        cache_bytes: if small_cache { 1 << 20 } else { 256 << 20 },
        ..OpenOptions::default()
    };
    let fs = Arc::new(Filesystem::open_rw(&image, options).unwrap());
    fs.mkdir(fs.root(), b"shared", &NewInode::dir(0o777))
        .unwrap();
    let first_generation = fs.superblock().generation;
    // Commits at random moments, while the workers run.
    let stop = Arc::new(AtomicBool::new(false));
    let committer = {
        let (fs, stop) = (Arc::clone(&fs), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut rng = Rng::new(seed);
            let mut commits = 0;
            while !small_cache && !stop.load(Ordering::Relaxed) {
                std::thread::sleep(std::time::Duration::from_micros(rng.below(20_000)));
                fs.sync().expect("a forced commit");
                commits += 1;
            }
            commits
        })
    };
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let fs = Arc::clone(&fs);
            std::thread::spawn(move || worker(&fs, t, seed, ops))
        })
        .collect();
    let models: Vec<Files> = workers
        .into_iter()
        .map(|w| w.join().expect("a worker panicked"))
        .collect();
    stop.store(true, Ordering::Relaxed);
    let commits = committer.join().unwrap();
    eprintln!("{name}: {commits} forced commits");
    if small_cache {
        let commits = fs.superblock().generation - first_generation;
        eprintln!("{name}: {commits} commits at the dirty limit");
        assert!(commits > 0, "the dirty limit never committed");
    }
    compare_oleo(&fs, &models, threads);
    let fs = Arc::into_inner(fs).expect("no other handle");
    fs.close().unwrap();
    assert_btrfs_check(&image, &format!("{threads} threads"));

    // Reopened: the same.
    let fs = Filesystem::open(&image, OpenOptions::default()).unwrap();
    compare_oleo(&fs, &models, threads);
    drop(fs);

    // The kernel agrees, then writes, and oleo reads what it wrote and writes on.
    let mut want = Files::new();
    for m in &models {
        want.extend(m.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
    let mnt = dir.subdir("mnt").unwrap();
    let k = KernelMount::mount(&image, &mnt, &["rw"]).unwrap();
    compare(&want, &kernel_files(k.path()), "the kernel");
    std::fs::create_dir(k.path().join("kernel")).unwrap();
    std::fs::write(k.path().join("kernel/k"), b"written by the kernel").unwrap();
    k.unmount().unwrap();
    let fs = Filesystem::open_rw(&image, OpenOptions::default()).unwrap();
    let kf = lookup_path(&fs, "kernel/k");
    assert_eq!(fs.read(kf, 0, 100).unwrap(), b"written by the kernel");
    fs.write(kf, 21, b", then by oleo").unwrap();
    fs.close().unwrap();
    assert_btrfs_check(&image, "oleo after the kernel");
}

#[test]
fn two_threads() {
    run(2, 600, false);
}

#[test]
fn eight_threads() {
    run(8, 250, false);
}

#[test]
fn thirty_two_threads() {
    run(32, 80, false);
}

#[test]
fn eight_threads_at_the_dirty_limit() {
    run(8, 250, true);
}

/// Pins and unpins (a FUSE lookup's reference, an open file's) come from other threads
/// without the filesystem's lock, racing the unlinks of the names they hold: a file
/// unlinked while pinned lives on as an orphan until its last pin goes, then
/// `delete_if_unlinked` deletes it; a file never unlinked is never deleted, however its
/// pins come and go. Afterwards no inode of an unlinked name is left, none of a kept one
/// is missing, and `btrfs check` finds the orphans all gone.
#[test]
fn pins_without_the_lock_race_unlinks() {
    let name = "concurrent_pins";
    if !require_root(name) {
        return;
    }
    let dir = TempDir::new(name).unwrap();
    let image = dir.join("pins.img");
    empty_image(&image, 256, &[]).unwrap();
    let fs = Arc::new(Filesystem::open_rw(&image, OpenOptions::default()).unwrap());
    let root = fs.root();
    let d = fs.mkdir(root, b"d", &NewInode::dir(0o755)).unwrap().id;
    const FILES: usize = 400;
    let ids: Vec<InodeId> = (0..FILES)
        .map(|i| {
            let id = fs
                .mknod(d, format!("f{i}").as_bytes(), &NewInode::file(0o644))
                .unwrap()
                .id;
            fs.write(id, 0, format!("file {i}").as_bytes()).unwrap();
            id
        })
        .collect();
    let ids = Arc::new(ids);
    // Pinners hold pins on two files in three (as FUSE's lookup references and open files
    // do), then drop them while the unlinks run; a last drop deletes what has no names
    // left (as FORGET and RELEASE do).
    let ready = Arc::new(std::sync::Barrier::new(4));
    let pinners: Vec<_> = (0..3)
        .map(|p| {
            let (fs, ids, ready) = (Arc::clone(&fs), Arc::clone(&ids), Arc::clone(&ready));
            std::thread::spawn(move || {
                let mine: Vec<InodeId> = (0..FILES)
                    .filter(|i| (i + p) % 3 != 0)
                    .map(|i| ids[i])
                    .collect();
                for &id in &mine {
                    fs.pin_open(id);
                }
                ready.wait();
                for (n, &id) in mine.iter().enumerate() {
                    if fs.drop_pin(id) {
                        fs.delete_if_unlinked(id).unwrap();
                    }
                    if n % 16 == 0 {
                        std::thread::yield_now();
                    }
                }
            })
        })
        .collect();
    ready.wait();
    // Meanwhile the even names go (with a commit now and then), the odd ones stay.
    for i in (0..FILES).step_by(2) {
        fs.unlink(d, format!("f{i}").as_bytes()).unwrap();
        if i % 64 == 0 {
            fs.sync().unwrap();
        }
    }
    for p in pinners {
        p.join().expect("a pinner panicked");
    }
    for (i, &id) in ids.iter().enumerate() {
        let attr = fs.getattr(id);
        if i % 2 == 0 {
            assert!(
                attr.is_err(),
                "f{i} was unlinked and unpinned but lives: {attr:?}"
            );
        } else {
            let a = attr.unwrap_or_else(|e| panic!("f{i} kept its name but is gone: {e}"));
            assert_eq!(a.nlink, 1, "f{i}");
            assert_eq!(fs.read(id, 0, 64).unwrap(), format!("file {i}").as_bytes());
        }
    }
    let fs = Arc::into_inner(fs).expect("no other handle");
    fs.close().unwrap();
    assert_btrfs_check(&image, name);
    let fs = Filesystem::open(&image, OpenOptions::default()).unwrap();
    for (i, &id) in ids.iter().enumerate() {
        assert_eq!(fs.getattr(id).is_ok(), i % 2 == 1, "f{i} after reopening");
    }
}
