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
//! Seeds: `OLEO_TEST_SEED` replays one; `OLEO_TEST_SEEDS=N` runs N seeds per case.

use oleo::{FallocMode, FileKind, Filesystem, InodeId, OpenOptions, RenameFlags, SetAttr, Timespec, XattrSet};
use std::collections::BTreeMap;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::Command;

struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E3779B97F4A7C15) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

fn seeds(test: &str) -> Vec<u64> {
    if let Some(s) = std::env::var("OLEO_TEST_SEED").ok().and_then(|s| s.parse().ok()) {
        return vec![s];
    }
    let n: u64 = std::env::var("OLEO_TEST_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(1);
    let base = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(1);
    let v: Vec<u64> = (0..n).map(|i| base.wrapping_add(i * 7919) % 1_000_000_007).collect();
    eprintln!("{test}: seeds {v:?} (OLEO_TEST_SEED=N replays one)");
    v
}

fn skip(why: &str) -> bool {
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{why} (CI=true: the test environment must provide it)");
    }
    eprintln!("SKIP: posix_ops: {why}");
    true
}

fn missing_env() -> bool {
    if unsafe { libc::geteuid() } != 0 {
        return skip("not root (the kernel mount needs it)");
    }
    for tool in ["btrfs", "mkfs.btrfs"] {
        let ok = Command::new(tool).arg("--version").output().is_ok_and(|o| o.status.success());
        if !ok {
            return skip(&format!("`{tool}` is missing (apt-get install btrfs-progs)"));
        }
    }
    false
}

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
    Oleo { nodesize: u32, csum: &'static str, no_holes: bool },
    Progs(&'static [&'static str]),
}

fn make_image(path: &Path, maker: Maker, bytes: u64) {
    let f = std::fs::File::create(path).expect("create image");
    f.set_len(bytes).expect("size image");
    drop(f);
    match maker {
        Maker::Oleo { nodesize, csum, no_holes } => {
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
            let out = Command::new("mkfs.btrfs").arg("-q").arg("-f").args(args).arg(path).output().expect("mkfs.btrfs");
            assert!(out.status.success(), "mkfs.btrfs: {}", String::from_utf8_lossy(&out.stderr));
        }
    }
}

fn btrfs_check(image: &Path, when: &str) {
    let out = Command::new("btrfs")
        .args(["check", "--readonly", "--check-data-csum"])
        .arg(image)
        .output()
        .expect("run btrfs check");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let bad = text.lines().any(|l| {
        let l = l.to_ascii_lowercase();
        (l.contains("error") && !l.contains("no error")) || l.contains("warning") || l.contains("mismatch") || l.contains("wrong")
    });
    assert!(out.status.success() && !bad, "btrfs check after {when}:\n{text}");
}

// ---------------------------------------------------------------------------------------
// The reference side: plain syscalls on a host directory.

fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).expect("no NUL in path")
}

fn errno_of<T>(r: std::io::Result<T>) -> Result<T, i32> {
    r.map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))
}

