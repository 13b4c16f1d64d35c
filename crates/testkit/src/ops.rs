//! Random POSIX operation sequences for tests that compare a filesystem under test with a
//! reference directory: a seeded generator of operations over the paths that exist, a
//! path-level executor (plain syscalls, so it drives a kernel or FUSE mount and a host
//! directory alike), and a comparison of two trees that ignores what each filesystem
//! decides for itself (times, inode numbers, block counts, directory sizes and link counts).

use std::collections::BTreeMap;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};

pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E3779B97F4A7C15) | 1)
    }
    #[allow(clippy::should_implement_trait)] // a seeded generator, not an iterator
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

// ---------------------------------------------------------------------------------------
// The reference side: plain syscalls on a host directory.

pub fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).expect("no NUL in path")
}

pub fn errno_of<T>(r: std::io::Result<T>) -> Result<T, i32> {
    r.map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))
}

pub fn sys(r: libc::c_int) -> Result<(), i32> {
    if r < 0 {
        Err(std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO))
    } else {
        Ok(())
    }
}

pub fn split(rel: &[u8]) -> (&[u8], &[u8]) {
    match rel.iter().rposition(|&b| b == b'/') {
        Some(i) => (&rel[..i], &rel[i + 1..]),
        None => (b"", rel),
    }
}

#[derive(Debug, Clone)]
pub enum Op {
    Mknod {
        path: Vec<u8>,
        mode: u32,
        rdev: u64,
    },
    Mkdir {
        path: Vec<u8>,
        mode: u32,
    },
    Symlink {
        path: Vec<u8>,
        target: Vec<u8>,
    },
    Link {
        from: Vec<u8>,
        to: Vec<u8>,
    },
    Unlink {
        path: Vec<u8>,
    },
    Rmdir {
        path: Vec<u8>,
    },
    Rename {
        from: Vec<u8>,
        to: Vec<u8>,
        flags: u32,
    },
    Write {
        path: Vec<u8>,
        offset: u64,
        len: u64,
        fill: u8,
    },
    Truncate {
        path: Vec<u8>,
        size: u64,
    },
    Fallocate {
        path: Vec<u8>,
        mode: i32,
        offset: u64,
        len: u64,
    },
    Chmod {
        path: Vec<u8>,
        mode: u32,
    },
    Chown {
        path: Vec<u8>,
        uid: u32,
        gid: u32,
    },
    Utimens {
        path: Vec<u8>,
        sec: i64,
    },
    SetXattr {
        path: Vec<u8>,
        name: Vec<u8>,
        value: Vec<u8>,
        flags: i32,
    },
    RemoveXattr {
        path: Vec<u8>,
        name: Vec<u8>,
    },
}

/// `len` bytes that differ for every (seed, offset): a write that lands at the wrong place,
/// or an old version of a block, never reads like the right one.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Writes `data` at `at` of a file's reference copy, growing it with zeros as a file grows.
pub fn put(model: &mut Vec<u8>, at: u64, data: &[u8]) {
    let end = at as usize + data.len();
    if model.len() < end {
        model.resize(end, 0);
    }
    model[at as usize..end].copy_from_slice(data);
}

pub fn data_for(offset: u64, len: u64, fill: u8) -> Vec<u8> {
    (0..len)
        .map(|i| {
            let at = offset + i;
            if fill >= NOISE_FILL {
                // A quarter of the fills write noise no compressor shrinks.
                let mut z = (at / 8) ^ (u64::from(fill) << 56);
                z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
                (z ^ (z >> 31)).to_le_bytes()[(at % 8) as usize]
            } else {
                fill.wrapping_add((at / 7) as u8)
            }
        })
        .collect()
}

/// `data_for` fills from this one on give incompressible data, the others runs of seven
/// equal bytes.
pub const NOISE_FILL: u8 = 0xc0;

/// The path operations that follow symlinks (truncate, chmod, write, fallocate) are not
/// applied to symlinks: both sides answer ELOOP, as with O_NOFOLLOW.
pub fn follows(op: &Op) -> Option<&[u8]> {
    match op {
        Op::Write { path, .. }
        | Op::Truncate { path, .. }
        | Op::Fallocate { path, .. }
        | Op::Chmod { path, .. } => Some(path),
        _ => None,
    }
}

