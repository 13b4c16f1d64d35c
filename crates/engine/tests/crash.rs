//! The crash simulator. The device records every write and flush while a seeded workload
//! of POSIX operations runs, with commits (fsync) at random points. Crash states are then
//! rebuilt from the base image: a prefix of the recorded stream, where the writes issued
//! after the prefix's last flush may each be lost (a volatile cache drops or reorders
//! them). Every crash state must pass `btrfs check --readonly`, open with oleo and show
//! exactly the state of a commit: the last one whose final flush is in the prefix, or the
//! one in flight (its superblock may have landed). Nothing fsynced is lost. Some states
//! are also mounted by the kernel and compared.
//!
//! Needs root and btrfs-progs (prints `SKIP: ...` without them; fails under CI=true).
//! `OLEO_TEST_SEED` replays a seed; `OLEO_CRASH_POINTS` sets crash points per workload.

mod common;

use common::crash::{crash_image, sparse_copy};
use oleo::device::IoEvent;
use oleo::{FileKind, Filesystem, InodeId, OpenOptions, RenameFlags, SetAttr, XattrSet};
use oleo_testkit::ops::Rng;
use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// One seed: replayed with OLEO_TEST_SEED, fixed under CI, fresh otherwise (testkit).
fn seed(test: &str) -> u64 {
    oleo_testkit::ops::seeds(test, 1)[0]
}

struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("oleo-crash-{name}-{}", std::process::id()));
        let _ = Command::new("umount").arg(dir.join("mnt")).output();
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("mnt")).unwrap();
        Scratch(dir)
    }
    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.0.join("mnt")).output();
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// What a committed state looks like: path -> (kind, mode, size, content, xattrs).
type State = BTreeMap<Vec<u8>, (String, u32, u64, Vec<u8>, Vec<(Vec<u8>, Vec<u8>)>)>;

fn state_of(fs: &Filesystem) -> State {
    let mut out = State::new();
    let mut stack = vec![(fs.root(), Vec::new())];
    while let Some((dir, path)) = stack.pop() {
        let mut entries = Vec::new();
        fs.readdir(dir, 2, &mut |e| {
            entries.push(e.clone());
            true
        })
        .unwrap();
        for e in entries {
            let p = if path.is_empty() {
                e.name.clone()
            } else {
                [&path[..], b"/", &e.name].concat()
            };
            let a = fs.getattr(e.id).unwrap();
            let content = match a.kind {
                FileKind::File if a.size > 0 => fs.read(e.id, 0, a.size as u32).unwrap(),
                FileKind::Symlink => fs.readlink(e.id).unwrap(),
                _ => Vec::new(),
            };
            let mut xattrs: Vec<_> = fs
                .listxattr(e.id)
                .unwrap()
                .into_iter()
                .map(|n| {
                    let v = fs.getxattr(e.id, &n).unwrap();
                    (n, v)
                })
                .collect();
            xattrs.sort();
            let size = if a.kind == FileKind::Dir { 0 } else { a.size };
            out.insert(
                p.clone(),
                (format!("{:?}", a.kind), a.mode, size, content, xattrs),
            );
            if a.kind == FileKind::Dir {
                stack.push((e.id, p));
            }
        }
    }
    out
}

fn kernel_state(root: &Path) -> State {
    use std::os::unix::ffi::OsStrExt;
    let mut out = State::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        for e in std::fs::read_dir(root.join(&rel)).unwrap() {
            let e = e.unwrap();
            let r = rel.join(e.file_name());
            let p = root.join(&r);
            let m = std::fs::symlink_metadata(&p).unwrap();
            let kind = if m.is_dir() {
                "Dir"
            } else if m.file_type().is_symlink() {
                "Symlink"
            } else if m.is_file() {
                "File"
            } else {
                "Other"
            };
            let content = match kind {
                "File" => std::fs::read(&p).unwrap(),
                "Symlink" => std::fs::read_link(&p)
                    .unwrap()
                    .as_os_str()
                    .as_bytes()
                    .to_vec(),
                _ => Vec::new(),
            };
            let size = if m.is_dir() { 0 } else { m.size() };
            out.insert(
                r.as_os_str().as_bytes().to_vec(),
                (kind.to_string(), m.mode(), size, content, Vec::new()),
            );
            if m.is_dir() {
                stack.push(r);
            }
        }
    }
    out
}