fn sys(r: libc::c_int) -> Result<(), i32> {
    if r < 0 {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO))
    } else {
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------
// The oleo side: paths resolved through lookup.

fn resolve(fs: &Filesystem, rel: &[u8]) -> Result<InodeId, i32> {
    let mut id = fs.root();
    for comp in rel.split(|&b| b == b'/').filter(|c| !c.is_empty()) {
        id = fs.lookup(id, comp).map_err(|e| e.errno())?;
    }
    Ok(id)
}

fn split(rel: &[u8]) -> (&[u8], &[u8]) {
    match rel.iter().rposition(|&b| b == b'/') {
        Some(i) => (&rel[..i], &rel[i + 1..]),
        None => (b"", rel),
    }
}

#[derive(Debug, Clone)]
enum Op {
    Mknod { path: Vec<u8>, mode: u32, rdev: u64 },
    Mkdir { path: Vec<u8>, mode: u32 },
    Symlink { path: Vec<u8>, target: Vec<u8> },
    Link { from: Vec<u8>, to: Vec<u8> },
    Unlink { path: Vec<u8> },
    Rmdir { path: Vec<u8> },
    Rename { from: Vec<u8>, to: Vec<u8>, flags: u32 },
    Write { path: Vec<u8>, offset: u64, len: u64, fill: u8 },
    Truncate { path: Vec<u8>, size: u64 },
    Fallocate { path: Vec<u8>, mode: i32, offset: u64, len: u64 },
    Chmod { path: Vec<u8>, mode: u32 },
    Chown { path: Vec<u8>, uid: u32, gid: u32 },
    Utimens { path: Vec<u8>, sec: i64 },
    SetXattr { path: Vec<u8>, name: Vec<u8>, value: Vec<u8>, flags: i32 },
    RemoveXattr { path: Vec<u8>, name: Vec<u8> },
}

fn data_for(offset: u64, len: u64, fill: u8) -> Vec<u8> {
    (0..len).map(|i| fill.wrapping_add(((offset + i) / 7) as u8)).collect()
}

/// The path operations that follow symlinks (truncate, chmod, write, fallocate) are not
/// applied to symlinks: both sides answer ELOOP, as with O_NOFOLLOW.
fn follows(op: &Op) -> Option<&[u8]> {
    match op {
        Op::Write { path, .. } | Op::Truncate { path, .. } | Op::Fallocate { path, .. } | Op::Chmod { path, .. } => Some(path),
        _ => None,
    }
}

fn apply_reference(root: &Path, op: &Op) -> Result<(), i32> {
    let p = |rel: &[u8]| root.join(std::ffi::OsStr::from_bytes(rel));
    if let Some(path) = follows(op) {
        if std::fs::symlink_metadata(p(path)).is_ok_and(|m| m.file_type().is_symlink()) {
            return Err(libc::ELOOP);
        }
    }
    unsafe {
        match op {
            Op::Mknod { path, mode, rdev } => sys(libc::mknod(cpath(&p(path)).as_ptr(), *mode, *rdev as libc::dev_t)),
            Op::Mkdir { path, mode } => sys(libc::mkdir(cpath(&p(path)).as_ptr(), *mode)),
            Op::Symlink { path, target } => {
                let t = CString::new(target.clone()).unwrap();
                sys(libc::symlink(t.as_ptr(), cpath(&p(path)).as_ptr()))
            }
            Op::Link { from, to } => sys(libc::link(cpath(&p(from)).as_ptr(), cpath(&p(to)).as_ptr())),
            Op::Unlink { path } => sys(libc::unlink(cpath(&p(path)).as_ptr())),
            Op::Rmdir { path } => sys(libc::rmdir(cpath(&p(path)).as_ptr())),
            Op::Rename { from, to, flags } => sys(libc::renameat2(
                libc::AT_FDCWD,
                cpath(&p(from)).as_ptr(),
                libc::AT_FDCWD,
                cpath(&p(to)).as_ptr(),
                *flags,
            )),
            Op::Write { path, offset, len, fill } => {
                let meta = errno_of(std::fs::symlink_metadata(p(path)))?;
                if !meta.is_file() {
                    return Err(if meta.is_dir() { libc::EISDIR } else { libc::EINVAL });
                }
                let f = errno_of(std::fs::OpenOptions::new().write(true).open(p(path)))?;
                errno_of(f.write_all_at(&data_for(*offset, *len, *fill), *offset))
            }
            Op::Truncate { path, size } => sys(libc::truncate(cpath(&p(path)).as_ptr(), *size as i64)),
            Op::Fallocate { path, mode, offset, len } => {
                let meta = errno_of(std::fs::symlink_metadata(p(path)))?;
                if !meta.is_file() {
                    return Err(if meta.is_dir() { libc::EISDIR } else { libc::ENODEV });
                }
                let f = errno_of(std::fs::OpenOptions::new().write(true).open(p(path)))?;
                use std::os::fd::AsRawFd;
                sys(libc::fallocate(f.as_raw_fd(), *mode, *offset as i64, *len as i64))
            }
            Op::Chmod { path, mode } => sys(libc::chmod(cpath(&p(path)).as_ptr(), *mode)),
            Op::Chown { path, uid, gid } => sys(libc::lchown(cpath(&p(path)).as_ptr(), *uid, *gid)),
            Op::Utimens { path, sec } => {
                let ts = [
                    libc::timespec { tv_sec: *sec, tv_nsec: 5 },
                    libc::timespec { tv_sec: *sec + 1, tv_nsec: 7 },
                ];
                sys(libc::utimensat(libc::AT_FDCWD, cpath(&p(path)).as_ptr(), ts.as_ptr(), libc::AT_SYMLINK_NOFOLLOW))
            }
            Op::SetXattr { path, name, value, flags } => {
                let n = CString::new(name.clone()).unwrap();
                sys(libc::lsetxattr(cpath(&p(path)).as_ptr(), n.as_ptr(), value.as_ptr().cast(), value.len(), *flags))
            }
            Op::RemoveXattr { path, name } => {
                let n = CString::new(name.clone()).unwrap();
                sys(libc::lremovexattr(cpath(&p(path)).as_ptr(), n.as_ptr()))
            }
        }
    }
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
            fs.mknod(d, name, *mode, *rdev, 0, 0).map(|_| ()).map_err(e)
        }
        Op::Mkdir { path, mode } => {
            let (dir, name) = split(path);
            let d = resolve(fs, dir)?;
            fs.mkdir(d, name, *mode, 0, 0).map(|_| ()).map_err(e)
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
            // The VFS refuses to move a directory below itself before the filesystem sees it.
            let src = fs.lookup(s, sn).map_err(e)?;
            if to.starts_with(from) && to.get(from.len()) == Some(&b'/') {
                return Err(libc::EINVAL);
            }
            if from.starts_with(to) && from.get(to.len()) == Some(&b'/') {
                return Err(libc::ENOTEMPTY);
            }
            let _ = src;
            let flags = RenameFlags {
                noreplace: flags & libc::RENAME_NOREPLACE != 0,
                exchange: flags & libc::RENAME_EXCHANGE != 0,
            };
            fs.rename(s, sn, d, dn, flags).map_err(e)
        }
        Op::Write { path, offset, len, fill } => {
            let id = resolve(fs, path)?;
            let a = fs.getattr(id).map_err(e)?;
            if a.kind != FileKind::File {
                return Err(if a.kind == FileKind::Dir { libc::EISDIR } else { libc::EINVAL });
            }
            fs.write(id, *offset, &data_for(*offset, *len, *fill)).map(|_| ()).map_err(e)
        }
        Op::Truncate { path, size } => {
            let id = resolve(fs, path)?;
            fs.setattr(id, &SetAttr { size: Some(*size), ..Default::default() }).map(|_| ()).map_err(e)
        }
        Op::Fallocate { path, mode, offset, len } => {
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
            fs.setattr(id, &SetAttr { mode: Some(*mode), ..Default::default() }).map(|_| ()).map_err(e)
        }
        Op::Chown { path, uid, gid } => {
            let id = resolve(fs, path)?;
            fs.setattr(id, &SetAttr { uid: Some(*uid), gid: Some(*gid), ..Default::default() }).map(|_| ()).map_err(e)
        }
        Op::Utimens { path, sec } => {
            let id = resolve(fs, path)?;
            let set = SetAttr {
                atime: Some(Timespec { sec: *sec, nsec: 5 }),
                mtime: Some(Timespec { sec: *sec + 1, nsec: 7 }),
                ..Default::default()
            };
            fs.setattr(id, &set).map(|_| ()).map_err(e)
        }
        Op::SetXattr { path, name, value, flags } => {
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

/// Every path under the reference root (relative), split into directories and the rest.
fn walk(root: &Path) -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
    let mut dirs = vec![Vec::new()];
    let mut others = Vec::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let mut names: Vec<_> = std::fs::read_dir(root.join(&rel)).unwrap().map(|e| e.unwrap().file_name()).collect();
        names.sort();
        for n in names {
            let r = rel.join(&n);
            let meta = std::fs::symlink_metadata(root.join(&r)).unwrap();
            if meta.is_dir() {
                dirs.push(r.as_os_str().as_bytes().to_vec());
                stack.push(r);
            } else {
                others.push(r.as_os_str().as_bytes().to_vec());
            }
        }
    }
    (dirs, others)
}