/// The value of xattr `name` of `path` (not following a symlink), if it has one.
pub fn xattr_value(path: &Path, name: &[u8]) -> Option<Vec<u8>> {
    let n = CString::new(name).ok()?;
    let p = cpath(path);
    let mut buf = vec![0u8; 65536];
    // SAFETY: both strings are NUL-terminated and `buf` is writable for its length.
    let len =
        unsafe { libc::lgetxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    (len >= 0).then(|| {
        buf.truncate(len as usize);
        buf
    })
}

/// Makes xattr `name` of `rel` under `root` what it is under `like` (set to its value, or
/// removed).
pub fn copy_xattr(like: &Path, root: &Path, rel: &[u8], name: &[u8]) -> Result<(), i32> {
    let op = match xattr_value(&like.join(std::ffi::OsStr::from_bytes(rel)), name) {
        Some(value) => Op::SetXattr {
            path: rel.to_vec(),
            name: name.to_vec(),
            value,
            flags: 0,
        },
        None => Op::RemoveXattr {
            path: rel.to_vec(),
            name: name.to_vec(),
        },
    };
    match apply_path(root, &op) {
        Err(libc::ENODATA) if matches!(op, Op::RemoveXattr { .. }) => Ok(()),
        r => r,
    }
}

pub fn apply_path(root: &Path, op: &Op) -> Result<(), i32> {
    let p = |rel: &[u8]| root.join(std::ffi::OsStr::from_bytes(rel));
    if let Some(path) = follows(op) {
        if std::fs::symlink_metadata(p(path)).is_ok_and(|m| m.file_type().is_symlink()) {
            return Err(libc::ELOOP);
        }
    }
    unsafe {
        match op {
            Op::Mknod { path, mode, rdev } => sys(libc::mknod(
                cpath(&p(path)).as_ptr(),
                *mode,
                *rdev as libc::dev_t,
            )),
            Op::Mkdir { path, mode } => sys(libc::mkdir(cpath(&p(path)).as_ptr(), *mode)),
            Op::Symlink { path, target } => {
                let t = CString::new(target.clone()).unwrap();
                sys(libc::symlink(t.as_ptr(), cpath(&p(path)).as_ptr()))
            }
            Op::Link { from, to } => {
                sys(libc::link(cpath(&p(from)).as_ptr(), cpath(&p(to)).as_ptr()))
            }
            Op::Unlink { path } => sys(libc::unlink(cpath(&p(path)).as_ptr())),
            Op::Rmdir { path } => sys(libc::rmdir(cpath(&p(path)).as_ptr())),
            Op::Rename { from, to, flags } => sys(libc::renameat2(
                libc::AT_FDCWD,
                cpath(&p(from)).as_ptr(),
                libc::AT_FDCWD,
                cpath(&p(to)).as_ptr(),
                *flags,
            )),
            Op::Write {
                path,
                offset,
                len,
                fill,
            } => {
                let meta = errno_of(std::fs::symlink_metadata(p(path)))?;
                if !meta.is_file() {
                    return Err(if meta.is_dir() {
                        libc::EISDIR
                    } else {
                        libc::EINVAL
                    });
                }
                let f = errno_of(std::fs::OpenOptions::new().write(true).open(p(path)))?;
                errno_of(f.write_all_at(&data_for(*offset, *len, *fill), *offset))
            }
            Op::Truncate { path, size } => {
                sys(libc::truncate(cpath(&p(path)).as_ptr(), *size as i64))
            }
            Op::Fallocate {
                path,
                mode,
                offset,
                len,
            } => {
                let meta = errno_of(std::fs::symlink_metadata(p(path)))?;
                if !meta.is_file() {
                    return Err(if meta.is_dir() {
                        libc::EISDIR
                    } else {
                        libc::ENODEV
                    });
                }
                let f = errno_of(std::fs::OpenOptions::new().write(true).open(p(path)))?;
                use std::os::fd::AsRawFd;
                sys(libc::fallocate(
                    f.as_raw_fd(),
                    *mode,
                    *offset as i64,
                    *len as i64,
                ))
            }
            Op::Chmod { path, mode } => sys(libc::chmod(cpath(&p(path)).as_ptr(), *mode)),
            Op::Chown { path, uid, gid } => sys(libc::lchown(cpath(&p(path)).as_ptr(), *uid, *gid)),
            Op::Utimens { path, sec } => {
                let ts = [
                    libc::timespec {
                        tv_sec: *sec,
                        tv_nsec: 5,
                    },
                    libc::timespec {
                        tv_sec: *sec + 1,
                        tv_nsec: 7,
                    },
                ];
                sys(libc::utimensat(
                    libc::AT_FDCWD,
                    cpath(&p(path)).as_ptr(),
                    ts.as_ptr(),
                    libc::AT_SYMLINK_NOFOLLOW,
                ))
            }
            Op::SetXattr {
                path,
                name,
                value,
                flags,
            } => {
                let n = CString::new(name.clone()).unwrap();
                sys(libc::lsetxattr(
                    cpath(&p(path)).as_ptr(),
                    n.as_ptr(),
                    value.as_ptr().cast(),
                    value.len(),
                    *flags,
                ))
            }
            Op::RemoveXattr { path, name } => {
                let n = CString::new(name.clone()).unwrap();
                sys(libc::lremovexattr(cpath(&p(path)).as_ptr(), n.as_ptr()))
            }
        }
    }
}

/// Every path under the reference root (relative), split into directories and the rest.
pub fn walk(root: &Path) -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
    let mut dirs = vec![Vec::new()];
    let mut others = Vec::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let mut names: Vec<_> = std::fs::read_dir(root.join(&rel))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
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

pub fn join(dir: &[u8], name: &[u8]) -> Vec<u8> {
    if dir.is_empty() {
        name.to_vec()
    } else {
        [dir, b"/", name].concat()
    }
}

pub fn random_op(rng: &mut Rng, root: &Path, big: bool) -> Op {
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
        let len = if rng.chance(5) {
            200 + rng.below(56)
        } else {
            2 + rng.below(12)
        };
        (0..len)
            .map(|_| b"abcdefghijklmnopqrstuvwxyz0123456789_-."[rng.below(39) as usize])
            .collect()
    };
    let fresh = |rng: &mut Rng| {
        let d = pick(rng, &dirs);
        if rng.chance(20) && !others.is_empty() {
            // Often an existing name, to exercise EEXIST and replacement.
            return pick(rng, &others);
        }
        join(&d, &new_name(rng))
    };
    let file = |rng: &mut Rng| {
        if others.is_empty() {
            fresh(rng)
        } else {
            pick(rng, &others)
        }
    };
    let max_off: u64 = if big { 24 << 20 } else { 1 << 20 };
    match rng.below(100) {
        0..=11 => Op::Mknod {
            path: fresh(rng),
            mode: 0o100000 | 0o644 | (rng.below(2) as u32 * 0o6000),
            rdev: 0,
        },
        12..=14 => {
            let (mode, rdev) = match rng.below(3) {
                0 => (0o010644, 0),
                1 => (
                    0o020600,
                    libc::makedev(1 + rng.below(200) as u32, rng.below(300) as u32),
                ),
                _ => (0o060600, libc::makedev(8, rng.below(64) as u32)),
            };
            Op::Mknod {
                path: fresh(rng),
                mode,
                rdev,
            }
        }
        15..=21 => Op::Mkdir {
            path: fresh(rng),
            mode: 0o755 | (rng.below(2) as u32 * 0o2000),
        },
        22..=24 => {
            let max = if rng.chance(20) { 3000 } else { 40 };
            let len = 1 + rng.below(max);
            Op::Symlink {
                path: fresh(rng),
                target: (0..len).map(|i| b'a' + (i % 26) as u8).collect(),
            }
        }
        25..=29 => Op::Link {
            from: file(rng),
            to: fresh(rng),
        },
        30..=35 => Op::Unlink { path: any(rng) },
        36..=38 => Op::Rmdir {
            path: if subdirs.is_empty() {
                b"missing".to_vec()
            } else {
                pick(rng, &subdirs)
            },
        },
        39..=46 => {
            let flags = match rng.below(6) {
                0 => libc::RENAME_NOREPLACE,
                1 => libc::RENAME_EXCHANGE,
                _ => 0,
            };
            let to = if rng.chance(40) { any(rng) } else { fresh(rng) };
            Op::Rename {
                from: any(rng),
                to,
                flags,
            }
        }
        47..=69 => {
            let len = match rng.below(4) {
                0 => 1 + rng.below(2000),
                1 => 1 + rng.below(20000),
                2 => 1 + rng.below(300_000),
                _ => 1 + rng.below(if big { 3 << 20 } else { 1 << 20 }),
            };
            let offset = if rng.chance(30) {
                0
            } else {
                rng.below(max_off)
            };
            Op::Write {
                path: file(rng),
                offset,
                len,
                fill: rng.below(256) as u8,
            }
        }
        70..=76 => Op::Truncate {
            path: file(rng),
            size: if rng.chance(30) {
                rng.below(3000)
            } else {
                rng.below(max_off)
            },
        },
        77..=81 => {
            let mode = match rng.below(5) {
                0 => 0,
                1 => libc::FALLOC_FL_KEEP_SIZE,
                2 => libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                3 => libc::FALLOC_FL_ZERO_RANGE,
                _ => libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE,
            };
            Op::Fallocate {
                path: file(rng),
                mode,
                offset: rng.below(max_off),
                len: 1 + rng.below(1 << 20),
            }
        }
        82..=85 => Op::Chmod {
            path: any(rng),
            mode: rng.below(0o7777) as u32,
        },
        86..=88 => Op::Chown {
            path: any(rng),
            uid: rng.below(3) as u32 * 1000,
            gid: rng.below(3) as u32 * 100,
        },
        89..=91 => Op::Utimens {
            path: any(rng),
            sec: 1_000_000_000 + rng.below(1 << 30) as i64,
        },
        92..=97 => {
            let name = format!("user.x{}", rng.below(6)).into_bytes();
            // Six names of up to 600 bytes fit the reference's (ext4's) one xattr block.
            let vlen = if rng.chance(10) {
                rng.below(600)
            } else {
                rng.below(64)
            };
            let flags = match rng.below(4) {
                0 => libc::XATTR_CREATE,
                1 => libc::XATTR_REPLACE,
                _ => 0,
            };
            Op::SetXattr {
                path: any(rng),
                name,
                value: vec![b'v'; vlen as usize],
                flags,
            }
        }
        _ => Op::RemoveXattr {
            path: any(rng),
            name: format!("user.x{}", rng.below(6)).into_bytes(),
        },
    }
}