fn resolve(fs: &Filesystem, rel: &[u8]) -> Option<InodeId> {
    let mut id = fs.root();
    for c in rel.split(|&b| b == b'/').filter(|c| !c.is_empty()) {
        id = fs.lookup(id, c).ok()?;
    }
    Some(id)
}

/// One random operation; failures (a name taken, a missing file) are part of the game.
fn random_op(rng: &mut Rng, fs: &mut Filesystem, names: &mut Vec<Vec<u8>>) {
    let root = fs.root();
    let pick = |rng: &mut Rng, names: &Vec<Vec<u8>>| -> Option<Vec<u8>> {
        (!names.is_empty()).then(|| names[rng.below(names.len() as u64) as usize].clone())
    };
    match rng.below(10) {
        0 | 1 => {
            let dir = if rng.below(3) == 0 {
                b"d".to_vec()
            } else {
                Vec::new()
            };
            let d = resolve(fs, &dir).unwrap_or(root);
            let name = format!("f{}", rng.below(40)).into_bytes();
            if fs.mknod(d, &name, &oleo::NewInode::file(0o644)).is_ok() {
                names.push(if dir.is_empty() {
                    name
                } else {
                    [&dir[..], b"/", &name].concat()
                });
            }
        }
        2..=5 => {
            if let Some(n) = pick(rng, names) {
                if let Some(id) = resolve(fs, &n) {
                    let len = match rng.below(3) {
                        0 => 1 + rng.below(1500),
                        1 => 1 + rng.below(40_000),
                        _ => 1 + rng.below(600_000),
                    };
                    let off = rng.below(300_000);
                    let fill = rng.below(255) as u8;
                    let data: Vec<u8> = (0..len)
                        .map(|i| fill.wrapping_add((i % 251) as u8))
                        .collect();
                    let _ = fs.write(id, off, &data);
                }
            }
        }
        6 => {
            if let Some(n) = pick(rng, names) {
                let (dir, name) = match n.iter().rposition(|&b| b == b'/') {
                    Some(i) => (n[..i].to_vec(), n[i + 1..].to_vec()),
                    None => (Vec::new(), n.clone()),
                };
                let d = resolve(fs, &dir).unwrap_or(root);
                if fs.unlink(d, &name).is_ok() {
                    names.retain(|x| *x != n);
                }
            }
        }
        7 => {
            if let Some(n) = pick(rng, names) {
                if let Some(id) = resolve(fs, &n) {
                    let _ = fs.setattr(
                        id,
                        &SetAttr {
                            size: Some(rng.below(200_000)),
                            ..Default::default()
                        },
                    );
                }
            }
        }
        8 => {
            if let Some(n) = pick(rng, names) {
                let to = format!("r{}", rng.below(40)).into_bytes();
                let (dir, name) = match n.iter().rposition(|&b| b == b'/') {
                    Some(i) => (n[..i].to_vec(), n[i + 1..].to_vec()),
                    None => (Vec::new(), n.clone()),
                };
                let d = resolve(fs, &dir).unwrap_or(root);
                if fs
                    .rename(d, &name, root, &to, RenameFlags::default())
                    .is_ok()
                {
                    names.retain(|x| *x != n && *x != to);
                    names.push(to);
                }
            }
        }
        _ => {
            if let Some(n) = pick(rng, names) {
                if let Some(id) = resolve(fs, &n) {
                    let v = vec![b'x'; rng.below(300) as usize];
                    let _ = fs.setxattr(
                        id,
                        format!("user.k{}", rng.below(3)).as_bytes(),
                        &v,
                        XattrSet::Either,
                    );
                }
            }
        }
    }
}