fn join(dir: &[u8], name: &[u8]) -> Vec<u8> {
    if dir.is_empty() {
        name.to_vec()
    } else {
        [dir, b"/", name].concat()
    }
}

fn random_op(rng: &mut Rng, root: &Path, big: bool) -> Op {
    let (dirs, others) = walk(root);
    let pick = |rng: &mut Rng, v: &Vec<Vec<u8>>| v[rng.below(v.len() as u64) as usize].clone();
    let subdirs: Vec<Vec<u8>> = dirs[1..].to_vec();
    let any = |rng: &mut Rng| {
        if !others.is_empty() && (subdirs.is_empty() || rng.chance(70)) {
            pick(rng, &others)
        } else if !subdirs.is_empty() {
            pick(rng, &subdirs)
        } else {
            b"missing".to_vec()
        }
    };
    let new_name = |rng: &mut Rng| -> Vec<u8> {
        let len = if rng.chance(5) { 200 + rng.below(56) } else { 1 + rng.below(12) };
        (0..len).map(|_| b"abcdefghijklmnopqrstuvwxyz0123456789_-."[rng.below(39) as usize]).collect()
    };
    let fresh = |rng: &mut Rng| {
        let d = pick(rng, &dirs);
        if rng.chance(20) && !others.is_empty() {
            // Often an existing name, to exercise EEXIST and replacement.
            return pick(rng, &others);
        }
        join(&d, &new_name(rng))
    };
    let file = |rng: &mut Rng| if others.is_empty() { fresh(rng) } else { pick(rng, &others) };
    let max_off: u64 = if big { 24 << 20 } else { 1 << 20 };
    match rng.below(100) {
        0..=11 => Op::Mknod { path: fresh(rng), mode: 0o100000 | 0o644 | (rng.below(2) as u32 * 0o6000), rdev: 0 },
        12..=14 => {
            let (mode, rdev) = match rng.below(3) {
                0 => (0o010644, 0),
                1 => (0o020600, libc::makedev(1 + rng.below(200) as u32, rng.below(300) as u32)),
                _ => (0o060600, libc::makedev(8, rng.below(64) as u32)),
            };
            Op::Mknod { path: fresh(rng), mode, rdev }
        }
        15..=21 => Op::Mkdir { path: fresh(rng), mode: 0o755 | (rng.below(2) as u32 * 0o2000) },
        22..=24 => {
            let max = if rng.chance(20) { 3000 } else { 40 };
            let len = 1 + rng.below(max);
            Op::Symlink { path: fresh(rng), target: (0..len).map(|i| b'a' + (i % 26) as u8).collect() }
        }
        25..=29 => Op::Link { from: file(rng), to: fresh(rng) },
        30..=35 => Op::Unlink { path: any(rng) },
        36..=38 => Op::Rmdir { path: if subdirs.is_empty() { b"missing".to_vec() } else { pick(rng, &subdirs) } },
        39..=46 => {
            let flags = match rng.below(6) {
                0 => libc::RENAME_NOREPLACE,
                1 => libc::RENAME_EXCHANGE,
                _ => 0,
            };
            let to = if rng.chance(40) { any(rng) } else { fresh(rng) };
            Op::Rename { from: any(rng), to, flags }
        }
        47..=69 => {
            let len = match rng.below(4) {
                0 => 1 + rng.below(2000),
                1 => 1 + rng.below(20000),
                2 => 1 + rng.below(300_000),
                _ => 1 + rng.below(if big { 3 << 20 } else { 1 << 20 }),
            };
            let offset = if rng.chance(30) { 0 } else { rng.below(max_off) };
            Op::Write { path: file(rng), offset, len, fill: rng.below(256) as u8 }
        }
        70..=76 => Op::Truncate { path: file(rng), size: if rng.chance(30) { rng.below(3000) } else { rng.below(max_off) } },
        77..=81 => {
            let mode = match rng.below(5) {
                0 => 0,
                1 => libc::FALLOC_FL_KEEP_SIZE,
                2 => libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                3 => libc::FALLOC_FL_ZERO_RANGE,
                _ => libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE,
            };
            Op::Fallocate { path: file(rng), mode, offset: rng.below(max_off), len: 1 + rng.below(1 << 20) }
        }
        82..=85 => Op::Chmod { path: any(rng), mode: rng.below(0o7777) as u32 },
        86..=88 => Op::Chown { path: any(rng), uid: rng.below(3) as u32 * 1000, gid: rng.below(3) as u32 * 100 },
        89..=91 => Op::Utimens { path: any(rng), sec: 1_000_000_000 + rng.below(1 << 30) as i64 },
        92..=97 => {
            let name = format!("user.x{}", rng.below(6)).into_bytes();
            let vlen = if rng.chance(10) { rng.below(3000) } else { rng.below(64) };
            let flags = match rng.below(4) {
                0 => libc::XATTR_CREATE,
                1 => libc::XATTR_REPLACE,
                _ => 0,
            };
            Op::SetXattr { path: any(rng), name, value: vec![b'v'; vlen as usize], flags }
        }
        _ => Op::RemoveXattr { path: any(rng), name: format!("user.x{}", rng.below(6)).into_bytes() },
    }
}