/// What we compare of one path (times excepted: the two sides stamp their own).
#[derive(Debug, PartialEq, Eq)]
pub struct Shape {
    pub kind: u32,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub nlink: u64,
    pub rdev: u64,
    /// sha256 of a regular file's contents: whole contents of every file of two trees do
    /// not fit in memory.
    pub content: Option<[u8; 32]>,
    pub target: Option<Vec<u8>>,
    pub xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
    /// Explicit times from utimens (sec >= 1e9 and < 2.2e9 are ours), else None.
    pub mtime: Option<(i64, i64)>,
}

pub fn xattrs_of(p: &Path) -> BTreeMap<Vec<u8>, Vec<u8>> {
    crate::syscalls::all_xattrs(p)
        .into_iter()
        .filter(|(name, _)| name.starts_with(b"user."))
        .collect()
}

const COMPARE_CHUNK: usize = 64 << 10;

/// Reads from `f` until `buf` is full or the file ends; the bytes read.
fn fill(f: &mut std::fs::File, buf: &mut [u8]) -> usize {
    use std::io::Read;
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..]).unwrap() {
            0 => break,
            k => n += k,
        }
    }
    n
}

/// The `Shape::content` of a file holding `data`.
pub fn content_hash(data: &[u8]) -> [u8; 32] {
    use sha2::Digest;
    sha2::Sha256::digest(data).into()
}