fn run_workload(name: &str, mkfs_args: &[&str], ops: usize) {
    if !oleo_testkit::require_root(name) {
        return;
    }
    let seed = seed(name);
    let mut rng = Rng::new(seed);
    let scratch = Scratch::new(name);
    let base = scratch.path("base.img");
    let work = scratch.path("work.img");
    std::fs::File::create(&base)
        .unwrap()
        .set_len(256 << 20)
        .unwrap();
    let out = Command::new("mkfs.btrfs")
        .arg("-q")
        .arg("-f")
        .args(mkfs_args)
        .arg(&base)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "mkfs.btrfs: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    sparse_copy(&base, &work);

    let fs = Filesystem::open_rw(&work, OpenOptions::default()).unwrap();
    let d = fs.root();
    fs.mkdir(d, b"d", &oleo::NewInode::dir(0o755)).unwrap();
    fs.sync().unwrap();
    // Record from the first commit on: states by generation.
    let base_gen = fs.superblock().generation;
    drop(fs);
    sparse_copy(&work, &base);
    let mut fs = Filesystem::open_rw(&work, OpenOptions::default()).unwrap();
    let mut states: BTreeMap<u64, Option<State>> = BTreeMap::new();
    states.insert(base_gen, Some(state_of(&fs)));
    fs.start_io_recording();
    let mut names = Vec::new();
    // Where each commit's final flush sits in the event stream: (event count, generation).
    let mut durable: Vec<(usize, u64)> = vec![(0, base_gen)];
    let mut events = Vec::new();
    let mut last_gen = base_gen;
    for i in 0..ops {
        random_op(&mut rng, &mut fs, &mut names);
        if rng.below(8) == 0 || i + 1 == ops {
            fs.sync().unwrap();
        }
        // Commits happen on sync and inside operations (to make room, to bound memory).
        let generation = fs.superblock().generation;
        if generation != last_gen {
            let start = events.len();
            events.extend(fs.take_io_recording());
            // Every commit ends with two flushes: after the blocks, after the superblocks.
            let flushes: Vec<usize> = (start..events.len())
                .filter(|&j| events[j] == IoEvent::Flush)
                .collect();
            let commits = generation - last_gen;
            assert_eq!(flushes.len() as u64, commits * 2, "two flushes per commit");
            for c in 0..commits {
                durable.push((flushes[(2 * c + 1) as usize] + 1, last_gen + c + 1));
                states.insert(last_gen + c + 1, None);
            }
            // The committed state as the disk now has it (a copy: oleo refuses a reader
            // beside the writer).
            let view_img = scratch.path("view.img");
            sparse_copy(&work, &view_img);
            let view = Filesystem::open(&view_img, OpenOptions::default()).unwrap();
            assert_eq!(view.superblock().generation, generation);
            states.insert(generation, Some(state_of(&view)));
            last_gen = generation;
        }
    }
    let recorded = events.len();
    events.extend(fs.take_io_recording());
    assert_eq!(recorded, events.len());
    drop(fs);
    let flushes = events.iter().filter(|e| **e == IoEvent::Flush).count();
    let last = states.values().next_back().unwrap().as_ref().unwrap();
    let bytes: u64 = last.values().map(|v| v.2).sum();
    eprintln!(
        "{name}: {} events ({flushes} flushes), {} commits; final state {} paths, {bytes} bytes",
        events.len(),
        durable.len() - 1,
        last.len()
    );
    assert!(bytes > 0, "the workload wrote nothing");

    let points: usize = std::env::var("OLEO_CRASH_POINTS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(40);
    // Crash points: around every flush (just before, just after) and random ones.
    let mut cuts: Vec<usize> = Vec::new();
    for (i, e) in events.iter().enumerate() {
        if *e == IoEvent::Flush {
            cuts.push(i);
            cuts.push(i + 1);
        }
    }
    for _ in 0..points {
        cuts.push(rng.below(events.len() as u64 + 1) as usize);
    }
    cuts.sort();
    cuts.dedup();
    if cuts.len() > points * 2 {
        let step = cuts.len() as f64 / (points * 2) as f64;
        cuts = (0..points * 2)
            .map(|i| cuts[(i as f64 * step) as usize])
            .collect();
        cuts.dedup();
    }
    let crash = scratch.path("crash.img");
    let mut checked = 0;
    let mut with_kernel = 0;
    for (k, &n) in cuts.iter().enumerate() {
        let dropped = crash_image(&base, &crash, &events, n, &mut rng);
        // The newest commit whose final flush is in the prefix must be there (or the next).
        let floor = durable
            .iter()
            .filter(|(at, _)| *at <= n)
            .map(|(_, g)| *g)
            .max()
            .unwrap();
        if let Err(text) = oleo_testkit::btrfs_check(&crash, false) {
            panic!("{name} seed {seed}: crash after {n} of {} events ({dropped} late writes lost): btrfs check:\n{text}", events.len());
        }
        let fs = Filesystem::open(&crash, OpenOptions::default())
            .unwrap_or_else(|e| panic!("{name} seed {seed}: crash at {n}: oleo cannot open: {e}"));
        let generation = fs.superblock().generation;
        let next = durable.iter().map(|(_, g)| *g).filter(|g| *g > floor).min();
        assert!(
            generation == floor || Some(generation) == next,
            "{name} seed {seed}: crash at {n}: generation {generation}, expected {floor} (or {next:?})"
        );
        // A commit made inside an operation that also made another has no recorded state.
        let Some(want) = states.get(&generation).and_then(|s| s.as_ref()) else {
            checked += 1;
            continue;
        };
        let got = state_of(&fs);
        assert!(
            got == *want,
            "{name} seed {seed}: crash at {n}: state differs from commit {generation}"
        );
        drop(fs);
        if k % 8 == 0 {
            let mnt = scratch.path("mnt");
            let st = Command::new("mount")
                .args(["-o", "loop,ro"])
                .arg(&crash)
                .arg(&mnt)
                .status()
                .unwrap();
            assert!(
                st.success(),
                "{name} seed {seed}: crash at {n}: the kernel cannot mount it"
            );
            let seen = kernel_state(&mnt);
            Command::new("umount").arg(&mnt).status().unwrap();
            let strip = |s: &State| -> BTreeMap<Vec<u8>, (String, u64, Vec<u8>)> {
                s.iter()
                    .map(|(p, v)| (p.clone(), (v.0.clone(), v.2, v.3.clone())))
                    .collect()
            };
            assert!(
                strip(&seen) == strip(want),
                "{name} seed {seed}: crash at {n}: the kernel shows another state"
            );
            with_kernel += 1;
        }
        checked += 1;
    }
    eprintln!("{name} seed {seed}: {checked} crash states checked (btrfs check + oleo), {with_kernel} also mounted by the kernel");
    assert!(checked >= points.min(cuts.len()));
}

#[test]
fn crash_states_default_features() {
    run_workload("default", &[], 300);
}

#[test]
fn crash_states_small_nodes_no_holes_off() {
    run_workload("4k-holes", &["--nodesize", "4096", "-O", "^no-holes"], 300);
}

#[test]
fn crash_states_sha256() {
    run_workload("sha256", &["--csum", "sha256"], 200);
}

/// Generation of a superblock image (its `generation` field).
fn sb_generation(data: &[u8]) -> Option<u64> {
    (data.len() >= 0x50).then(|| u64::from_le_bytes(data[0x48..0x50].try_into().unwrap()))
}

/// Commits racing with writers: four threads create files of one write each (so a commit
/// holds a file empty or whole), delete older ones (so freed space is soon wanted again)
/// and sync now and then, while another thread forces commits;
/// a commit's writing overlaps the next transaction's operations. Every crash state must
/// pass `btrfs check`, show a generation between the newest durable one and the newest
/// whose superblock was written, hold every file synced before the crash, and hold no file
/// partly.
#[test]
fn crash_states_with_commits_racing_writers() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    let name = "racing";
    if !oleo_testkit::require_root(name) {
        return;
    }
    let seed = seed(name);
    let scratch = Scratch::new(name);
    let base = scratch.path("base.img");
    let work = scratch.path("work.img");
    oleo_testkit::empty_image(&base, 512, &[]).unwrap();
    sparse_copy(&base, &work);
    let fs = Arc::new(Filesystem::open_rw(&work, OpenOptions::default()).unwrap());
    let (w0, f0) = fs.io_counts();
    fs.start_io_recording();
    let at = {
        let fs = Arc::clone(&fs);
        move || {
            let (w, f) = fs.io_counts();
            (w + f - w0 - f0) as usize
        }
    };
    // Every file made: name -> (content, event count when a sync covering it returned,
    // unlinked since).
    type Made = BTreeMap<String, (Vec<u8>, Option<usize>, bool)>;
    let made: Arc<Mutex<Made>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let committer = {
        let (fs, stop) = (Arc::clone(&fs), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut rng = Rng::new(seed);
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(std::time::Duration::from_micros(rng.below(3000)));
                fs.sync().unwrap();
            }
        })
    };
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let (fs, made, at) = (Arc::clone(&fs), Arc::clone(&made), at.clone());
            std::thread::spawn(move || {
                let mut rng = Rng::new(seed.wrapping_add(t + 1));
                let mut mine: Vec<String> = Vec::new();
                let mut older: Vec<String> = Vec::new();
                for i in 0..80 {
                    // Deleting frees space the allocator will want back soon.
                    if !older.is_empty() && rng.below(2) == 0 {
                        let victim = older.swap_remove(rng.below(older.len() as u64) as usize);
                        fs.unlink(fs.root(), victim.as_bytes()).unwrap();
                        made.lock().unwrap().get_mut(&victim).unwrap().2 = true;
                    }
                    let name = format!("t{t}-{i}");
                    let len = 1 + rng.below(1 << 20) as usize;
                    let fill = rng.next() as u8;
                    let data: Vec<u8> = (0..len).map(|j| fill.wrapping_add(j as u8)).collect();
                    let id = fs
                        .mknod(fs.root(), name.as_bytes(), &oleo::NewInode::file(0o644))
                        .unwrap()
                        .id;
                    fs.write(id, 0, &data).unwrap();
                    made.lock()
                        .unwrap()
                        .insert(name.clone(), (data, None, false));
                    mine.push(name.clone());
                    older.push(name);
                    if rng.below(6) == 0 {
                        fs.sync().unwrap();
                        let mark = at();
                        for n in &mine {
                            if let Some(e) = made.lock().unwrap().get_mut(n) {
                                e.1.get_or_insert(mark);
                            }
                        }
                        mine.clear();
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    committer.join().unwrap();
    fs.sync().unwrap();
    let events = fs.take_io_recording();
    drop(at);
    drop(Arc::into_inner(fs).unwrap());
    let made = Arc::into_inner(made).unwrap().into_inner().unwrap();

    // Where superblocks were written and flushed.
    let primary = 64 * 1024;
    let supers: Vec<(usize, u64)> = events
        .iter()
        .enumerate()
        .filter_map(|(i, e)| match e {
            IoEvent::Write { offset, data } if *offset == primary => {
                sb_generation(data).map(|g| (i, g))
            }
            _ => None,
        })
        .collect();
    assert!(
        supers.len() > 5,
        "too few commits recorded: {}",
        supers.len()
    );
    for w in supers.windows(2) {
        assert!(w[0].1 < w[1].1, "superblocks out of generation order");
    }
    let mut rng = Rng::new(seed ^ 0x5eed);
    let mut cuts: Vec<usize> = (0..40)
        .map(|_| rng.below(events.len() as u64 + 1) as usize)
        .collect();
    cuts.extend(supers.iter().flat_map(|&(i, _)| [i, i + 1, i + 2]));
    cuts.retain(|&c| c <= events.len());
    cuts.sort();
    cuts.dedup();
    let step = (cuts.len() / 60).max(1);
    let crash = scratch.path("crash.img");
    let mut checked = 0;
    for &n in cuts.iter().step_by(step) {
        let dropped = crash_image(&base, &crash, &events, n, &mut rng);
        let last_flush = events[..n].iter().rposition(|e| *e == IoEvent::Flush);
        let floor = supers
            .iter()
            .filter(|&&(i, _)| last_flush.is_some_and(|f| i < f))
            .map(|&(_, g)| g)
            .max();
        let ceiling = supers
            .iter()
            .filter(|&&(i, _)| i < n)
            .map(|&(_, g)| g)
            .max();
        let what = format!(
            "seed {seed}: crash after {n} of {} events ({dropped} late writes lost)",
            events.len()
        );
        if let Err(text) = oleo_testkit::btrfs_check(&crash, false) {
            panic!("{what}: btrfs check:\n{text}");
        }
        let fs = Filesystem::open(&crash, OpenOptions::default())
            .unwrap_or_else(|e| panic!("{what}: oleo cannot open: {e}"));
        let generation = fs.superblock().generation;
        if let (Some(lo), Some(hi)) = (floor, ceiling) {
            assert!(
                (lo..=hi).contains(&generation),
                "{what}: generation {generation}, expected {lo}..={hi}"
            );
        }
        for (name, (data, synced, deleted)) in &made {
            match fs.lookup(fs.root(), name.as_bytes()) {
                Ok(id) => {
                    let size = fs.getattr(id).unwrap().size;
                    if size != 0 {
                        let got = fs
                            .read(id, 0, data.len() as u32 + 1)
                            .unwrap_or_else(|e| panic!("{what}: {name}: {e}"));
                        assert!(got == *data, "{what}: {name} holds other bytes");
                    }
                    assert!(
                        size == 0 || size == data.len() as u64,
                        "{what}: {name} is {size} bytes of {}",
                        data.len()
                    );
                    if synced.is_some_and(|m| m <= n) {
                        assert_eq!(size, data.len() as u64, "{what}: {name} was synced");
                    }
                }
                Err(_) => assert!(
                    *deleted || !synced.is_some_and(|m| m <= n),
                    "{what}: {name} was synced before the crash and is gone"
                ),
            }
        }
        checked += 1;
    }
    eprintln!(
        "{name} seed {seed}: {} events, {} commits, {} files; {checked} crash states checked",
        events.len(),
        supers.len(),
        made.len()
    );
}
