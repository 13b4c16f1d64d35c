//! POSIX operations through the library, against a reference directory: seeded random
//! sequences of create/mknod/mkdir/symlink/link/unlink/rmdir/rename (with flags)/write/
//! truncate/fallocate/chmod/chown/utimens/xattrs are applied to an oleo-opened image and
//! to a directory on the host filesystem alike; every operation must give the same result
//! (or the same errno). At checkpoints the image is committed, `btrfs check --readonly
//! --check-data-csum` must be clean, and the kernel mounts it and must show the same tree
//! as the reference (content, type, mode, size, owner, link counts, rdev, symlink targets,
//! xattrs, names; hard-link groups), and so must oleo after reopening.
//!
//! Needs root and btrfs-progs; without them it prints `SKIP: ...` (fails under CI=true).
//! Seeds: `OLEO_TEST_SEED` replays one; `OLEO_TEST_SEEDS=N` runs N seeds per case (default 3).

use oleo::{
    FallocMode, FileKind, Filesystem, InodeId, NewInode, OpenOptions, RenameFlags, SetAttr,
    Timespec, XattrSet,
};
use oleo_testkit::assert_btrfs_check;
use oleo_testkit::ops::{
    apply_path, compare_trees, content_hash, data_for, follows, random_op, seeds, shapes, split,
    Op, Rng,
};
use std::path::{Path, PathBuf};
use std::process::Command;

struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("oleo-posix-{name}-{}", std::process::id()));
        let _ = Command::new("umount").arg(dir.join("mnt")).output();
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("ref")).expect("scratch dir");
        std::fs::create_dir_all(dir.join("mnt")).expect("scratch dir");
        Scratch(dir)
    }
    fn image(&self) -> PathBuf {
        self.0.join("image")
    }
    fn reference(&self) -> PathBuf {
        self.0.join("ref")
    }
    fn mnt(&self) -> PathBuf {
        self.0.join("mnt")
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.mnt()).output();
        if std::env::var("OLEO_TEST_KEEP").is_err() {
            let _ = std::fs::remove_dir_all(&self.0);
        } else {
            eprintln!("kept {}", self.0.display());
        }
    }
}

#[derive(Clone, Copy)]
enum Maker {
    Oleo {
        nodesize: u32,
        csum: &'static str,
        no_holes: bool,
    },
    Progs(&'static [&'static str]),
}