/// The first offset where the files at `a` and `b` differ (one ending early counts), if
/// they do.
pub fn first_difference(a: &Path, b: &Path) -> Option<u64> {
    let (mut fa, mut fb) = (std::fs::File::open(a).ok()?, std::fs::File::open(b).ok()?);
    let (mut ba, mut bb) = (vec![0u8; COMPARE_CHUNK], vec![0u8; COMPARE_CHUNK]);
    let mut at = 0u64;
    loop {
        let (na, nb) = (fill(&mut fa, &mut ba), fill(&mut fb, &mut bb));
        let same = na.min(nb);
        if let Some(i) = ba[..same].iter().zip(&bb[..same]).position(|(x, y)| x != y) {
            return Some(at + i as u64);
        }
        if na != nb {
            return Some(at + same as u64);
        }
        if na < COMPARE_CHUNK {
            return None;
        }
        at += na as u64;
    }
}

pub fn shapes(root: &Path) -> BTreeMap<Vec<u8>, Shape> {
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
                content: m.is_file().then(|| {
                    crate::manifest::hash_file(&mut std::fs::File::open(&p).unwrap()).unwrap()
                }),
                target: m.file_type().is_symlink().then(|| {
                    std::fs::read_link(&p)
                        .unwrap()
                        .as_os_str()
                        .as_bytes()
                        .to_vec()
                }),
                xattrs: xattrs_of(&p),
                mtime: (mt.1 == 7 && !is_dir).then_some(mt),
            },
        );
    }
    out
}

