//! Random operations and crash states on multi-device sets (issue 31): a RAID1 set (two
//! images of 512 MiB, `-d raid1 -m raid1`) and a RAID10 set (four images of 256 MiB,
//! `-d raid10 -m raid10`), both made by mkfs.btrfs and written by oleo alone.
//!
//! Random operations (`random_ops_*`): a seeded sequence of a few thousand POSIX operations
//! (`oleo_testkit::ops::random_op`: create, mknod, mkdir/rmdir, symlink, link, unlink,
//! rename with flags, writes at offsets, truncate, fallocate with punch hole and zero
//! range, chmod/chown/utimens, xattrs), with fsyncs, commits, reopens of the set from
//! another member, and a large file now and then so that oleo allocates chunks of its own,
//! is applied through the library and to a reference directory on the host alike; every
//! operation must give the same result or errno. After closing: the new chunks (as
//! btrfs-progs dumps the chunk tree) have the set's profile on distinct devices;
//! `btrfs check --readonly --check-data-csum` over the set is clean; the kernel mounts the
//! set and shows the reference's tree (kinds, modes, owners, sizes, link counts, rdev,
//! contents, symlink targets, user xattrs, hard-link groups, explicit mtimes); oleo reopens
//! it and shows the same. Then members are left out: the kernel mounts the set
//! `degraded,ro` and oleo opens it degraded, and both still show the reference (for RAID1
//! each member left out in turn: either copy is complete; for RAID10 one member).
//!
//! Crash states (`crash_states_*`): a seeded workload (creates, writes, truncates, punched
//! holes, fallocate, xattrs, renames over other files, links, unlinks, mkdir/rmdir, fsyncs
//! of files and directories, commits) runs after a ballast file has nearly filled the data
//! chunks, and half way (unless it happened already) a file larger than their free
//! space, so that a chunk allocation happens while the IO of every device is recorded
//! (`Filesystem::take_io_recording_devices`: one stream in issue order, each write a
//! physical offset on its device, each flush that device's alone). A crash state at a cut
//! of the merged stream gives each device its base image plus its writes before the cut,
//! where each write issued after THAT device's last flush before the cut may be lost
//! (seeded). Cuts are chosen right after superblock writes (so that one device has the new
//! superblock and another not), around flushes and at random. Each crash state must:
//! - have, on every device, a durable superblock at least as new as every commit that
//!   returned before the cut (a commit flushes every device before it returns);
//! - pass `btrfs check --readonly --check-data-csum` over the whole set;
//! - open with oleo read-only without log replay at generation G, the newest generation of
//!   any device's superblock (what the kernel and oleo take; a commit writes the
//!   superblocks only after flushing every device, so G's trees are whole on all of them),
//!   and show exactly the state committed as G (for a commit made inside an operation,
//!   whose state was never seen whole, only the generation is checked);
//! - open with oleo read-only with the log replayed in memory and show every file fsynced
//!   before the crash (and not changed after) with its fsynced content, user xattrs and
//!   names (all of them, and no other);
//! - every fifth state, on copies of the images: mount by the kernel `ro,rescue=nologreplay`
//!   and show exactly G's state; mount read-write (the kernel replays the log) and show
//!   every fsynced file as fsynced, and the same tree as oleo's in-memory replay (unless
//!   the devices at the newest generation name different log trees: a tie oleo and the
//!   kernel may break differently).
//!
//! `data_writes_survive_signals`: O_DIRECT data writes to a RAID1 set while the writing
//! thread is signalled must all succeed (an engine bug `random_ops_raid1` ran into: the
//! test says what it is).
//!
//! Needs root, loop devices, kernel btrfs and btrfs-progs: prints `SKIP: ...` without
//! them (a failure under CI=true). Images go under `OLEO_TEST_TMP` (else the temp dir),
//! the reference directory under the temp dir (it must support FALLOC_FL_ZERO_RANGE: not
//! tmpfs). Seeds: each test prints its seed, fixed under CI=true, fresh otherwise;
//! `OLEO_TEST_SEED=N` replays one, e.g.
//! `OLEO_TEST_SEED=N cargo test -p oleo --test multi_device_crash crash_states_raid10`;
//! `OLEO_TEST_SEEDS=N` runs N fresh ones.
//! `OLEO_MD_CRASH_POINTS` sets the crash states per workload (default 40);
//! `OLEO_TEST_TRACE=1` prints every random operation, `RUST_LOG=oleo=warn` the engine's log.

mod common;

use common::crash::sparse_copy;
use oleo::device::IoEvent;
use oleo::{
    FallocMode, FileKind, Filesystem, InodeId, NewInode, OpenOptions, RenameFlags, SetAttr,
    Timespec, XattrSet,
};
use oleo_testkit::multi_device::{self as md, BG_DATA, BG_RAID1, BG_RAID10};
use oleo_testkit::ops::{
    apply_path, compare_trees, content_hash, data_for, follows, random_op, seeds, shapes, split,
    walk, Op, Rng, Shape,
};
use oleo_testkit::{require_root, TempDir};
use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::Instant;

const MIB: u64 = 1 << 20;

/// A set of images to make with mkfs.btrfs.
struct SetSpec {
    label: &'static str,
    ndevs: usize,
    size_mb: u64,
    /// The profile of data and metadata, as mkfs spells it.
    profile: &'static str,
    /// Its block group flag.
    bg: u64,
    /// Stripes of one chunk of that profile on this set.
    stripes: usize,
}

const RAID1: SetSpec = SetSpec {
    label: "raid1",
    ndevs: 2,
    size_mb: 512,
    profile: "raid1",
    bg: BG_RAID1,
    stripes: 2,
};

const RAID10: SetSpec = SetSpec {
    label: "raid10",
    ndevs: 4,
    size_mb: 256,
    profile: "raid10",
    bg: BG_RAID10,
    stripes: 4,
};

/// Opens the set with `images[first]` as the path and the others as `devices`.
fn open_set(
    images: &[PathBuf],
    first: usize,
    rw: bool,
    log_replay: bool,
    degraded: bool,
) -> oleo::Result<Filesystem> {
    let mut v = images.to_vec();
    v.rotate_left(first % images.len());
    let opts = OpenOptions {
        devices: v[1..].to_vec(),
        log_replay,
        degraded,
        ..OpenOptions::default()
    };
    if rw {
        Filesystem::open_rw(&v[0], opts)
    } else {
        Filesystem::open(&v[0], opts)
    }
}