fn make_image(path: &Path, maker: Maker, bytes: u64) {
    let f = std::fs::File::create(path).expect("create image");
    f.set_len(bytes).expect("size image");
    drop(f);
    match maker {
        Maker::Oleo {
            nodesize,
            csum,
            no_holes,
        } => {
            let mut opts = oleo::mkfs::MkfsOptions {
                nodesize,
                csum: match csum {
                    "xxhash" => oleo::format::csum::CsumType::Xxhash64,
                    "sha256" => oleo::format::csum::CsumType::Sha256,
                    "blake2" => oleo::format::csum::CsumType::Blake2b,
                    _ => oleo::format::csum::CsumType::Crc32c,
                },
                ..Default::default()
            };
            if !no_holes {
                opts.features.no_holes = false;
            }
            oleo::mkfs::mkfs(path, &opts).expect("oleo mkfs");
        }
        Maker::Progs(args) => {
            let out = Command::new("mkfs.btrfs")
                .arg("-q")
                .arg("-f")
                .args(args)
                .arg(path)
                .output()
                .expect("mkfs.btrfs");
            assert!(
                out.status.success(),
                "mkfs.btrfs: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

// ---------------------------------------------------------------------------------------
// The oleo side: paths resolved through lookup.

fn resolve(fs: &Filesystem, rel: &[u8]) -> Result<InodeId, i32> {
    resolve_from(fs, fs.root(), rel)
}

fn resolve_from(fs: &Filesystem, root: InodeId, rel: &[u8]) -> Result<InodeId, i32> {
    let mut id = root;
    for comp in rel.split(|&b| b == b'/').filter(|c| !c.is_empty()) {
        id = fs.lookup(id, comp).map_err(|e| e.errno())?;
    }
    Ok(id)
}

/// What the VFS refuses before a filesystem sees the call.
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
            // user.* xattrs only on regular files and directories.
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

fn apply_oleo(fs: &mut Filesystem, op: &Op) -> Result<(), i32> {
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
            // The VFS's own checks, in its order: names, then ancestry.
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

/// Walks the tree through oleo's reader and checks it against the reference.
fn compare_oleo(fs: &Filesystem, reference: &Path) {
    compare_oleo_at(fs, fs.root(), reference)
}

/// `compare_oleo` for the tree under `root` (a snapshot's).
fn compare_oleo_at(fs: &Filesystem, root: InodeId, reference: &Path) {
    let want = shapes(reference);
    let mut seen = 0;
    for (rel, s) in &want {
        let id = resolve_from(fs, root, rel).unwrap_or_else(|e| {
            panic!(
                "oleo cannot find {}: errno {e}",
                String::from_utf8_lossy(rel)
            )
        });
        let a = fs.getattr(id).unwrap();
        assert_eq!(a.mode, s.mode, "{} mode", String::from_utf8_lossy(rel));
        if s.kind != 0o040000 {
            assert_eq!(a.size, s.size, "{} size", String::from_utf8_lossy(rel));
            assert_eq!(
                u64::from(a.nlink),
                s.nlink,
                "{} nlink",
                String::from_utf8_lossy(rel)
            );
        }
        if let Some(c) = &s.content {
            let got = if s.size == 0 {
                Vec::new()
            } else {
                fs.read(id, 0, s.size as u32 + 10).unwrap()
            };
            assert!(
                content_hash(&got) == *c,
                "{} content differs through oleo",
                String::from_utf8_lossy(rel)
            );
        }
        seen += 1;
    }
    assert_eq!(seen, want.len());
}

struct Case {
    name: &'static str,
    maker: Maker,
    ops: usize,
    big: bool,
    /// Run the operations in subvolume `work` and snapshot it now and then into the top
    /// level (out of the operations' reach), deleting one now and then; each snapshot must
    /// stay what the reference was when it was taken.
    snapshots: bool,
    /// The mount option compress= or compress-force= (e.g. "compress-force=lzo").
    compress: Option<&'static str>,
}

impl Case {
    fn compress(&self) -> Option<oleo::compression::Compress> {
        let (name, value) = self.compress?.split_once('=').expect("option=value");
        oleo::compression::Compress::parse(Some(value), name == "compress-force")
            .expect("compress option")
    }
}

/// Files the compression cases write last: 1 MiB that compresses well, 1 MiB that does not.
const PROBES: [(&str, u8); 2] = [("probe-compressible", 1), ("probe-noise", 0xf0)];

/// The top level's root directory, where the snapshots go.
const TOP: InodeId = InodeId {
    subvol: 5,
    ino: 256,
};

fn run_case(case: &Case, seed: u64) {
    let scratch = Scratch::new(&format!("{}-{seed}", case.name));
    let image = scratch.image();
    make_image(&image, case.maker, 1 << 30);
    let mut rng = Rng::new(seed);
    let opts = || OpenOptions {
        subvol: case.snapshots.then(|| b"work".to_vec()),
        compress: case.compress(),
        ..OpenOptions::default()
    };
    if case.snapshots {
        let fs = Filesystem::open_rw(&image, OpenOptions::default()).expect("open_rw");
        fs.create_subvolume(fs.root(), b"work", 0, 0)
            .expect("create work");
        fs.sync().expect("sync");
    }
    let mut fs = Filesystem::open_rw(&image, opts()).expect("open_rw");
    let reference = scratch.reference();
    // (name, copy of the reference when it was taken)
    let mut snaps: Vec<(String, PathBuf)> = Vec::new();
    let mut agreed = 0usize;
    let mut failed = 0usize;
    for i in 0..case.ops {
        let op = random_op(&mut rng, &reference, case.big);
        let want = apply_path(&reference, &op);
        if std::env::var("OLEO_TEST_TRACE").is_ok() {
            eprintln!("op {i}: {op} -> {want:?}");
        }
        let got = apply_oleo(&mut fs, &op);
        assert_eq!(
            got, want,
            "seed {seed} op {i}: {op}: oleo {got:?} vs reference {want:?}"
        );
        if want.is_ok() {
            agreed += 1;
        } else {
            failed += 1;
        }
        if rng.chance(3) {
            fs.sync().expect("sync");
        }
        if case.snapshots && rng.chance(3) {
            let name = format!("snap{i}");
            let ro = rng.chance(50);
            if std::env::var("OLEO_TEST_TRACE").is_ok() {
                eprintln!("snapshot {name} ro={ro}");
            }
            fs.snapshot(fs.root().subvol, TOP, name.as_bytes(), ro)
                .unwrap_or_else(|e| panic!("seed {seed} op {i}: snapshot {name}: {e}"));
            let copy = scratch.0.join(&name);
            let st = Command::new("cp")
                .arg("-a")
                .arg(&reference)
                .arg(&copy)
                .status()
                .expect("cp -a");
            assert!(st.success(), "cp -a of the reference");
            snaps.push((name, copy));
        }
        if case.snapshots && !snaps.is_empty() && rng.chance(1) {
            let (name, copy) = snaps.remove(rng.below(snaps.len() as u64) as usize);
            fs.delete_subvolume(TOP, name.as_bytes())
                .unwrap_or_else(|e| panic!("seed {seed} op {i}: delete {name}: {e}"));
            let _ = std::fs::remove_dir_all(copy);
        }
        if rng.chance(1) {
            fs.sync().expect("sync");
            drop(fs);
            fs = Filesystem::open_rw(&image, opts()).expect("reopen");
        }
    }
    if case.compress.is_some() {
        for (name, fill) in PROBES {
            let data = data_for(0, 1 << 20, fill);
            std::fs::write(reference.join(name), &data).unwrap();
            let a = fs
                .mknod(fs.root(), name.as_bytes(), &NewInode::file(0o644))
                .expect("probe");
            fs.write(a.id, 0, &data).expect("probe write");
        }
    }
    fs.sync().expect("final sync");
    compare_oleo(&fs, &reference);
    for (name, copy) in &snaps {
        let root = fs.lookup(TOP, name.as_bytes()).expect("snapshot");
        compare_oleo_at(&fs, root, copy);
    }
    drop(fs);
    eprintln!(
        "{} seed {seed}: {agreed} operations done, {failed} refused alike",
        case.name
    );
    assert_btrfs_check(&image, &format!("{} seed {seed}", case.name));
    let fs = Filesystem::open(&image, opts()).expect("reopen read-only");
    compare_oleo(&fs, &reference);
    drop(fs);
    let top = if case.snapshots {
        scratch.mnt().join("work")
    } else {
        scratch.mnt()
    };
    let st = Command::new("mount")
        .args(["-o", "loop"])
        .arg(&image)
        .arg(scratch.mnt())
        .status()
        .unwrap();
    assert!(st.success(), "kernel mount");
    let r = std::panic::catch_unwind(|| {
        compare_trees(&reference, &top, "kernel");
        if case.compress.is_some() {
            // compsize reads the extents the kernel sees: compressible data takes a
            // fraction of its size, noise all of it.
            let (disk, ram) = oleo_testkit::check::compsize(&top);
            eprintln!("{} seed {seed}: compsize {disk} of {ram} bytes", case.name);
            let (disk, ram) = oleo_testkit::check::compsize(&top.join(PROBES[0].0));
            assert!(disk * 4 < ram, "compressible probe: {disk} of {ram} bytes");
            let (disk, ram) = oleo_testkit::check::compsize(&top.join(PROBES[1].0));
            assert!(disk >= ram, "noise probe: {disk} of {ram} bytes");
        }
        for (name, copy) in &snaps {
            compare_trees(copy, &scratch.mnt().join(name), &format!("kernel {name}"));
        }
    });
    // The kernel writes too: a file of its own, then check again.
    std::fs::write(top.join("kernel-wrote-this"), b"hello from the kernel").unwrap();
    // umount can find the mount briefly busy right after the walk: retry, then report why.
    let mut last = String::new();
    let unmounted = (0..20).any(|_| {
        let out = Command::new("umount").arg(scratch.mnt()).output().unwrap();
        last = String::from_utf8_lossy(&out.stderr).into_owned();
        out.status.success() || {
            std::thread::sleep(std::time::Duration::from_millis(100));
            false
        }
    });
    assert!(unmounted, "umount: {last}");
    if let Err(e) = r {
        std::panic::resume_unwind(e);
    }
    assert_btrfs_check(
        &image,
        &format!("{} seed {seed} after the kernel wrote", case.name),
    );
    let fs = Filesystem::open(&image, opts()).expect("reopen after kernel");
    let id = fs
        .lookup(fs.root(), b"kernel-wrote-this")
        .expect("kernel's file");
    assert_eq!(fs.read(id, 0, 100).unwrap(), b"hello from the kernel");
}

fn run(case: Case) {
    if !oleo_testkit::require_root(case.name) {
        return;
    }
    for seed in seeds(case.name, 3) {
        eprintln!("{}: seed {seed}", case.name);
        run_case(&case, seed);
    }
}

#[test]
fn progs_default() {
    run(Case {
        name: "progs-default",
        maker: Maker::Progs(&[]),
        ops: 400,
        big: false,
        snapshots: false,
        compress: None,
    });
}

#[test]
fn progs_snapshots_between_operations() {
    run(Case {
        name: "progs-snapshots",
        maker: Maker::Progs(&[]),
        ops: 400,
        big: false,
        snapshots: true,
        compress: None,
    });
}

#[test]
fn progs_4k_nodes_no_holes_off() {
    run(Case {
        name: "progs-4k-holes",
        maker: Maker::Progs(&["--nodesize", "4096", "-O", "^no-holes"]),
        ops: 400,
        big: false,
        snapshots: false,
        compress: None,
    });
}

#[test]
fn oleo_mkfs_sha256() {
    run(Case {
        name: "oleo-sha256",
        maker: Maker::Oleo {
            nodesize: 16384,
            csum: "sha256",
            no_holes: true,
        },
        ops: 300,
        big: true,
        snapshots: false,
        compress: None,
    });
}

#[test]
fn oleo_mkfs_xxhash_holes() {
    run(Case {
        name: "oleo-xxhash-holes",
        maker: Maker::Oleo {
            nodesize: 4096,
            csum: "xxhash",
            no_holes: false,
        },
        ops: 300,
        big: false,
        snapshots: false,
        compress: None,
    });
}

#[test]
fn progs_blake2_big_writes() {
    run(Case {
        name: "progs-blake2",
        maker: Maker::Progs(&["--csum", "blake2"]),
        ops: 200,
        big: true,
        snapshots: false,
        compress: None,
    });
}

#[test]
fn progs_compress_zstd() {
    run(Case {
        name: "progs-zstd",
        maker: Maker::Progs(&[]),
        ops: 300,
        big: true,
        snapshots: false,
        compress: Some("compress=zstd"),
    });
}

#[test]
fn progs_compress_force_lzo_holes() {
    run(Case {
        name: "progs-force-lzo",
        maker: Maker::Progs(&["-O", "^no-holes"]),
        ops: 300,
        big: true,
        snapshots: false,
        compress: Some("compress-force=lzo"),
    });
}

#[test]
fn oleo_mkfs_compress_zlib_snapshots() {
    run(Case {
        name: "oleo-zlib",
        maker: Maker::Oleo {
            nodesize: 16384,
            csum: "crc32c",
            no_holes: true,
        },
        ops: 300,
        big: false,
        snapshots: true,
        compress: Some("compress=zlib:9"),
    });
}

/// rename(2) refuses to move a directory below itself (EINVAL), as do_renameat2 does
/// before any filesystem sees the call; library callers have no VFS in front of them. An
/// exchange refuses the same from either side, and nothing changes on refusal.
#[test]
fn a_directory_is_never_moved_below_itself() {
    let dir = std::env::temp_dir().join(format!("oleo-rename-loop-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let image = dir.join("image");
    oleo::mkfs::mkfs(
        &image,
        &oleo::mkfs::MkfsOptions {
            size: Some(256 << 20),
            ..Default::default()
        },
    )
    .unwrap();
    let fs = Filesystem::open_rw(&image, OpenOptions::default()).unwrap();
    let root = fs.root();
    let a = fs.mkdir(root, b"a", &NewInode::dir(0o755)).unwrap().id;
    let b = fs.mkdir(a, b"b", &NewInode::dir(0o755)).unwrap().id;
    let c = fs.mkdir(b, b"c", &NewInode::dir(0o755)).unwrap().id;
    let none = RenameFlags::default();
    let exchange = RenameFlags {
        exchange: true,
        ..Default::default()
    };
    for (from, name, to, new_name, flags) in [
        (root, &b"a"[..], c, &b"x"[..], none),
        (root, b"a", a, b"x", none),
        (a, b"b", b, b"x", none),
        (root, b"a", c, b"c2", exchange),
        (b, b"c", root, b"a", exchange),
    ] {
        let e = fs.rename(from, name, to, new_name, flags).unwrap_err();
        assert_eq!(e.errno(), libc::EINVAL, "{e}");
    }
    // Moving up and across still works, and the tree is as it was plus that.
    fs.rename(b, b"c", root, b"c", none).unwrap();
    assert_eq!(fs.resolve_path(root, b"a/b").unwrap(), b);
    assert_eq!(fs.resolve_path(root, b"c").unwrap(), c);
    fs.close().unwrap();
    assert_btrfs_check(&image, "renames refused below themselves");
    std::fs::remove_dir_all(&dir).unwrap();
}