/// Hard-link groups: sets of paths sharing an inode.
pub fn link_groups(root: &Path) -> Vec<Vec<Vec<u8>>> {
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

pub fn compare_trees(reference: &Path, other: &Path, what: &str) {
    let a = shapes(reference);
    let b = shapes(other);
    let mut diffs = Vec::new();
    for (p, s) in &a {
        match b.get(p) {
            None => diffs.push(format!("{}: missing on {what}", String::from_utf8_lossy(p))),
            Some(t) if t != s => {
                let mut d = format!("{}: differs on {what}:", String::from_utf8_lossy(p));
                macro_rules! f { ($($n:ident),*) => { $( if s.$n != t.$n { d += &format!(" {}: ref={} {what}={};", stringify!($n), short(&format!("{:?}", s.$n)), short(&format!("{:?}", t.$n))); } )* } }
                f!(kind, mode, uid, gid, size, nlink, rdev, mtime);
                if s.target != t.target {
                    d += &format!(
                        " target: ref={:?} {what}={:?};",
                        s.target.as_deref().map(String::from_utf8_lossy),
                        t.target.as_deref().map(String::from_utf8_lossy)
                    );
                }
                if s.xattrs != t.xattrs {
                    let show = |x: &BTreeMap<Vec<u8>, Vec<u8>>| {
                        short(
                            &x.iter()
                                .map(|(k, v)| {
                                    format!("{}={}B", String::from_utf8_lossy(k), v.len())
                                })
                                .collect::<Vec<_>>()
                                .join(","),
                        )
                    };
                    d += &format!(
                        " xattrs: ref={} {what}={};",
                        show(&s.xattrs),
                        show(&t.xattrs)
                    );
                }
                if s.content != t.content {
                    let rel = std::ffi::OsStr::from_bytes(p);
                    let first = first_difference(&reference.join(rel), &other.join(rel));
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
    assert_no_differences(&diffs, what);
}

/// Fails with the first 30 of `diffs`, if there are any.
pub fn assert_no_differences(diffs: &[String], context: &str) {
    assert!(
        diffs.is_empty(),
        "{context}: {} differences:\n{}",
        diffs.len(),
        diffs[..diffs.len().min(30)].join("\n")
    );
}

/// A debug string cut to a readable length.
fn short(s: &str) -> String {
    if s.len() <= 160 {
        s.to_string()
    } else {
        let cut = (0..=160)
            .rev()
            .find(|&i| s.is_char_boundary(i))
            .unwrap_or(0);
        format!("{}...", &s[..cut])
    }
}

impl std::fmt::Display for Op {
    /// Paths as text and data by length, for assertion messages.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let p = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        match self {
            Op::Mknod { path, mode, rdev } => {
                write!(f, "mknod {} mode {mode:o} rdev {rdev:#x}", p(path))
            }
            Op::Mkdir { path, mode } => write!(f, "mkdir {} mode {mode:o}", p(path)),
            Op::Symlink { path, target } => {
                write!(f, "symlink {} -> ({} bytes)", p(path), target.len())
            }
            Op::Link { from, to } => write!(f, "link {} {}", p(from), p(to)),
            Op::Unlink { path } => write!(f, "unlink {}", p(path)),
            Op::Rmdir { path } => write!(f, "rmdir {}", p(path)),
            Op::Rename { from, to, flags } => {
                write!(f, "rename {} {} flags {flags}", p(from), p(to))
            }
            Op::Write {
                path, offset, len, ..
            } => write!(f, "write {} at {offset} len {len}", p(path)),
            Op::Truncate { path, size } => write!(f, "truncate {} to {size}", p(path)),
            Op::Fallocate {
                path,
                mode,
                offset,
                len,
            } => write!(
                f,
                "fallocate {} mode {mode:#x} at {offset} len {len}",
                p(path)
            ),
            Op::Chmod { path, mode } => write!(f, "chmod {} {mode:o}", p(path)),
            Op::Chown { path, uid, gid } => write!(f, "chown {} {uid}:{gid}", p(path)),
            Op::Utimens { path, sec } => write!(f, "utimens {} {sec}", p(path)),
            Op::SetXattr {
                path,
                name,
                value,
                flags,
            } => write!(
                f,
                "setxattr {} {} ({} bytes) flags {flags}",
                p(path),
                p(name),
                value.len()
            ),
            Op::RemoveXattr { path, name } => write!(f, "removexattr {} {}", p(path), p(name)),
        }
    }
}

/// The first seed of every randomized test under CI.
pub const CI_SEED_BASE: u64 = 20_261_127;

/// The seeds a randomized test runs: `OLEO_TEST_SEED` replays one; otherwise
/// `OLEO_TEST_SEEDS=N` (default `default_count`) fresh ones, printed so a failure can be
/// replayed. Under CI=true the seeds are fixed (`CI_SEED_BASE`), so that a run judges the
/// change and not the luck of the draw; fresh seeds explore everywhere else.
pub fn seeds(test: &str, default_count: u64) -> Vec<u64> {
    if let Some(s) = std::env::var("OLEO_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        return vec![s];
    }
    let n: u64 = std::env::var("OLEO_TEST_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default_count);
    let base = if crate::is_ci() {
        CI_SEED_BASE
    } else {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64 % 1_000_000_007)
            .unwrap_or(1)
    };
    let v: Vec<u64> = (0..n).map(|i| base + i * 7919).collect();
    eprintln!("{test}: seeds {v:?} (OLEO_TEST_SEED=N replays one)");
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_and_first_difference_find_the_changed_byte() {
        let dir = crate::tempdir::TempDir::new("ops-digests").unwrap();
        let (a, b) = (dir.join("a"), dir.join("b"));
        let data = pattern(3, 200_000);
        std::fs::write(&a, &data).unwrap();
        std::fs::write(&b, &data).unwrap();
        let hash = |p: &Path| crate::manifest::hash_file(&mut std::fs::File::open(p).unwrap());
        assert_eq!(hash(&a).unwrap(), content_hash(&data));
        assert_eq!(first_difference(&a, &b), None);
        let mut changed = data.clone();
        changed[70_001] ^= 1;
        std::fs::write(&b, &changed).unwrap();
        assert_ne!(hash(&b).unwrap(), content_hash(&data));
        assert_eq!(first_difference(&a, &b), Some(70_001));
        std::fs::write(&b, &data[..COMPARE_CHUNK]).unwrap();
        assert_eq!(first_difference(&a, &b), Some(COMPARE_CHUNK as u64));
        std::fs::write(&b, b"").unwrap();
        assert_eq!(hash(&b).unwrap(), content_hash(b""));
        assert_eq!(first_difference(&b, &a), Some(0));
    }
}