fn show(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The whole content of file `id` (`size` bytes), read 1 MiB at a time.
fn read_all(fs: &Filesystem, id: InodeId, size: u64) -> oleo::Result<Vec<u8>> {
    let mut out = Vec::with_capacity(size as usize);
    while (out.len() as u64) < size {
        let n = (size - out.len() as u64).min(MIB) as u32;
        let d = fs.read(id, out.len() as u64, n)?;
        if d.is_empty() {
            break;
        }
        out.extend_from_slice(&d);
    }
    Ok(out)
}

fn user_xattrs(fs: &Filesystem, id: InodeId) -> BTreeMap<Vec<u8>, Vec<u8>> {
    fs.listxattr(id)
        .unwrap()
        .into_iter()
        .filter(|n| n.starts_with(b"user."))
        .map(|n| {
            let v = fs.getxattr(id, &n).unwrap();
            (n, v)
        })
        .collect()
}

/// Every entry below the root (without `.` and `..`): (path, entry), directories first
/// visited depth first.
fn oleo_entries(fs: &Filesystem) -> Vec<(Vec<u8>, oleo::DirEntry)> {
    let mut out = Vec::new();
    let mut stack = vec![(fs.root(), Vec::new())];
    while let Some((dir, path)) = stack.pop() {
        let mut entries = Vec::new();
        fs.readdir(dir, 0, &mut |e| {
            if e.name != b"." && e.name != b".." {
                entries.push(e);
            }
            true
        })
        .unwrap_or_else(|e| panic!("readdir {}: {e}", show(&path)));
        for e in entries {
            let p = if path.is_empty() {
                e.name.clone()
            } else {
                [&path[..], b"/", &e.name].concat()
            };
            if e.kind == FileKind::Dir {
                stack.push((e.id, p.clone()));
            }
            out.push((p, e));
        }
    }
    out
}

// ---- part 1: random operations against a reference directory ----------------------------

fn resolve(fs: &Filesystem, rel: &[u8]) -> Result<InodeId, i32> {
    let mut id = fs.root();
    for comp in rel.split(|&b| b == b'/').filter(|c| !c.is_empty()) {
        id = fs.lookup(id, comp).map_err(|e| e.errno())?;
    }
    Ok(id)
}

/// What the VFS refuses before a filesystem sees the call (as in posix_ops.rs).
fn vfs_refuses(fs: &Filesystem, op: &Op) -> Result<(), i32> {
    if let Some(path) = follows(op) {
        if let Ok(id) = resolve(fs, path) {
            if fs.getattr(id).is_ok_and(|a| a.kind == FileKind::Symlink) {
                return Err(libc::ELOOP);
            }
        }
    }
    match op {
        Op::SetXattr { path, .. } | Op::RemoveXattr { path, .. } => {
            let id = resolve(fs, path)?;
            let kind = fs.getattr(id).map_err(|e| e.errno())?.kind;
            if !matches!(kind, FileKind::File | FileKind::Dir) {
                return Err(libc::EPERM);
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

/// One operation through the library, by path (as in posix_ops.rs).
fn apply_oleo(fs: &Filesystem, op: &Op) -> Result<(), i32> {
    vfs_refuses(fs, op)?;
    let e = |e: oleo::Error| e.errno();
    match op {
        Op::Mknod { path, mode, rdev } => {
            let (dir, name) = split(path);
            let d = resolve(fs, dir)?;
            fs.mknod(d, name, &NewInode::with_mode(*mode).rdev(*rdev))
                .map(|_| ())
                .map_err(e)
        }
        Op::Mkdir { path, mode } => {
            let (dir, name) = split(path);
            let d = resolve(fs, dir)?;
            fs.mkdir(d, name, &NewInode::dir(*mode))
                .map(|_| ())
                .map_err(e)
        }
        Op::Symlink { path, target } => {
            let (dir, name) = split(path);
            let d = resolve(fs, dir)?;
            fs.symlink(d, name, target, 0, 0).map(|_| ()).map_err(e)
        }
        Op::Link { from, to } => {
            let src = resolve(fs, from)?;
            let (dir, name) = split(to);
            let d = resolve(fs, dir)?;
            fs.link(src, d, name).map(|_| ()).map_err(e)
        }
        Op::Unlink { path } => {
            let (dir, name) = split(path);
            let d = resolve(fs, dir)?;
            fs.unlink(d, name).map_err(e)
        }
        Op::Rmdir { path } => {
            let (dir, name) = split(path);
            let d = resolve(fs, dir)?;
            fs.rmdir(d, name).map_err(e)
        }
        Op::Rename { from, to, flags } => {
            let (sd, sn) = split(from);
            let (dd, dn) = split(to);
            let s = resolve(fs, sd)?;
            let d = resolve(fs, dd)?;
            fs.lookup(s, sn).map_err(e)?;
            let dst_exists = fs.lookup(d, dn).is_ok();
            if flags & libc::RENAME_NOREPLACE != 0 && dst_exists {
                return Err(libc::EEXIST);
            }
            if flags & libc::RENAME_EXCHANGE != 0 && !dst_exists {
                return Err(libc::ENOENT);
            }
            if to.starts_with(from) && to.get(from.len()) == Some(&b'/') {
                return Err(libc::EINVAL);
            }
            if from.starts_with(to) && from.get(to.len()) == Some(&b'/') {
                return Err(if flags & libc::RENAME_EXCHANGE != 0 {
                    libc::EINVAL
                } else {
                    libc::ENOTEMPTY
                });
            }
            let flags = RenameFlags {
                noreplace: flags & libc::RENAME_NOREPLACE != 0,
                exchange: flags & libc::RENAME_EXCHANGE != 0,
                whiteout: None,
            };
            fs.rename(s, sn, d, dn, flags).map_err(e)
        }
        Op::Write {
            path,
            offset,
            len,
            fill,
        } => {
            let id = resolve(fs, path)?;
            let a = fs.getattr(id).map_err(e)?;
            if a.kind != FileKind::File {
                return Err(if a.kind == FileKind::Dir {
                    libc::EISDIR
                } else {
                    libc::EINVAL
                });
            }
            fs.write(id, *offset, &data_for(*offset, *len, *fill))
                .map(|_| ())
                .map_err(e)
        }
        Op::Truncate { path, size } => {
            let id = resolve(fs, path)?;
            fs.setattr(
                id,
                &SetAttr {
                    size: Some(*size),
                    ..Default::default()
                },
            )
            .map(|_| ())
            .map_err(e)
        }
        Op::Fallocate {
            path,
            mode,
            offset,
            len,
        } => {
            let id = resolve(fs, path)?;
            let keep = mode & libc::FALLOC_FL_KEEP_SIZE != 0;
            let m = if mode & libc::FALLOC_FL_PUNCH_HOLE != 0 {
                FallocMode::PunchHole
            } else if mode & libc::FALLOC_FL_ZERO_RANGE != 0 {
                FallocMode::ZeroRange { keep_size: keep }
            } else {
                FallocMode::Allocate { keep_size: keep }
            };
            fs.fallocate(id, *offset, *len, m).map_err(e)
        }
        Op::Chmod { path, mode } => {
            let id = resolve(fs, path)?;
            fs.setattr(
                id,
                &SetAttr {
                    mode: Some(*mode),
                    ..Default::default()
                },
            )
            .map(|_| ())
            .map_err(e)
        }
        Op::Chown { path, uid, gid } => {
            let id = resolve(fs, path)?;
            fs.setattr(
                id,
                &SetAttr {
                    uid: Some(*uid),
                    gid: Some(*gid),
                    ..Default::default()
                },
            )
            .map(|_| ())
            .map_err(e)
        }
        Op::Utimens { path, sec } => {
            let id = resolve(fs, path)?;
            let set = SetAttr {
                atime: Some(Timespec { sec: *sec, nsec: 5 }),
                mtime: Some(Timespec {
                    sec: *sec + 1,
                    nsec: 7,
                }),
                ..Default::default()
            };
            fs.setattr(id, &set).map(|_| ()).map_err(e)
        }
        Op::SetXattr {
            path,
            name,
            value,
            flags,
        } => {
            let id = resolve(fs, path)?;
            let how = match *flags {
                libc::XATTR_CREATE => XattrSet::Create,
                libc::XATTR_REPLACE => XattrSet::Replace,
                _ => XattrSet::Either,
            };
            fs.setxattr(id, name, value, how).map_err(e)
        }
        Op::RemoveXattr { path, name } => {
            let id = resolve(fs, path)?;
            fs.removexattr(id, name).map_err(e)
        }
    }
}

/// The tree as oleo shows it, in the terms of `ops::shapes` (so that it compares with the
/// reference's), and its hard-link groups.
fn oleo_shapes(fs: &Filesystem) -> (BTreeMap<Vec<u8>, Shape>, LinkGroups) {
    let mut out = BTreeMap::new();
    let mut by_ino: BTreeMap<u64, Vec<Vec<u8>>> = BTreeMap::new();
    // `shapes` has the root as "".
    let root = oleo::DirEntry {
        name: Vec::new(),
        id: fs.root(),
        kind: FileKind::Dir,
        next_offset: 0,
    };
    for (p, e) in std::iter::once((Vec::new(), root)).chain(oleo_entries(fs)) {
        let a = fs
            .getattr(e.id)
            .unwrap_or_else(|err| panic!("getattr {}: {err}", show(&p)));
        let is_dir = a.kind == FileKind::Dir;
        let content = (a.kind == FileKind::File).then(|| {
            let data =
                read_all(fs, e.id, a.size).unwrap_or_else(|err| panic!("read {}: {err}", show(&p)));
            content_hash(&data)
        });
        let target = (a.kind == FileKind::Symlink).then(|| fs.readlink(e.id).unwrap());
        let xattrs = user_xattrs(fs, e.id);
        out.insert(
            p.clone(),
            Shape {
                kind: a.mode & 0o170000,
                mode: a.mode,
                uid: a.uid,
                gid: a.gid,
                size: if is_dir { 0 } else { a.size },
                nlink: if is_dir { 1 } else { u64::from(a.nlink) },
                rdev: a.rdev,
                content,
                target,
                xattrs,
                mtime: (a.mtime.nsec == 7 && !is_dir)
                    .then_some((a.mtime.sec, i64::from(a.mtime.nsec))),
            },
        );
        if !is_dir {
            by_ino.entry(e.id.ino).or_default().push(p);
        }
    }
    (out, groups(by_ino.into_values()))
}

/// Sets of paths naming one inode.
type LinkGroups = Vec<Vec<Vec<u8>>>;

/// Hard-link groups in one canonical order.
fn groups(g: impl Iterator<Item = Vec<Vec<u8>>>) -> LinkGroups {
    let mut g: LinkGroups = g
        .filter(|v| v.len() > 1)
        .map(|mut v| {
            v.sort();
            v
        })
        .collect();
    g.sort();
    g
}

/// The reference's hard-link groups, in `groups`' order.
fn reference_groups(root: &Path) -> LinkGroups {
    let mut by_ino: BTreeMap<u64, Vec<Vec<u8>>> = BTreeMap::new();
    for rel in walk(root).1 {
        let m = std::fs::symlink_metadata(root.join(std::ffi::OsStr::from_bytes(&rel))).unwrap();
        by_ino.entry(m.ino()).or_default().push(rel);
    }
    groups(by_ino.into_values())
}

/// Fails naming every path where oleo's view differs from the reference.
fn compare_oleo(fs: &Filesystem, reference: &Path, what: &str) {
    let want = shapes(reference);
    let (got, got_groups) = oleo_shapes(fs);
    let mut diffs = Vec::new();
    for (p, s) in &want {
        match got.get(p) {
            None => diffs.push(format!("{}: missing on {what}", show(p))),
            Some(t) if t != s => diffs.push(format!(
                "{}: differs on {what}: reference {s:?}, found {t:?}",
                show(p)
            )),
            Some(_) => {}
        }
    }
    for p in got.keys().filter(|p| !want.contains_key(*p)) {
        diffs.push(format!("{}: extra on {what}", show(p)));
    }
    if reference_groups(reference) != got_groups {
        diffs.push(format!("hard-link groups differ on {what}"));
    }
    oleo_testkit::ops::assert_no_differences(&diffs, what);
}

/// The reference directory, in the host's temp dir as in posix_ops.rs (not under
/// `OLEO_TEST_TMP`, which may be a tmpfs: it has no FALLOC_FL_ZERO_RANGE).
struct RefDir(PathBuf);

impl RefDir {
    fn new(label: &str) -> RefDir {
        let dir =
            std::env::temp_dir().join(format!("oleo-mdops-ref-{label}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        RefDir(dir)
    }
}

impl Drop for RefDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Every path (files and directories) of the reference, for fsyncs.
fn any_path(rng: &mut Rng, reference: &Path) -> Vec<u8> {
    let (dirs, others) = walk(reference);
    let all: Vec<Vec<u8>> = dirs.into_iter().chain(others).collect();
    all[rng.below(all.len() as u64) as usize].clone()
}

/// The engine's log on stderr with `RUST_LOG` (e.g. `RUST_LOG=oleo=warn`).
fn init_log() {
    let _ = env_logger::builder().is_test(true).try_init();
}

fn random_ops(spec: &SetSpec, ops: usize) {
    init_log();
    let name = format!("multi_device_crash random ops {}", spec.label);
    if !require_root(&name) {
        return;
    }
    for seed in seeds(&name, 1) {
        let started = Instant::now();
        random_ops_seed(spec, ops, seed);
        eprintln!("{name} seed {seed}: done in {:?}", started.elapsed());
    }
}

fn random_ops_seed(spec: &SetSpec, ops: usize, seed: u64) {
    let what = format!("{} seed {seed}", spec.label);
    let tmp = TempDir::new(&format!("mdops-{}", spec.label)).unwrap();
    let images = md::mkfs_set(
        tmp.path(),
        spec.label,
        spec.ndevs,
        spec.size_mb * MIB,
        spec.profile,
        spec.profile,
    )
    .unwrap_or_else(|e| panic!("{what}: mkfs.btrfs: {e}"));
    for (i, img) in images.iter().enumerate() {
        assert_eq!(md::devid_of(img).unwrap(), i as u64 + 1);
    }
    let mkfs_chunks: BTreeSet<u64> = md::chunk_map_all(&images)
        .unwrap()
        .iter()
        .map(|c| c.logical)
        .collect();
    let reference = RefDir::new(&format!("{}-{seed}", spec.label));
    let reference = reference.0.as_path();
    let mnt = tmp.subdir("mnt").unwrap();
    let trace = std::env::var_os("OLEO_TEST_TRACE").is_some();
    // Not the same sequence on both sets when they run the same seed (as under CI).
    let mut rng = Rng::new(seed ^ (spec.ndevs as u64) << 40);
    let mut fs = open_set(&images, 0, true, true, false).expect("open the set read-write");
    let (mut agreed, mut refused, mut fsyncs, mut syncs, mut reopens) = (0, 0, 0, 0, 0);
    let mut bulk: Vec<Vec<u8>> = Vec::new();
    for i in 0..ops {
        // A large file every 60 operations (the oldest goes when there are 12), so that
        // the data outgrows the chunks mkfs made.
        let batch: Vec<Op> = if i % 60 == 30 {
            let p = format!("bulk{i}").into_bytes();
            let mut v = vec![
                Op::Mknod {
                    path: p.clone(),
                    mode: 0o100644,
                    rdev: 0,
                },
                Op::Write {
                    path: p.clone(),
                    offset: rng.below(4) * 65536,
                    len: 4 * MIB + rng.below(6 * MIB),
                    fill: rng.below(256) as u8,
                },
            ];
            bulk.push(p);
            if bulk.len() > 12 {
                v.push(Op::Unlink {
                    path: bulk.remove(0),
                });
            }
            v
        } else {
            vec![random_op(&mut rng, reference, false)]
        };
        for op in batch {
            let want = apply_path(reference, &op);
            if trace {
                eprintln!("op {i}: {op} -> {want:?}");
            }
            let got = apply_oleo(&fs, &op);
            if got == Err(libc::ENOSPC) && want.is_ok() {
                panic!(
                    "{what} op {i}: {op}: oleo ENOSPC, the reference {want:?}; statfs {:?}; \
                     chunks {:?}; devices {:?}",
                    fs.statfs(),
                    fs.chunk_usage(),
                    fs.devices()
                );
            }
            assert_eq!(
                got, want,
                "{what} op {i}: {op}: oleo {got:?} vs reference {want:?}"
            );
            if want.is_ok() {
                agreed += 1;
            } else {
                refused += 1;
            }
        }
        if rng.chance(5) {
            let p = any_path(&mut rng, reference);
            let id = resolve(&fs, &p).unwrap();
            if matches!(fs.getattr(id).unwrap().kind, FileKind::File | FileKind::Dir) {
                fs.fsync(id, rng.chance(30))
                    .unwrap_or_else(|e| panic!("{what} op {i}: fsync {}: {e}", show(&p)));
                fsyncs += 1;
            }
        }
        if rng.chance(3) {
            fs.sync()
                .unwrap_or_else(|e| panic!("{what} op {i}: sync: {e}"));
            syncs += 1;
        }
        if rng.chance(1) {
            fs.close()
                .unwrap_or_else(|e| panic!("{what} op {i}: close: {e}"));
            // From another member now and then: the superblock comes from any of them.
            let first = rng.below(images.len() as u64) as usize;
            fs = open_set(&images, first, true, true, false)
                .unwrap_or_else(|e| panic!("{what} op {i}: reopen from member {first}: {e}"));
            reopens += 1;
        }
    }
    let chunks = fs.chunk_usage().unwrap();
    let data_used: u64 = chunks
        .iter()
        .filter(|c| c.flags & BG_DATA != 0)
        .map(|c| c.used)
        .sum();
    compare_oleo(&fs, reference, &format!("{what}: oleo before closing"));
    fs.close().unwrap_or_else(|e| panic!("{what}: close: {e}"));
    let bytes: u64 = shapes(reference).values().map(|s| s.size).sum();
    eprintln!(
        "{what}: {agreed} operations done, {refused} refused alike, {fsyncs} fsyncs, {syncs} syncs, \
         {reopens} reopens; {} paths, {} MiB of file data in {} MiB of data extents; {} chunks",
        shapes(reference).len(),
        bytes / MIB,
        data_used / MIB,
        chunks.len()
    );

    // The chunks oleo allocated, as btrfs-progs reads the chunk tree.
    let progs_chunks = md::chunk_map_all(&images).unwrap();
    let new: Vec<&md::Chunk> = progs_chunks
        .iter()
        .filter(|c| !mkfs_chunks.contains(&c.logical))
        .collect();
    assert!(
        new.iter().any(|c| c.flags & BG_DATA != 0),
        "{what}: oleo allocated no data chunk (chunks: {progs_chunks:?})"
    );
    for c in &new {
        assert!(
            c.flags & spec.bg != 0,
            "{what}: new chunk {} is {}, not {}",
            c.logical,
            c.profile(),
            spec.profile
        );
        let devids: BTreeSet<u64> = c.stripes.iter().map(|s| s.0).collect();
        assert_eq!(
            (c.stripes.len(), devids.len()),
            (spec.stripes, spec.stripes),
            "{what}: new chunk {} has stripes {:?}",
            c.logical,
            c.stripes
        );
    }
    eprintln!(
        "{what}: {} chunks allocated by oleo ({} data)",
        new.len(),
        new.iter().filter(|c| c.flags & BG_DATA != 0).count()
    );

    let check = check_set(&images);
    assert!(
        check.clean,
        "{what}: btrfs check --check-data-csum:\n{}",
        check.output
    );

    let set = md::KernelSet::mount(&images, &[], &mnt, &["ro", "noatime"])
        .unwrap_or_else(|e| panic!("{what}: kernel mount: {e}"));
    let r = std::panic::catch_unwind(|| compare_trees(reference, set.root(), "kernel"));
    set.unmount().unwrap();
    if let Err(e) = r {
        std::panic::resume_unwind(e);
    }

    let first = 1 + rng.below(images.len() as u64 - 1) as usize;
    let fs = open_set(&images, first, false, true, false)
        .unwrap_or_else(|e| panic!("{what}: oleo reopens from member {first}: {e}"));
    compare_oleo(&fs, reference, &format!("{what}: oleo reopened"));
    // oleo reads the chunk tree as progs does.
    let oleo_chunks = fs.chunk_usage().unwrap();
    for c in &progs_chunks {
        assert!(
            oleo_chunks.iter().any(|o| o.logical == c.logical
                && o.length == c.length
                && o.flags == c.flags
                && o.stripes == c.stripes),
            "{what}: progs' chunk {c:?} is not oleo's ({oleo_chunks:?})"
        );
    }
    drop(fs);

    // Members left out: the kernel degraded and read-only, oleo degraded.
    let left_out: Vec<usize> = if spec.bg == BG_RAID1 {
        (0..images.len()).collect()
    } else {
        vec![rng.below(images.len() as u64) as usize]
    };
    for out in left_out {
        let present: Vec<bool> = (0..images.len()).map(|i| i != out).collect();
        let label = format!("{what}, devid {} left out", out + 1);
        let set = md::KernelSet::mount(&images, &present, &mnt, &["ro", "degraded", "noatime"])
            .unwrap_or_else(|e| panic!("{label}: kernel degraded mount: {e}"));
        assert_eq!(set.missing_devids().unwrap(), vec![out as u64 + 1]);
        let r = std::panic::catch_unwind(|| {
            compare_trees(reference, set.root(), &format!("kernel degraded ({label})"))
        });
        set.unmount().unwrap();
        if let Err(e) = r {
            std::panic::resume_unwind(e);
        }
        let rest: Vec<PathBuf> = images
            .iter()
            .enumerate()
            .filter(|&(i, _)| i != out)
            .map(|(_, p)| p.clone())
            .collect();
        let fs = open_set(&rest, 0, false, true, true)
            .unwrap_or_else(|e| panic!("{label}: oleo degraded open: {e}"));
        compare_oleo(&fs, reference, &format!("oleo degraded ({label})"));
    }
}

#[test]
fn random_ops_raid1() {
    random_ops(&RAID1, 3000);
}

#[test]
fn random_ops_raid10() {
    random_ops(&RAID10, 3000);
}

/// Found by `random_ops_raid1` (seed 700370903, op 330: "device 2: write error at physical
/// 114200576: io_uring completion missing", the write failing with EIO): a signal that
/// interrupts the wait for an O_DIRECT data write's completion must not fail the write.
/// io_uring_enter(2) returns the number of requests it submitted even when the wait for
/// completions that followed was cut short (a signal, a freeze), with the request still in
/// flight; `device_uring::transfer` takes an empty completion queue after
/// `submit_and_wait(1)` for an error instead of waiting again. Here a no-op SIGUSR1 is
/// sent to the writing thread every 20 µs while it writes 64 MiB in 1 MiB pieces (each
/// big and aligned enough for the O_DIRECT path) to a RAID1 set; every write must succeed
/// and the file must read back as written after a reopen.
#[test]
fn data_writes_survive_signals() {
    use std::sync::atomic::{AtomicBool, Ordering};
    if !require_root("multi_device_crash data writes under signals") {
        return;
    }
    init_log();
    extern "C" fn nothing(_: libc::c_int) {}
    // SAFETY: installs a handler that does nothing; only this test's thread is signalled.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = nothing as extern "C" fn(libc::c_int) as usize;
        sa.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut sa.sa_mask);
        assert_eq!(libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut()), 0);
    }
    let tmp = TempDir::new("mdsig").unwrap();
    let images = md::mkfs_set(tmp.path(), "sig", 2, 512 * MIB, "raid1", "raid1").unwrap();
    let fs = open_set(&images, 0, true, true, false).unwrap();
    let id = fs
        .mknod(fs.root(), b"f", &NewInode::file(0o644))
        .unwrap()
        .id;
    // SAFETY: pthread_self has no preconditions.
    let me = unsafe { libc::pthread_self() };
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let signaller = {
        let stop = std::sync::Arc::clone(&stop);
        std::thread::spawn(move || {
            let mut sent = 0u64;
            while !stop.load(Ordering::Relaxed) {
                // SAFETY: `me` is the test thread, alive until it joins this one.
                unsafe { libc::pthread_kill(me, libc::SIGUSR1) };
                sent += 1;
                std::thread::sleep(std::time::Duration::from_micros(20));
            }
            sent
        })
    };
    let mut failed = Vec::new();
    for i in 0..64u64 {
        let off = i * MIB;
        if let Err(e) = fs.write(id, off, &data_for(off, MIB, 0xc5)) {
            failed.push(format!("write at {off}: {e}"));
        }
    }
    let synced = fs.sync();
    stop.store(true, Ordering::Relaxed);
    let sent = signaller.join().unwrap();
    eprintln!("{sent} signals sent during the writes");
    assert!(
        failed.is_empty() && synced.is_ok(),
        "{} of 64 writes failed under signals (first: {:?}); sync: {synced:?}",
        failed.len(),
        failed.first()
    );
    fs.close().unwrap();
    let fs = open_set(&images, 1, false, true, false).unwrap();
    let id = resolve(&fs, b"f").unwrap();
    let got = read_all(&fs, id, 64 * MIB).unwrap();
    for i in 0..64u64 {
        let off = i * MIB;
        assert!(
            got[off as usize..(off + MIB) as usize] == data_for(off, MIB, 0xc5)[..],
            "the MiB at {off} reads back wrong"
        );
    }
}

// ---- part 2: crash states -----------------------------------------------------------------

/// One path of a committed state: everything the inode item and the items of the inode
/// say, as oleo and the kernel both show them (atime aside).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Node {
    ino: u64,
    mode: u32,
    uid: u32,
    gid: u32,
    nlink: u64,
    size: u64,
    mtime: (i64, u32),
    ctime: (i64, u32),
    /// A file's (length, xxhash64) of its content.
    data: Option<(u64, u64)>,
    target: Option<Vec<u8>>,
    xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
}

type State = BTreeMap<Vec<u8>, Node>;

/// Files whose content is checked apart (a big file no operation touches).
const BALLAST: &[u8] = b"ballast";

fn oleo_state(fs: &Filesystem) -> State {
    let mut out = State::new();
    for (p, e) in oleo_entries(fs) {
        let a = fs
            .getattr(e.id)
            .unwrap_or_else(|err| panic!("getattr {}: {err}", show(&p)));
        let data = (a.kind == FileKind::File && p != BALLAST).then(|| {
            let d =
                read_all(fs, e.id, a.size).unwrap_or_else(|err| panic!("read {}: {err}", show(&p)));
            (d.len() as u64, common::hash(&d))
        });
        let target = (a.kind == FileKind::Symlink).then(|| fs.readlink(e.id).unwrap());
        out.insert(
            p,
            Node {
                ino: e.id.ino,
                mode: a.mode,
                uid: a.uid,
                gid: a.gid,
                nlink: u64::from(a.nlink),
                size: a.size,
                mtime: (a.mtime.sec, a.mtime.nsec),
                ctime: (a.ctime.sec, a.ctime.nsec),
                data,
                target,
                xattrs: user_xattrs(fs, e.id),
            },
        );
    }
    out
}

fn kernel_state(root: &Path) -> State {
    let mut out = State::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        for e in std::fs::read_dir(root.join(&rel)).unwrap() {
            let r = rel.join(e.unwrap().file_name());
            let p = root.join(&r);
            let m = std::fs::symlink_metadata(&p).unwrap();
            let key = r.as_os_str().as_bytes().to_vec();
            let data = (m.is_file() && key != BALLAST).then(|| {
                let d = std::fs::read(&p).unwrap();
                (d.len() as u64, common::hash(&d))
            });
            let target = m.file_type().is_symlink().then(|| {
                std::fs::read_link(&p)
                    .unwrap()
                    .as_os_str()
                    .as_bytes()
                    .to_vec()
            });
            out.insert(
                key,
                Node {
                    ino: m.ino(),
                    mode: m.mode(),
                    uid: m.uid(),
                    gid: m.gid(),
                    nlink: m.nlink(),
                    size: m.size(),
                    mtime: (m.mtime(), m.mtime_nsec() as u32),
                    ctime: (m.ctime(), m.ctime_nsec() as u32),
                    data,
                    target,
                    xattrs: oleo_testkit::ops::xattrs_of(&p),
                },
            );
            if m.is_dir() {
                stack.push(r);
            }
        }
    }
    out
}

/// Every difference between two states (the first 30), with `relaxed` only what a replay
/// must agree on (no times, no directory sizes).
fn state_diffs(want: &State, got: &State, relaxed: bool) -> Vec<String> {
    let mut diffs = Vec::new();
    for (p, w) in want {
        match got.get(p) {
            None => diffs.push(format!("{}: missing", show(p))),
            Some(g) => {
                let (mut w, mut g) = (w.clone(), g.clone());
                if relaxed {
                    for n in [&mut w, &mut g] {
                        n.mtime = (0, 0);
                        n.ctime = (0, 0);
                        if n.mode & 0o170000 == 0o040000 {
                            n.size = 0;
                        }
                    }
                }
                if w != g {
                    diffs.push(format!("{}: want {w:?}\n   found {g:?}", show(p)));
                }
            }
        }
    }
    for p in got.keys().filter(|p| !want.contains_key(*p)) {
        diffs.push(format!("{}: extra {:?}", show(p), got[p]));
    }
    diffs.truncate(30);
    diffs
}

/// What an fsync made durable of one file.
#[derive(Clone, Debug, PartialEq)]
struct Durable {
    /// (length, xxhash64) of the content.
    data: (u64, u64),
    xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
    names: BTreeSet<Vec<u8>>,
}

/// One file of the workload.
#[derive(Default)]
struct Tracked {
    names: BTreeSet<Vec<u8>>,
    /// (operation, events recorded before it began) of every change.
    changes: Vec<(usize, usize)>,
    /// (operation, events recorded when it returned, what it made durable) of every fsync.
    fsyncs: Vec<(usize, usize, Durable)>,
}

/// The directories every workload starts with.
const DIRS: [&[u8]; 3] = [b"", b"a", b"b"];

fn join(dir: &[u8], name: &[u8]) -> Vec<u8> {
    oleo_testkit::ops::join(dir, name)
}

struct Workload {
    fs: Filesystem,
    rng: Rng,
    files: BTreeMap<u64, Tracked>,
    dir_paths: Vec<Vec<u8>>,
    /// The merged recording: (devid, event).
    events: Vec<(u64, IoEvent)>,
    op: usize,
    fsyncs: usize,
    syncs: usize,
    /// The state committed as each generation (None: a commit inside an operation, whose
    /// state was never seen whole).
    states: BTreeMap<u64, Option<State>>,
    /// (events recorded when the operation returned, generation) of every commit.
    committed: Vec<(usize, u64)>,
}

impl Workload {
    fn take(&mut self) {
        self.events.extend(self.fs.take_io_recording_devices());
    }

    fn dir(&self, d: &[u8]) -> InodeId {
        resolve(&self.fs, d).unwrap_or_else(|e| panic!("directory {}: errno {e}", show(d)))
    }

    fn id(&self, ino: u64) -> InodeId {
        InodeId {
            subvol: self.fs.root().subvol,
            ino,
        }
    }

    fn changed(&mut self, ino: u64) {
        let at = (self.op, self.events.len());
        self.files.entry(ino).or_default().changes.push(at);
    }

    fn named(&self, p: &[u8]) -> Option<u64> {
        self.files
            .iter()
            .find(|(_, t)| t.names.contains(p))
            .map(|(&i, _)| i)
    }

    fn durable(&self, ino: u64) -> Durable {
        let id = self.id(ino);
        let a = self.fs.getattr(id).unwrap();
        let content = read_all(&self.fs, id, a.size).unwrap();
        Durable {
            data: (content.len() as u64, common::hash(&content)),
            xattrs: user_xattrs(&self.fs, id),
            names: self.files[&ino].names.clone(),
        }
    }

    fn random_file(&mut self) -> Option<u64> {
        let named: Vec<u64> = self
            .files
            .iter()
            .filter(|(_, t)| !t.names.is_empty())
            .map(|(&i, _)| i)
            .collect();
        (!named.is_empty()).then(|| named[self.rng.below(named.len() as u64) as usize])
    }

    fn random_dir(&mut self) -> Vec<u8> {
        let n = self.dir_paths.len() as u64;
        self.dir_paths[self.rng.below(n) as usize].clone()
    }

    fn random_name(&mut self) -> Vec<u8> {
        let d = self.random_dir();
        join(&d, format!("f{}", self.rng.below(14)).as_bytes())
    }

    fn is_empty_dir(&self, d: &[u8]) -> bool {
        let mut n = 0;
        self.fs
            .readdir(self.dir(d), 0, &mut |e| {
                if e.name != b"." && e.name != b".." {
                    n += 1;
                }
                true
            })
            .unwrap();
        n == 0
    }

    /// Unless the workload allocated a chunk already (the set had `chunks` at the start):
    /// a new file larger than the free space of the data chunks, whatever the random
    /// operations freed before.
    fn grow(&mut self, chunks: usize) {
        let usage = self.fs.chunk_usage().unwrap();
        if usage.len() > chunks {
            return;
        }
        let free: u64 = usage
            .iter()
            .filter(|c| c.flags & BG_DATA != 0)
            .map(|c| c.length - c.used)
            .sum();
        let p = b"b/grow".to_vec();
        let a = self
            .fs
            .mknod(self.dir(b"b"), b"grow", &NewInode::file(0o644))
            .unwrap();
        self.files.entry(a.id.ino).or_default().names.insert(p);
        self.changed(a.id.ino);
        for off in (0..free + 8 * MIB).step_by(MIB as usize) {
            self.fs.write(a.id, off, &data_for(off, MIB, 0x5a)).unwrap();
        }
    }

    /// One operation; true when it ended with a commit of everything it did (sync, or
    /// an fsync that committed), so that the live state is the committed one.
    fn step(&mut self) -> bool {
        let kind = self.rng.below(100);
        if kind < 2 {
            if self.dir_paths.len() >= 10 {
                return false;
            }
            let parent = self.random_dir();
            let p = join(&parent, format!("d{}", self.op).as_bytes());
            let dir = self.dir(&parent);
            self.fs
                .mkdir(dir, split(&p).1, &NewInode::dir(0o755))
                .unwrap();
            self.dir_paths.push(p);
        } else if kind < 3 {
            // rmdir of an empty directory the workload made.
            let i = DIRS.len() + self.rng.below(10) as usize;
            let Some(d) = self.dir_paths.get(i).cloned() else {
                return false;
            };
            let has_subdir = self
                .dir_paths
                .iter()
                .any(|o| o.len() > d.len() && o.starts_with(&d) && o[d.len()] == b'/');
            if has_subdir || !self.is_empty_dir(&d) {
                return false;
            }
            let (parent, name) = split(&d);
            let pd = self.dir(parent);
            self.fs.rmdir(pd, name).unwrap();
            self.dir_paths.remove(i);
        } else if kind < 9 {
            let p = self.random_name();
            let (d, n) = split(&p);
            let dir = self.dir(d);
            if let Ok(a) = self.fs.mknod(dir, n, &NewInode::file(0o644)) {
                self.files.entry(a.id.ino).or_default().names.insert(p);
                self.changed(a.id.ino);
            }
        } else if kind < 38 {
            let Some(ino) = self.random_file() else {
                return false;
            };
            let len = match self.rng.below(25) {
                0 => MIB + self.rng.below(3 * MIB),
                1..=8 => 1 + self.rng.below(4096),
                9..=16 => 32 * 1024 + self.rng.below(40_000),
                _ => 1 + self.rng.below(200_000),
            };
            let off = if self.rng.chance(30) {
                self.fs.getattr(self.id(ino)).unwrap().size
            } else {
                self.rng.below(256 * 1024)
            };
            let fill = self.rng.next() as u8;
            self.changed(ino);
            self.fs
                .write(self.id(ino), off, &data_for(off, len, fill))
                .unwrap();
        } else if kind < 42 {
            let Some(ino) = self.random_file() else {
                return false;
            };
            let size = Some(self.rng.below(300_000));
            self.changed(ino);
            self.fs
                .setattr(
                    self.id(ino),
                    &SetAttr {
                        size,
                        ..Default::default()
                    },
                )
                .unwrap();
        } else if kind < 48 {
            let Some(ino) = self.random_file() else {
                return false;
            };
            let (off, len) = (self.rng.below(300_000), 1 + self.rng.below(150_000));
            let keep_size = self.rng.chance(50);
            let mode = match self.rng.below(3) {
                0 => FallocMode::PunchHole,
                1 => FallocMode::Allocate { keep_size },
                _ => FallocMode::ZeroRange { keep_size },
            };
            self.changed(ino);
            self.fs.fallocate(self.id(ino), off, len, mode).unwrap();
        } else if kind < 53 {
            let Some(ino) = self.random_file() else {
                return false;
            };
            let name = format!("user.x{}", self.rng.below(3)).into_bytes();
            self.changed(ino);
            if self.rng.chance(30) {
                let _ = self.fs.removexattr(self.id(ino), &name);
            } else {
                let v = vec![b'v'; self.rng.below(200) as usize];
                self.fs
                    .setxattr(self.id(ino), &name, &v, XattrSet::Either)
                    .unwrap();
            }
        } else if kind < 58 {
            // Rename, over an existing file at times.
            let Some(ino) = self.random_file() else {
                return false;
            };
            let from = self.files[&ino].names.iter().next().unwrap().clone();
            let to = self.random_name();
            let victim = self.named(&to);
            if to == from || victim == Some(ino) {
                return false;
            }
            let (fd, fnm) = split(&from);
            let (td, tnm) = split(&to);
            let (fdir, tdir) = (self.dir(fd), self.dir(td));
            self.changed(ino);
            if let Some(v) = victim {
                self.changed(v);
            }
            self.fs
                .rename(fdir, fnm, tdir, tnm, RenameFlags::default())
                .unwrap();
            if let Some(v) = victim {
                self.files.get_mut(&v).unwrap().names.remove(&to);
            }
            let t = self.files.get_mut(&ino).unwrap();
            t.names.remove(&from);
            t.names.insert(to);
        } else if kind < 61 {
            let Some(ino) = self.random_file() else {
                return false;
            };
            let to = self.random_name();
            if self.named(&to).is_some() {
                return false;
            }
            let (td, tnm) = split(&to);
            let tdir = self.dir(td);
            self.changed(ino);
            self.fs.link(self.id(ino), tdir, tnm).unwrap();
            self.files.get_mut(&ino).unwrap().names.insert(to);
        } else if kind < 65 {
            let Some(ino) = self.random_file() else {
                return false;
            };
            let p = self.files[&ino].names.iter().next().unwrap().clone();
            let (d, n) = split(&p);
            let dir = self.dir(d);
            self.changed(ino);
            self.fs.unlink(dir, n).unwrap();
            self.files.get_mut(&ino).unwrap().names.remove(&p);
        } else if kind < 67 {
            self.fs.sync().unwrap();
            self.syncs += 1;
            return true;
        } else if kind < 71 {
            let d = self.random_dir();
            let id = self.dir(&d);
            let generation = self.fs.superblock().generation;
            self.fs.fsync(id, false).unwrap();
            return self.fs.superblock().generation != generation;
        } else {
            let Some(ino) = self.random_file() else {
                return false;
            };
            let want = self.durable(ino);
            let generation = self.fs.superblock().generation;
            self.fs.fsync(self.id(ino), self.rng.chance(30)).unwrap();
            self.take();
            let at = (self.op, self.events.len(), want);
            self.files.get_mut(&ino).unwrap().fsyncs.push(at);
            self.fsyncs += 1;
            return self.fs.superblock().generation != generation;
        }
        false
    }
}

/// Files that a crash after `events[..n]` must show as fsynced.
fn expected(files: &BTreeMap<u64, Tracked>, n: usize) -> Vec<(u64, Durable)> {
    let mut out = Vec::new();
    for (&ino, t) in files {
        let Some((op, _, d)) = t.fsyncs.iter().rev().find(|(_, at, _)| *at <= n) else {
            continue;
        };
        if t.changes.iter().any(|&(o, at)| o > *op && at < n) {
            continue; // changed after the fsync, and that may have reached the disk
        }
        out.push((ino, d.clone()));
    }
    out
}

fn oleo_durable(fs: &Filesystem, names: &BTreeSet<Vec<u8>>) -> Option<Durable> {
    let id = resolve(fs, names.iter().next()?).ok()?;
    let a = fs.getattr(id).ok()?;
    let content = read_all(fs, id, a.size).ok()?;
    let mut seen = BTreeSet::new();
    for p in names {
        if resolve(fs, p) == Ok(id) {
            seen.insert(p.clone());
        }
    }
    if a.nlink as usize != names.len() {
        seen.insert(format!("<{} links>", a.nlink).into_bytes());
    }
    Some(Durable {
        data: (content.len() as u64, common::hash(&content)),
        xattrs: user_xattrs(fs, id),
        names: seen,
    })
}

fn kernel_durable(top: &Path, names: &BTreeSet<Vec<u8>>) -> Option<Durable> {
    let path = |p: &[u8]| top.join(std::ffi::OsStr::from_bytes(p));
    let first = path(names.iter().next()?);
    let m = std::fs::metadata(&first).ok()?;
    let content = std::fs::read(&first).ok()?;
    let mut seen = BTreeSet::new();
    for q in names {
        if std::fs::symlink_metadata(path(q)).is_ok_and(|x| x.ino() == m.ino()) {
            seen.insert(q.clone());
        }
    }
    if m.nlink() as usize != names.len() {
        seen.insert(format!("<{} links>", m.nlink()).into_bytes());
    }
    Some(Durable {
        data: (content.len() as u64, common::hash(&content)),
        xattrs: oleo_testkit::ops::xattrs_of(&first),
        names: seen,
    })
}

fn check_durable(
    what: &str,
    want: &[(u64, Durable)],
    got: impl Fn(&BTreeSet<Vec<u8>>) -> Option<Durable>,
) {
    for (ino, d) in want {
        let g = got(&d.names);
        assert!(
            g.as_ref() == Some(d),
            "{what}: inode {ino} {:?} was fsynced as {:?}; found {:?}",
            d.names.iter().map(|n| show(n)).collect::<Vec<_>>(),
            d,
            g
        );
    }
}

/// `btrfs check --readonly --check-data-csum` over the set (`md::offline_check`). A run
/// that did not find one of the set's own loop devices ("device N is missing": another
/// program detached or broke loop devices meanwhile, "cannot scan /dev/loopN") says
/// nothing about the set: it is run again, up to three times.
fn check_set(images: &[PathBuf]) -> md::OfflineCheck {
    let mut tries = 0;
    loop {
        let c = md::offline_check(images).unwrap();
        tries += 1;
        if c.clean || !c.output.contains(" is missing") || tries == 3 {
            return c;
        }
        eprintln!(
            "btrfs check did not find every device of the set, again:\n{}",
            c.output
        );
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
}

/// The primary superblock's offset on every device.
const SB_OFFSET: u64 = 64 * 1024;

/// (generation, log_root) of a superblock.
fn sb_fields(data: &[u8]) -> (u64, u64) {
    let at = |o: usize| u64::from_le_bytes(data[o..o + 8].try_into().unwrap());
    (at(0x48), at(0x60))
}

fn read_sb(image: &Path) -> (u64, u64) {
    let mut buf = vec![0u8; 4096];
    std::fs::File::open(image)
        .unwrap()
        .read_exact_at(&mut buf, SB_OFFSET)
        .unwrap();
    sb_fields(&buf)
}

/// The crash points: right after superblock writes of commits and of log syncs (one
/// device has the new superblock, the next not yet), around flushes, and at random.
fn choose_cuts(events: &[(u64, IoEvent)], points: usize, rng: &mut Rng) -> Vec<usize> {
    let (mut commit_sb, mut log_sb, mut flushes) = (Vec::new(), Vec::new(), Vec::new());
    for (i, (_, e)) in events.iter().enumerate() {
        match e {
            IoEvent::Write { offset, data } if *offset == SB_OFFSET => {
                if sb_fields(data).1 == 0 {
                    commit_sb.push(i + 1);
                } else {
                    log_sb.push(i + 1);
                }
            }
            IoEvent::Flush => flushes.extend([i, i + 1]),
            _ => {}
        }
    }
    let mut cuts = Vec::new();
    let mut some = |from: &[usize], n: usize, rng: &mut Rng| {
        for _ in 0..n.min(from.len()) {
            cuts.push(from[rng.below(from.len() as u64) as usize]);
        }
    };
    some(&commit_sb, points * 3 / 8, rng);
    some(&log_sb, points / 6, rng);
    some(&flushes, points / 6, rng);
    while cuts.len() + 1 < points {
        cuts.push(rng.below(events.len() as u64 + 1) as usize);
    }
    cuts.push(events.len());
    cuts.sort();
    cuts.dedup();
    cuts
}

/// Crash images made in place: each device's image holds its durable writes (everything
/// before its last flush before the cut); the writes after it that are kept are put on
/// top and taken off again after the checks (`undo`).
struct CrashSet {
    images: Vec<PathBuf>,
    files: Vec<std::fs::File>,
    /// Per device: events applied as durable so far.
    applied: Vec<usize>,
    /// Per device: (generation, log_root) of its durable primary superblock.
    durable_sb: Vec<(u64, u64)>,
    undo: Vec<(usize, u64, Vec<u8>)>,
}

impl CrashSet {
    fn new(base: &[PathBuf], dir: &Path) -> CrashSet {
        let images: Vec<PathBuf> = (0..base.len())
            .map(|i| dir.join(format!("crash-{}.img", i + 1)))
            .collect();
        for (b, c) in base.iter().zip(&images) {
            sparse_copy(b, c);
        }
        let files = images
            .iter()
            .map(|p| {
                std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(p)
                    .unwrap()
            })
            .collect();
        CrashSet {
            durable_sb: images.iter().map(|p| read_sb(p)).collect(),
            applied: vec![0; images.len()],
            images,
            files,
            undo: Vec::new(),
        }
    }

    /// Builds the crash after `events[..n]` (n not below the previous one's); returns the
    /// number of writes lost.
    fn build(&mut self, events: &[(u64, IoEvent)], n: usize, rng: &mut Rng) -> usize {
        assert!(self.undo.is_empty());
        let ndev = self.images.len();
        let mut last_flush = vec![0usize; ndev];
        for (i, (d, e)) in events[..n].iter().enumerate() {
            if *e == IoEvent::Flush {
                last_flush[*d as usize - 1] = i + 1;
            }
        }
        for d in 0..ndev {
            let from = self.applied[d];
            for (devid, e) in &events[from.min(last_flush[d])..last_flush[d]] {
                if let (true, IoEvent::Write { offset, data }) = (*devid as usize == d + 1, e) {
                    self.files[d].write_all_at(data, *offset).unwrap();
                    if *offset == SB_OFFSET {
                        self.durable_sb[d] = sb_fields(data);
                    }
                }
            }
            self.applied[d] = self.applied[d].max(last_flush[d]);
        }
        let mut lost = 0;
        let tail = last_flush.iter().copied().min().unwrap_or(0);
        for (i, (devid, e)) in events[..n].iter().enumerate().skip(tail) {
            let d = *devid as usize - 1;
            let IoEvent::Write { offset, data } = e else {
                continue;
            };
            if i < last_flush[d] {
                continue;
            }
            if rng.below(2) == 0 {
                lost += 1;
                continue;
            }
            let mut old = vec![0u8; data.len()];
            self.files[d].read_exact_at(&mut old, *offset).unwrap();
            self.undo.push((d, *offset, old));
            self.files[d].write_all_at(data, *offset).unwrap();
        }
        lost
    }

    /// Takes the kept writes after the flushes off again.
    fn restore(&mut self) {
        while let Some((d, offset, old)) = self.undo.pop() {
            self.files[d].write_all_at(&old, offset).unwrap();
        }
    }
}

fn crash_states(spec: &SetSpec, ops: usize) {
    init_log();
    let name = format!("multi_device_crash crash states {}", spec.label);
    if !require_root(&name) {
        return;
    }
    for seed in seeds(&name, 1) {
        let started = Instant::now();
        crash_states_seed(spec, ops, seed);
        eprintln!("{name} seed {seed}: done in {:?}", started.elapsed());
    }
}

fn crash_states_seed(spec: &SetSpec, ops: usize, seed: u64) {
    let what = format!("{} seed {seed}", spec.label);
    let tmp = TempDir::new(&format!("mdcrash-{}", spec.label)).unwrap();
    let base = md::mkfs_set(
        tmp.path(),
        "base",
        spec.ndevs,
        spec.size_mb * MIB,
        spec.profile,
        spec.profile,
    )
    .unwrap_or_else(|e| panic!("{what}: mkfs.btrfs: {e}"));
    // The base: the workload's directories, and a ballast file that leaves the data
    // chunks a few MiB free, so that the workload allocates a chunk while recorded.
    let chunks_before = {
        let fs = open_set(&base, 0, true, true, false).unwrap();
        for d in &DIRS[1..] {
            fs.mkdir(fs.root(), d, &NewInode::dir(0o755)).unwrap();
        }
        let free: u64 = fs
            .chunk_usage()
            .unwrap()
            .iter()
            .filter(|c| c.flags & BG_DATA != 0)
            .map(|c| c.length - c.used)
            .sum();
        let ballast = free.saturating_sub(6 * MIB) / MIB * MIB;
        let id = fs
            .mknod(fs.root(), BALLAST, &NewInode::file(0o600))
            .unwrap()
            .id;
        for off in (0..ballast).step_by(MIB as usize) {
            fs.write(id, off, &data_for(off, MIB, 0xd1)).unwrap();
        }
        let n = fs.chunk_usage().unwrap().len();
        fs.close().unwrap();
        n
    };
    let ballast_hash = {
        let fs = open_set(&base, 0, false, true, false).unwrap();
        let id = resolve(&fs, BALLAST).unwrap();
        let size = fs.getattr(id).unwrap().size;
        (size, common::hash(&read_all(&fs, id, size).unwrap()))
    };
    let work: Vec<PathBuf> = (1..=spec.ndevs)
        .map(|i| tmp.join(format!("work-{i}.img")))
        .collect();
    for (b, w) in base.iter().zip(&work) {
        sparse_copy(b, w);
    }

    let fs = open_set(&work, 0, true, true, false).unwrap();
    let base_gen = fs.superblock().generation;
    let mut w = Workload {
        rng: Rng::new(seed),
        files: BTreeMap::new(),
        dir_paths: DIRS.iter().map(|d| d.to_vec()).collect(),
        events: Vec::new(),
        op: 0,
        fsyncs: 0,
        syncs: 0,
        states: BTreeMap::from([(base_gen, Some(oleo_state(&fs)))]),
        committed: Vec::new(),
        fs,
    };
    w.fs.start_io_recording();
    let mut last_gen = base_gen;
    for i in 0..ops {
        w.op += 1;
        let at_end = if i + 1 == ops {
            w.fs.sync().unwrap();
            true
        } else if i == ops / 2 {
            w.grow(chunks_before);
            false
        } else {
            w.step()
        };
        w.take();
        let generation = w.fs.superblock().generation;
        if generation != last_gen {
            w.committed.push((w.events.len(), generation));
            for g in last_gen + 1..generation {
                w.states.insert(g, None);
            }
            let state = at_end.then(|| oleo_state(&w.fs));
            w.states.insert(generation, state);
            last_gen = generation;
        }
    }
    let chunks_after = w.fs.chunk_usage().unwrap().len();
    let (log_syncs, covered) = w.fs.log_sync_counts();
    let events = std::mem::take(&mut w.events);
    let flushes = events.iter().filter(|e| e.1 == IoEvent::Flush).count();
    let bytes: u64 = events
        .iter()
        .map(|e| match &e.1 {
            IoEvent::Write { data, .. } => data.len() as u64,
            IoEvent::Flush => 0,
        })
        .sum();
    let per_dev: Vec<usize> = (1..=spec.ndevs as u64)
        .map(|d| events.iter().filter(|e| e.0 == d).count())
        .collect();
    let known = w.states.values().filter(|s| s.is_some()).count();
    eprintln!(
        "{what}: {ops} ops, {} fsyncs ({log_syncs} log syncs covering {covered}), {} syncs asked, \
         {} commits ({known} states known); {} events ({flushes} flushes, {} MiB written; per \
         device {per_dev:?}); chunks {chunks_before} -> {chunks_after}",
        w.fsyncs,
        w.syncs,
        w.committed.len(),
        events.len(),
        bytes / MIB
    );
    assert!(log_syncs > 0, "{what}: no fsync went through the log");
    assert!(
        per_dev.iter().all(|&n| n > 0),
        "{what}: a device got no IO: {per_dev:?}"
    );
    assert!(
        chunks_after > chunks_before,
        "{what}: the workload allocated no chunk"
    );
    let Workload {
        fs,
        files,
        states,
        committed,
        ..
    } = w;
    fs.close().unwrap();

    let points: usize = std::env::var("OLEO_MD_CRASH_POINTS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(40);
    let mut rng = Rng::new(seed ^ 0x5eed);
    let cuts = choose_cuts(&events, points, &mut rng);
    let mut crash = CrashSet::new(&base, tmp.path());
    let mnt = tmp.subdir("mnt").unwrap();
    let kcopies: Vec<PathBuf> = (1..=spec.ndevs)
        .map(|i| tmp.join(format!("kernel-{i}.img")))
        .collect();
    let (mut exact, mut unknown, mut files_checked, mut with_kernel, mut split_sb) =
        (0, 0, 0, 0, 0);
    for (k, &n) in cuts.iter().enumerate() {
        let lost = crash.build(&events, n, &mut rng);
        let here = format!(
            "{what}: crash after {n} of {} events ({lost} late writes lost)",
            events.len()
        );
        // Every commit that returned before the crash is on every device.
        let floor = committed
            .iter()
            .filter(|(at, _)| *at <= n)
            .map(|(_, g)| *g)
            .max()
            .unwrap_or(base_gen);
        for (d, sb) in crash.durable_sb.iter().enumerate() {
            assert!(
                sb.0 >= floor,
                "{here}: devid {} has generation {} durable, but commit {floor} returned",
                d + 1,
                sb.0
            );
        }
        let sbs: Vec<(u64, u64)> = crash.images.iter().map(|p| read_sb(p)).collect();
        let newest = sbs.iter().map(|s| s.0).max().unwrap();
        if sbs.iter().any(|s| s.0 != newest) {
            split_sb += 1;
        }
        let check = check_set(&crash.images);
        assert!(
            check.clean,
            "{here} (superblocks {sbs:?}): btrfs check:\n{}",
            check.output
        );

        // Without the log: exactly the newest commit on any device.
        let fs = open_set(&crash.images, (k + n) % spec.ndevs, false, false, false)
            .unwrap_or_else(|e| panic!("{here}: oleo cannot open: {e}"));
        let generation = fs.superblock().generation;
        assert_eq!(
            generation, newest,
            "{here}: oleo opened generation {generation}, superblocks {sbs:?}"
        );
        let want = states.get(&generation).unwrap_or_else(|| {
            panic!("{here}: generation {generation} was never committed (superblocks {sbs:?})")
        });
        if let Some(want) = want {
            let diffs = state_diffs(want, &oleo_state(&fs), false);
            assert!(
                diffs.is_empty(),
                "{here}: oleo (no log replay) differs from commit {generation}:\n{}",
                diffs.join("\n")
            );
            exact += 1;
        } else {
            unknown += 1;
        }
        let b = resolve(&fs, BALLAST).unwrap();
        assert_eq!(
            (
                fs.getattr(b).unwrap().size,
                common::hash(&read_all(&fs, b, ballast_hash.0).unwrap())
            ),
            ballast_hash,
            "{here}: the ballast file changed"
        );
        drop(fs);

        // With the log replayed in memory: everything fsynced.
        let durable = expected(&files, n);
        files_checked += durable.len();
        let fs = open_set(&crash.images, k % spec.ndevs, false, true, false)
            .unwrap_or_else(|e| panic!("{here}: oleo cannot open with log replay: {e}"));
        check_durable(&format!("{here}, oleo replayed"), &durable, |names| {
            oleo_durable(&fs, names)
        });
        let replayed = oleo_state(&fs);
        drop(fs);

        if k % 5 == 0 {
            for (c, k) in crash.images.iter().zip(&kcopies) {
                sparse_copy(c, k);
            }
            let set = md::KernelSet::mount(&kcopies, &[], &mnt, &["ro", "rescue=nologreplay"])
                .unwrap_or_else(|e| panic!("{here}: kernel mount (nologreplay): {e}"));
            let seen = kernel_state(set.root());
            set.unmount().unwrap();
            if let Some(want) = want {
                let diffs = state_diffs(want, &seen, false);
                assert!(
                    diffs.is_empty(),
                    "{here}: the kernel (no log replay) differs from commit {generation}:\n{}",
                    diffs.join("\n")
                );
            }
            let set = md::KernelSet::mount(&kcopies, &[], &mnt, &["rw", "noatime"])
                .unwrap_or_else(|e| panic!("{here}: kernel mount (log replay): {e}"));
            let top = set.root().to_path_buf();
            let r = std::panic::catch_unwind(|| {
                check_durable(&format!("{here}, kernel replayed"), &durable, |names| {
                    kernel_durable(&top, names)
                });
                kernel_state(&top)
            });
            set.unmount().unwrap();
            let seen = r.unwrap_or_else(|e| std::panic::resume_unwind(e));
            // Devices at the newest generation with different log roots (a log sync cut
            // between their superblocks): which one speaks is a tie oleo breaks by devid
            // and the kernel by the order it registered them, so the replays may differ.
            let logs: BTreeSet<u64> = sbs.iter().filter(|s| s.0 == newest).map(|s| s.1).collect();
            if logs.len() == 1 {
                let diffs = state_diffs(&seen, &replayed, true);
                assert!(
                    diffs.is_empty(),
                    "{here}: oleo's log replay differs from the kernel's:\n{}",
                    diffs.join("\n")
                );
            }
            for k in &kcopies {
                let _ = std::fs::remove_file(k);
            }
            with_kernel += 1;
        }
        crash.restore();
    }
    eprintln!(
        "{what}: {} crash states ({split_sb} with devices at different generations): \
         {exact} equal to their commit, {unknown} of a commit made inside an operation; \
         {files_checked} fsynced files checked; {with_kernel} also mounted by the kernel",
        cuts.len()
    );
    assert!(
        exact * 2 >= cuts.len(),
        "{what}: too few states compared exactly ({exact} of {})",
        cuts.len()
    );
}

#[test]
fn crash_states_raid1() {
    crash_states(&RAID1, 500);
}

#[test]
fn crash_states_raid10() {
    crash_states(&RAID10, 400);
}