/// What we compare of one path (times excepted: the two sides stamp their own).
#[derive(Debug, PartialEq, Eq)]
struct Shape {
    kind: u32,
    mode: u32,
    uid: u32,
    gid: u32,
    size: u64,
    nlink: u64,
    rdev: u64,
    content: Option<Vec<u8>>,
    target: Option<Vec<u8>>,
    xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
    /// Explicit times from utimens (sec >= 1e9 and < 2.2e9 are ours), else None.
    mtime: Option<(i64, i64)>,
}

fn xattrs_of(p: &Path) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let mut out = BTreeMap::new();
    let c = cpath(p);
    let mut buf = vec![0u8; 65536];
    let n = unsafe { libc::llistxattr(c.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if n <= 0 {
        return out;
    }
    for name in buf[..n as usize].split(|&b| b == 0).filter(|n| !n.is_empty()) {
        if !name.starts_with(b"user.") {
            continue;
        }
        let cn = CString::new(name.to_vec()).unwrap();
        let mut val = vec![0u8; 65536];
        let m = unsafe { libc::lgetxattr(c.as_ptr(), cn.as_ptr(), val.as_mut_ptr().cast(), val.len()) };
        if m >= 0 {
            val.truncate(m as usize);
            out.insert(name.to_vec(), val);
        }
    }
    out
}

fn shapes(root: &Path) -> BTreeMap<Vec<u8>, Shape> {
    let (dirs, others) = walk(root);
    let mut out = BTreeMap::new();
    for rel in dirs.iter().chain(others.iter()) {
        let p = root.join(std::ffi::OsStr::from_bytes(rel));
        let m = std::fs::symlink_metadata(&p).unwrap();
        let kind = m.mode() & 0o170000;
        let is_dir = kind == 0o040000;
        let mt = (m.mtime(), m.mtime_nsec());
        out.insert(
            rel.clone(),
            Shape {
                kind,
                mode: m.mode(),
                uid: m.uid(),
                gid: m.gid(),
                // Directory sizes and link counts follow each filesystem's own rules.
                size: if is_dir { 0 } else { m.size() },
                nlink: if is_dir { 1 } else { m.nlink() },
                rdev: m.rdev(),
                content: m.is_file().then(|| std::fs::read(&p).unwrap()),
                target: m.file_type().is_symlink().then(|| std::fs::read_link(&p).unwrap().as_os_str().as_bytes().to_vec()),
                xattrs: xattrs_of(&p),
                mtime: (mt.1 == 7 && !is_dir).then_some(mt),
            },
        );
    }
    out
}

/// Hard-link groups: sets of paths sharing an inode.
fn link_groups(root: &Path) -> Vec<Vec<Vec<u8>>> {
    let (_, others) = walk(root);
    let mut by_ino: BTreeMap<u64, Vec<Vec<u8>>> = BTreeMap::new();
    for rel in others {
        let m = std::fs::symlink_metadata(root.join(std::ffi::OsStr::from_bytes(&rel))).unwrap();
        by_ino.entry(m.ino()).or_default().push(rel);
    }
    let mut g: Vec<_> = by_ino.into_values().filter(|v| v.len() > 1).collect();
    g.sort();
    g
}

fn compare_trees(reference: &Path, other: &Path, what: &str) {
    let a = shapes(reference);
    let b = shapes(other);
    let mut diffs = Vec::new();
    for (p, s) in &a {
        match b.get(p) {
            None => diffs.push(format!("{}: missing on {what}", String::from_utf8_lossy(p))),
            Some(t) if t != s => {
                let mut d = format!("{}: differs on {what}:", String::from_utf8_lossy(p));
                macro_rules! f { ($($n:ident),*) => { $( if s.$n != t.$n { d += &format!(" {}: ref={:?} {what}={:?};", stringify!($n), s.$n, t.$n); } )* } }
                f!(kind, mode, uid, gid, size, nlink, rdev, target, xattrs, mtime);
                if s.content != t.content {
                    let first = s.content.as_ref().zip(t.content.as_ref()).and_then(|(x, y)| x.iter().zip(y.iter()).position(|(a, b)| a != b));
                    d += &format!(" content differs (first at {first:?})");
                }
                diffs.push(d);
            }
            _ => {}
        }
    }
    for p in b.keys() {
        if !a.contains_key(p) {
            diffs.push(format!("{}: extra on {what}", String::from_utf8_lossy(p)));
        }
    }
    if link_groups(reference) != link_groups(other) {
        diffs.push(format!("hard-link groups differ on {what}"));
    }
    assert!(diffs.is_empty(), "{} differences:\n{}", diffs.len(), diffs.iter().take(30).cloned().collect::<Vec<_>>().join("\n"));
}

/// Walks the tree through oleo's reader and checks it against the reference.
fn compare_oleo(fs: &Filesystem, reference: &Path) {
    let want = shapes(reference);
    let mut seen = 0;
    for (rel, s) in &want {
        let id = resolve(fs, rel).unwrap_or_else(|e| panic!("oleo cannot find {}: errno {e}", String::from_utf8_lossy(rel)));
        let a = fs.getattr(id).unwrap();
        assert_eq!(a.mode, s.mode, "{} mode", String::from_utf8_lossy(rel));
        if s.kind != 0o040000 {
            assert_eq!(a.size, s.size, "{} size", String::from_utf8_lossy(rel));
            assert_eq!(u64::from(a.nlink), s.nlink, "{} nlink", String::from_utf8_lossy(rel));
        }
        if let Some(c) = &s.content {
            let got = if c.is_empty() { Vec::new() } else { fs.read(id, 0, c.len() as u32 + 10).unwrap() };
            assert!(got == *c, "{} content differs through oleo", String::from_utf8_lossy(rel));
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
}

fn run_case(case: &Case, seed: u64) {
    let scratch = Scratch::new(&format!("{}-{seed}", case.name));
    let image = scratch.image();
    make_image(&image, case.maker, 1 << 30);
    let mut rng = Rng::new(seed);
    let mut fs = Filesystem::open_rw(&image, OpenOptions::default()).expect("open_rw");
    let reference = scratch.reference();
    let mut agreed = 0usize;
    let mut failed = 0usize;
    for i in 0..case.ops {
        let op = random_op(&mut rng, &reference, case.big);
        let want = apply_reference(&reference, &op);
        let got = apply_oleo(&mut fs, &op);
        assert_eq!(got, want, "seed {seed} op {i}: {op:?}: oleo {got:?} vs reference {want:?}");
        if want.is_ok() {
            agreed += 1;
        } else {
            failed += 1;
        }
        if rng.chance(3) {
            fs.sync().expect("sync");
        }
        if rng.chance(1) {
            fs.sync().expect("sync");
            drop(fs);
            fs = Filesystem::open_rw(&image, OpenOptions::default()).expect("reopen");
        }
    }
    fs.sync().expect("final sync");
    compare_oleo(&fs, &reference);
    drop(fs);
    eprintln!("{} seed {seed}: {agreed} operations done, {failed} refused alike", case.name);
    btrfs_check(&image, &format!("{} seed {seed}", case.name));
    let fs = Filesystem::open(&image, OpenOptions::default()).expect("reopen read-only");
    compare_oleo(&fs, &reference);
    drop(fs);
    let st = Command::new("mount").args(["-o", "loop"]).arg(&image).arg(scratch.mnt()).status().unwrap();
    assert!(st.success(), "kernel mount");
    let r = std::panic::catch_unwind(|| compare_trees(&reference, &scratch.mnt(), "kernel"));
    // The kernel writes too: a file of its own, then check again.
    std::fs::write(scratch.mnt().join("kernel-wrote-this"), b"hello from the kernel").unwrap();
    let st = Command::new("umount").arg(scratch.mnt()).status().unwrap();
    assert!(st.success(), "umount");
    if let Err(e) = r {
        std::panic::resume_unwind(e);
    }
    btrfs_check(&image, &format!("{} seed {seed} after the kernel wrote", case.name));
    let fs = Filesystem::open(&image, OpenOptions::default()).expect("reopen after kernel");
    let id = fs.lookup(fs.root(), b"kernel-wrote-this").expect("kernel's file");
    assert_eq!(fs.read(id, 0, 100).unwrap(), b"hello from the kernel");
}

fn run(case: Case) {
    if missing_env() {
        return;
    }
    for seed in seeds(case.name) {
        eprintln!("{}: seed {seed}", case.name);
        run_case(&case, seed);
    }
}

#[test]
fn progs_default() {
    run(Case { name: "progs-default", maker: Maker::Progs(&[]), ops: 400, big: false });
}

#[test]
fn progs_4k_nodes_no_holes_off() {
    run(Case { name: "progs-4k-holes", maker: Maker::Progs(&["--nodesize", "4096", "-O", "^no-holes"]), ops: 400, big: false });
}

#[test]
fn oleo_mkfs_sha256() {
    run(Case { name: "oleo-sha256", maker: Maker::Oleo { nodesize: 16384, csum: "sha256", no_holes: true }, ops: 300, big: true });
}

#[test]
fn oleo_mkfs_xxhash_holes() {
    run(Case { name: "oleo-xxhash-holes", maker: Maker::Oleo { nodesize: 4096, csum: "xxhash", no_holes: false }, ops: 300, big: false });
}

#[test]
fn progs_blake2_big_writes() {
    run(Case { name: "progs-blake2", maker: Maker::Progs(&["--csum", "blake2"]), ops: 200, big: true });
}
