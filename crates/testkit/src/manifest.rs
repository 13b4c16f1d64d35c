//! A manifest is everything a user can observe of a mounted tree through stat, readlink,
//! read, listxattr/getxattr and readdir. Capturing one through the kernel's btrfs and one
//! through oleo and diffing them is how we prove oleo shows exactly what the kernel shows.
//!
//! The diff is strict: every field must match, including nanoseconds, st_blocks and st_nlink.
//! The only relaxations are the ones in [`CompareRules`], each of which exists because the
//! kernel's answer is an artifact of its VFS plumbing that a FUSE filesystem cannot (or
//! should not) reproduce, and each is documented there.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::{CStr, CString, OsStr};
use std::fmt::{self, Write as _};
use std::fs::File;
use std::io::{self, Read};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// File type, from st_mode (or d_type for directory listings).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum Kind {
    File,
    Dir,
    Symlink,
    Fifo,
    Socket,
    CharDev,
    BlockDev,
    /// An unexpected type; for readdir, the raw d_type (0 = DT_UNKNOWN).
    #[default]
    Unknown,
    Other(u32),
}

impl Kind {
    pub fn from_mode(mode: u32) -> Kind {
        match mode & libc::S_IFMT {
            libc::S_IFREG => Kind::File,
            libc::S_IFDIR => Kind::Dir,
            libc::S_IFLNK => Kind::Symlink,
            libc::S_IFIFO => Kind::Fifo,
            libc::S_IFSOCK => Kind::Socket,
            libc::S_IFCHR => Kind::CharDev,
            libc::S_IFBLK => Kind::BlockDev,
            other => Kind::Other(other),
        }
    }

    pub fn from_d_type(t: u8) -> Kind {
        match t {
            libc::DT_REG => Kind::File,
            libc::DT_DIR => Kind::Dir,
            libc::DT_LNK => Kind::Symlink,
            libc::DT_FIFO => Kind::Fifo,
            libc::DT_SOCK => Kind::Socket,
            libc::DT_CHR => Kind::CharDev,
            libc::DT_BLK => Kind::BlockDev,
            libc::DT_UNKNOWN => Kind::Unknown,
            other => Kind::Other(other as u32),
        }
    }
}

/// A timestamp as stat reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Time {
    pub sec: i64,
    pub nsec: i64,
}

impl fmt::Display for Time {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{:09}", self.sec, self.nsec)
    }
}

/// One name in a directory listing, as readdir returned it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DirEntry {
    pub name: Vec<u8>,
    /// d_ino. The kernel reports the subvolume id here for an entry that is a subvolume
    /// (while stat of it says 256): a real difference between readdir and stat.
    pub ino: u64,
    /// d_type, raw (DT_UNKNOWN stays `Kind::Unknown`, it is not resolved with lstat).
    pub kind: Kind,
}

/// Everything observed about one path.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Entry {
    pub kind: Kind,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub nlink: u64,
    pub blocks: u64,
    /// st_blksize (the kernel reports the sector size).
    pub blksize: u64,
    pub rdev: u64,
    pub atime: Time,
    pub mtime: Time,
    pub ctime: Time,
    pub ino: u64,
    pub dev: u64,
    /// sha256 of the contents (regular files that could be read).
    pub sha256: Option<[u8; 32]>,
    /// Data ranges `[start, end)` per SEEK_DATA/SEEK_HOLE (regular files); see
    /// `CompareRules::compare_data_map`.
    pub data_map: Option<Vec<(u64, u64)>>,
    /// Why `data_map` could not be taken (kept apart from `errors`, which are always compared).
    pub data_map_error: Option<String>,
    /// readlink (symlinks).
    pub target: Option<Vec<u8>>,
    /// Every xattr name and value (llistxattr / lgetxattr).
    pub xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
    /// The readdir listing without `.` and `..`, sorted by name, duplicates kept (directories).
    pub listing: Option<Vec<DirEntry>>,
    /// Errors met while observing this path (e.g. `read: EIO`): compared like any field.
    pub errors: Vec<String>,
}

/// All paths under a root, keyed by their path relative to it as raw bytes (root = empty).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Manifest {
    pub entries: BTreeMap<Vec<u8>, Entry>,
    /// statvfs of the root (what `df` shows).
    pub statfs: Option<StatFs>,
}

/// The statvfs fields of a filesystem that describe it (not the mount flags).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StatFs {
    pub bsize: u64,
    pub frsize: u64,
    pub blocks: u64,
    pub bfree: u64,
    pub bavail: u64,
    pub files: u64,
    pub ffree: u64,
    pub namemax: u64,
}

impl StatFs {
    fn of(path: &Path) -> io::Result<StatFs> {
        let c = cpath(path)?;
        // SAFETY: valid C string and an out-parameter of the right type.
        let mut v: libc::statvfs = unsafe { std::mem::zeroed() };
        if unsafe { libc::statvfs(c.as_ptr(), &mut v) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(StatFs {
            bsize: v.f_bsize as u64,
            frsize: v.f_frsize as u64,
            blocks: v.f_blocks as u64,
            bfree: v.f_bfree as u64,
            bavail: v.f_bavail as u64,
            files: v.f_files as u64,
            ffree: v.f_ffree as u64,
            namemax: v.f_namemax as u64,
        })
    }
}

/// How a diff line names a path: root is `.`, bytes that are not printable UTF-8 are `\xNN`.
pub fn display_path(p: &[u8]) -> String {
    if p.is_empty() {
        ".".to_string()
    } else {
        escape_bytes(p)
    }
}

/// Printable UTF-8 stays as is; control characters, backslashes, quotes and invalid UTF-8
/// become escapes, so every diff line is one readable line.
pub fn escape_bytes(b: &[u8]) -> String {
    let mut s = String::with_capacity(b.len());
    for chunk in b.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '\\' => s.push_str("\\\\"),
                '"' => s.push_str("\\\""),
                c if c.is_control() => {
                    let mut buf = [0u8; 4];
                    for byte in c.encode_utf8(&mut buf).bytes() {
                        let _ = write!(s, "\\x{byte:02x}");
                    }
                }
                c => s.push(c),
            }
        }
        for byte in chunk.invalid() {
            let _ = write!(s, "\\x{byte:02x}");
        }
    }
    s
}

fn join(root: &Path, rel: &[u8]) -> PathBuf {
    if rel.is_empty() {
        root.to_path_buf()
    } else {
        root.join(OsStr::from_bytes(rel))
    }
}

fn cpath(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

fn errno_name(e: &io::Error) -> String {
    match e.raw_os_error() {
        Some(n) => {
            // strerrorname_np is glibc-only; a short table covers what filesystems return.
            let name = match n {
                libc::EIO => "EIO",
                libc::ENOENT => "ENOENT",
                libc::EACCES => "EACCES",
                libc::EPERM => "EPERM",
                libc::ENOTSUP => "EOPNOTSUPP",
                libc::ENODATA => "ENODATA",
                libc::ENOTCONN => "ENOTCONN",
                libc::EUCLEAN => "EUCLEAN",
                libc::ENOSYS => "ENOSYS",
                libc::EINVAL => "EINVAL",
                libc::ENOTDIR => "ENOTDIR",
                libc::ERANGE => "ERANGE",
                libc::E2BIG => "E2BIG",
                _ => return format!("errno {n}"),
            };
            name.to_string()
        }
        None => e.to_string(),
    }
}

/// sha256 of what is left to read of `f`.
pub fn hash_file(f: &mut File) -> io::Result<[u8; 32]> {
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = match f.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        h.update(&buf[..n]);
    }
    Ok(h.finalize().into())
}

/// The data ranges of a file as lseek(SEEK_DATA / SEEK_HOLE) reports them.
fn data_map(f: &File) -> io::Result<Vec<(u64, u64)>> {
    use std::os::fd::AsRawFd;
    let fd = f.as_raw_fd();
    let mut map = Vec::new();
    let mut pos: libc::off_t = 0;
    loop {
        // SAFETY: valid fd.
        let data = unsafe { libc::lseek(fd, pos, libc::SEEK_DATA) };
        if data < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::ENXIO) {
                break; // no data at or after pos
            }
            return Err(e);
        }
        // SAFETY: valid fd.
        let hole = unsafe { libc::lseek(fd, data, libc::SEEK_HOLE) };
        if hole < 0 {
            return Err(io::Error::last_os_error());
        }
        map.push((data as u64, hole as u64));
        if hole <= data {
            break; // cannot happen, but never loop forever on a confused filesystem
        }
        pos = hole;
    }
    // SAFETY: valid fd; back to the start for reading.
    if unsafe { libc::lseek(fd, 0, libc::SEEK_SET) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(map)
}

/// Calls a listxattr/getxattr-style function, growing the buffer until it fits.
fn sized_call(mut f: impl FnMut(*mut u8, usize) -> isize) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; 256];
    loop {
        let n = f(buf.as_mut_ptr(), buf.len());
        if n >= 0 {
            buf.truncate(n as usize);
            return Ok(buf);
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::ERANGE) {
            return Err(e);
        }
        // Ask for the size, then retry (the value may change in between: loop).
        let need = f(std::ptr::null_mut(), 0);
        if need < 0 {
            return Err(io::Error::last_os_error());
        }
        buf.resize((need as usize).max(buf.len() * 2), 0);
    }
}

fn read_xattrs(path: &Path) -> io::Result<BTreeMap<Vec<u8>, Vec<u8>>> {
    let c = cpath(path)?;
    // SAFETY: c is a valid C string; the buffer pointer/length pair is valid (or null/0).
    let names = sized_call(|p, n| unsafe { libc::llistxattr(c.as_ptr(), p.cast(), n) })?;
    let mut out = BTreeMap::new();
    for name in names.split(|b| *b == 0).filter(|n| !n.is_empty()) {
        let cname = CString::new(name).expect("split on NUL");
        // SAFETY: as above.
        let value =
            sized_call(|p, n| unsafe { libc::lgetxattr(c.as_ptr(), cname.as_ptr(), p.cast(), n) })?;
        out.insert(name.to_vec(), value);
    }
    Ok(out)
}

/// readdir through libc rather than std, to see the raw d_type (std hides DT_UNKNOWN by
/// calling lstat) and the raw d_ino.
fn read_dir_raw(path: &Path) -> io::Result<Vec<DirEntry>> {
    let c = cpath(path)?;
    // SAFETY: valid C string.
    let dir = unsafe { libc::opendir(c.as_ptr()) };
    if dir.is_null() {
        return Err(io::Error::last_os_error());
    }
    let mut v = Vec::new();
    let result = loop {
        // SAFETY: readdir64 reports errors only through errno, so clear it first.
        unsafe { *libc::__errno_location() = 0 };
        // SAFETY: dir is a valid DIR* until closedir below.
        let ent = unsafe { libc::readdir64(dir) };
        if ent.is_null() {
            let e = io::Error::last_os_error();
            break if e.raw_os_error().unwrap_or(0) == 0 {
                Ok(())
            } else {
                Err(e)
            };
        }
        // SAFETY: a non-null dirent64 from readdir64 is valid until the next call.
        let (name, ino, t) = unsafe {
            let ent = &*ent;
            (
                CStr::from_ptr(ent.d_name.as_ptr()).to_bytes().to_vec(),
                ent.d_ino,
                ent.d_type,
            )
        };
        if name == b"." || name == b".." {
            continue;
        }
        v.push(DirEntry {
            name,
            ino,
            kind: Kind::from_d_type(t),
        });
    };
    // SAFETY: dir came from opendir and is closed once.
    unsafe { libc::closedir(dir) };
    result?;
    v.sort();
    Ok(v)
}

impl Entry {
    fn observe(path: &Path) -> io::Result<Entry> {
        let md = std::fs::symlink_metadata(path)?;
        let mut e = Entry {
            kind: Kind::from_mode(md.mode()),
            mode: md.mode(),
            uid: md.uid(),
            gid: md.gid(),
            size: md.size(),
            nlink: md.nlink(),
            blocks: md.blocks(),
            blksize: md.blksize(),
            rdev: md.rdev(),
            atime: Time {
                sec: md.atime(),
                nsec: md.atime_nsec(),
            },
            mtime: Time {
                sec: md.mtime(),
                nsec: md.mtime_nsec(),
            },
            ctime: Time {
                sec: md.ctime(),
                nsec: md.ctime_nsec(),
            },
            ino: md.ino(),
            dev: md.dev(),
            ..Entry::default()
        };
        match e.kind {
            Kind::File => match File::open(path) {
                Ok(mut f) => {
                    match data_map(&f) {
                        Ok(m) => e.data_map = Some(m),
                        Err(err) => e.data_map_error = Some(errno_name(&err)),
                    }
                    match hash_file(&mut f) {
                        Ok(h) => e.sha256 = Some(h),
                        Err(err) => e.errors.push(format!("read: {}", errno_name(&err))),
                    }
                }
                Err(err) => e.errors.push(format!("open: {}", errno_name(&err))),
            },
            Kind::Symlink => match std::fs::read_link(path) {
                Ok(t) => e.target = Some(t.into_os_string().into_vec()),
                Err(err) => e.errors.push(format!("readlink: {}", errno_name(&err))),
            },
            Kind::Dir => match read_dir_raw(path) {
                Ok(l) => e.listing = Some(l),
                Err(err) => e.errors.push(format!("readdir: {}", errno_name(&err))),
            },
            _ => {}
        }
        match read_xattrs(path) {
            Ok(x) => e.xattrs = x,
            // No xattr support at all reads as "no xattrs", as it does for a user.
            Err(err) if err.raw_os_error() == Some(libc::ENOTSUP) => {}
            Err(err) => e.errors.push(format!("xattrs: {}", errno_name(&err))),
        }
        Ok(e)
    }
}

impl Manifest {
    /// Each path with every path naming the same inode (hard links), itself included.
    pub fn link_groups(&self) -> BTreeMap<&Vec<u8>, std::collections::BTreeSet<&Vec<u8>>> {
        let mut by_inode: BTreeMap<(u64, u64), std::collections::BTreeSet<&Vec<u8>>> =
            BTreeMap::new();
        for (p, e) in &self.entries {
            by_inode.entry((e.dev, e.ino)).or_default().insert(p);
        }
        self.entries
            .iter()
            .map(|(p, e)| (p, by_inode[&(e.dev, e.ino)].clone()))
            .collect()
    }

    /// What a tree received from a send stream of `self` differs in, a line per path:
    /// everything a stream carries (type, mode, owner, size, rdev, link count and hard-link
    /// groups, times but ctime, content, symlink target, xattrs); inode numbers, ctime and
    /// block counts are the receiver's own.
    pub fn sent_differences(&self, got: &Manifest) -> Vec<String> {
        fn sent_part(e: &Entry) -> String {
            let xattrs: Vec<String> = e
                .xattrs
                .iter()
                .map(|(k, v)| format!("{}={}", k.escape_ascii(), v.escape_ascii()))
                .collect();
            format!(
                "{:?} mode {:o} owner {}:{} size {} rdev {:#x} nlink {} mtime {} atime {} \
                 sha {:?} target {:?} xattrs {xattrs:?} errors {:?}",
                e.kind,
                e.mode,
                e.uid,
                e.gid,
                e.size,
                e.rdev,
                e.nlink,
                e.mtime,
                e.atime,
                e.sha256,
                e.target.as_ref().map(|t| t.escape_ascii().to_string()),
                e.errors
            )
        }
        let (wl, gl) = (self.link_groups(), got.link_groups());
        let paths: std::collections::BTreeSet<&Vec<u8>> =
            self.entries.keys().chain(got.entries.keys()).collect();
        let mut out = Vec::new();
        for p in paths {
            let path = display_path(p);
            let (Some(w), Some(g)) = (self.entries.get(p), got.entries.get(p)) else {
                let side = if self.entries.contains_key(p) {
                    "sent"
                } else {
                    "received"
                };
                out.push(format!("{path}: only in the {side} tree"));
                continue;
            };
            let (ws, gs) = (sent_part(w), sent_part(g));
            if ws != gs {
                out.push(format!("{path}:\n  sent:     {ws}\n  received: {gs}"));
            }
            if wl[p] != gl[p] {
                out.push(format!(
                    "{path}: hard links {:?} sent, {:?} received",
                    wl[p].iter().map(|x| display_path(x)).collect::<Vec<_>>(),
                    gl[p].iter().map(|x| display_path(x)).collect::<Vec<_>>()
                ));
            }
        }
        out
    }

    /// Walks everything under `root` (which is included, as path ""). Symlinks are not
    /// followed; subvolumes, snapshots and their placeholder directories are descended into
    /// like any directory. Problems with single paths are recorded in their entries (so a
    /// broken oleo produces diff lines, not an aborted capture); only an unreadable root fails.
    pub fn capture(root: &Path) -> io::Result<Manifest> {
        let mut entries = BTreeMap::new();
        let root_entry = Entry::observe(root)?;
        let mut stack: Vec<(Vec<u8>, Entry)> = vec![(Vec::new(), root_entry)];
        while let Some((rel, entry)) = stack.pop() {
            if let Some(listing) = &entry.listing {
                let mut last: Option<&[u8]> = None;
                for d in listing {
                    if last == Some(d.name.as_slice()) {
                        continue; // a duplicated name is reported by the listing diff
                    }
                    last = Some(&d.name);
                    let mut child = rel.clone();
                    if !child.is_empty() {
                        child.push(b'/');
                    }
                    child.extend_from_slice(&d.name);
                    let ce = Entry::observe(&join(root, &child)).unwrap_or_else(|err| Entry {
                        errors: vec![format!("lstat: {}", errno_name(&err))],
                        ..Entry::default()
                    });
                    stack.push((child, ce));
                }
            }
            entries.insert(rel, entry);
        }
        Ok(Manifest {
            entries,
            statfs: StatFs::of(root).ok(),
        })
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn get(&self, path: &[u8]) -> Option<&Entry> {
        self.entries.get(path)
    }

    /// Every difference between `kernel` (the reference) and `other` (usually oleo), one
    /// readable line each, in path order; empty means identical under `rules`.
    pub fn diff(kernel: &Manifest, other: &Manifest, rules: &CompareRules) -> Vec<String> {
        diff_manifests(kernel, other, rules)
    }

    /// One line per path, for eyeballing a tree or attaching to a failure.
    pub fn dump(&self) -> String {
        let mut s = String::new();
        for (p, e) in &self.entries {
            let _ = writeln!(s, "{}", EntryLine(p, e));
        }
        s
    }
}

struct EntryLine<'a>(&'a [u8], &'a Entry);

impl fmt::Display for EntryLine<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (p, e) = (self.0, self.1);
        write!(
            f,
            "{} {:?} mode={:o} uid={} gid={} size={} nlink={} blocks={} blksize={} ino={} dev={} rdev={} atime={} mtime={} ctime={}",
            display_path(p), e.kind, e.mode, e.uid, e.gid, e.size, e.nlink, e.blocks, e.blksize, e.ino, e.dev,
            e.rdev, e.atime, e.mtime, e.ctime
        )?;
        if let Some(h) = &e.sha256 {
            write!(f, " sha256={}", hex(&h[..8]))?;
        }
        if let Some(t) = &e.target {
            write!(f, " -> \"{}\"", escape_bytes(t))?;
        }
        for (k, v) in &e.xattrs {
            write!(f, " xattr[{}]={}B", escape_bytes(k), v.len())?;
        }
        if let Some(l) = &e.listing {
            write!(f, " entries={}", l.len())?;
        }
        for err in &e.errors {
            write!(f, " error={err}")?;
        }
        Ok(())
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// How the second manifest's inode numbers relate to the kernel's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InodeNumbers {
    /// oleo: one st_dev for the whole FUSE mount, and `st_ino = (subvol_index << bits) |
    /// inode_number` with subvol_index 0 for the mounted subvolume. The low `bits` must equal
    /// the kernel's st_ino; the high bits play the role of the kernel's per-subvolume st_dev.
    Packed { bits: u32 },
    /// Another kernel mount: (st_dev, st_ino) identifies an inode, as on the reference side.
    Kernel,
}

impl InodeNumbers {
    fn low(self, ino: u64) -> u64 {
        match self {
            InodeNumbers::Packed { bits } if bits < 64 => ino & ((1u64 << bits) - 1),
            _ => ino,
        }
    }

    /// What tells subvolumes apart on this side.
    fn subvol(self, e: &Entry) -> u64 {
        match self {
            InodeNumbers::Packed { bits } if bits < 64 => e.ino >> bits,
            _ => e.dev,
        }
    }

    /// What identifies an inode on this side (for hard-link groups).
    fn identity(self, e: &Entry) -> (u64, u64) {
        match self {
            InodeNumbers::Packed { .. } => (0, e.ino),
            InodeNumbers::Kernel => (e.dev, e.ino),
        }
    }
}

/// The relaxations of an otherwise exact comparison. `Default` is kernel vs oleo.
#[derive(Debug, Clone)]
pub struct CompareRules {
    /// How to read the other side's st_ino. Default: `Packed { bits: 48 }` (oleo's scheme).
    pub inode_numbers: InodeNumbers,
    /// Compare st_dev values. Default false: the kernel gives every subvolume its own
    /// anonymous st_dev (and the nested-subvolume placeholder dir the superblock's), numbers
    /// that differ from mount to mount; FUSE has a single st_dev for the whole mount. What
    /// st_dev means is checked instead by `check_subvolume_groups`.
    pub compare_dev: bool,
    /// Paths that share (st_dev, st_ino) on the kernel side must be exactly the paths that
    /// share an inode identity on the other side (hard links; and no two distinct inodes
    /// may collide, e.g. two subvolume roots both 256). Default true.
    pub check_hardlink_groups: bool,
    /// Paths in one subvolume on the kernel side (same st_dev) must be in one subvolume on
    /// the other side (same `st_ino >> 48` for oleo), and vice versa. Default true.
    /// Placeholder directories are exempt (the kernel gives them the superblock's st_dev).
    pub check_subvolume_groups: bool,
    /// st_ino by which the kernel marks the empty placeholder directory it shows where a
    /// snapshot contains a nested subvolume (BTRFS_EMPTY_SUBVOL_DIR_OBJECTID = 2). Its
    /// timestamps are made up at lookup time ("now"), so they are not compared; all else is.
    /// `None` treats such directories like any other.
    pub placeholder_ino: Option<u64>,
    /// Compare atimes. Default true: the kernel side is mounted `ro,noatime` and oleo
    /// read-only, so atimes are the on-disk ones on both sides.
    pub compare_atime: bool,
    /// Compare d_type of readdir entries. Default true.
    pub compare_dirent_type: bool,
    /// Compare d_ino of readdir entries (low bits, as st_ino). Default true. Note the
    /// kernel reports a subvolume entry's d_ino as the subvolume id, not 256.
    pub compare_dirent_ino: bool,
    /// Accept oleo's d_ino for subvolume entries being the entry's st_ino (256, or 2 for a
    /// placeholder) where the kernel reports the subvolume id. Default true: fuser's
    /// readdirplus derives d_ino from the node id, so oleo cannot report the kernel's quirk.
    pub subvolume_dirent_ino_is_st_ino: bool,
    /// Compare the SEEK_DATA/SEEK_HOLE map of regular files (what `cp --sparse`, `tar -S`
    /// and backup tools see). Default true. The kernel's btrfs reports prealloc (unwritten)
    /// extents as holes and rounds to sectors; oleo answers SEEK_DATA/SEEK_HOLE through
    /// FUSE lseek.
    pub compare_data_map: bool,
    /// Compare statvfs of the root (`df`). Default false: the kernel's free-space figures
    /// (f_bfree, f_bavail) come from its in-memory space accounting (global block reserve,
    /// per-profile unallocated space), a formula of their own; turn this on to work on `df`
    /// parity.
    pub compare_statfs: bool,
}

impl Default for CompareRules {
    fn default() -> Self {
        CompareRules {
            inode_numbers: InodeNumbers::Packed { bits: 48 },
            compare_dev: false,
            check_hardlink_groups: true,
            check_subvolume_groups: true,
            placeholder_ino: Some(2),
            compare_atime: true,
            compare_dirent_type: true,
            compare_dirent_ino: true,
            subvolume_dirent_ino_is_st_ino: true,
            compare_data_map: true,
            compare_statfs: false,
        }
    }
}

impl CompareRules {
    /// For comparing two kernel mounts of the same image (e.g. to prove capture is
    /// deterministic): inode identity is (st_dev, st_ino) on both sides, and the data map
    /// and statfs are compared too.
    pub fn kernel_vs_kernel() -> Self {
        CompareRules {
            inode_numbers: InodeNumbers::Kernel,
            subvolume_dirent_ino_is_st_ino: false,
            compare_data_map: true,
            compare_statfs: true,
            ..CompareRules::default()
        }
    }
}

fn bytes_diff(a: &[u8], b: &[u8]) -> String {
    if a.len() <= 48 && b.len() <= 48 {
        return format!(
            "kernel=\"{}\" other=\"{}\"",
            escape_bytes(a),
            escape_bytes(b)
        );
    }
    match a.iter().zip(b).position(|(x, y)| x != y) {
        Some(i) => {
            format!(
            "kernel {} bytes, other {} bytes, first difference at byte {i} ({:#04x} vs {:#04x})",
            a.len(), b.len(), a[i], b[i]
        )
        }
        None => format!(
            "kernel {} bytes, other {} bytes, equal up to the shorter",
            a.len(),
            b.len()
        ),
    }
}

fn diff_manifests(k: &Manifest, o: &Manifest, rules: &CompareRules) -> Vec<String> {
    let mut out = Vec::new();
    if rules.compare_statfs && k.statfs != o.statfs {
        out.push(format!(
            "statfs: kernel={:?} other={:?}",
            k.statfs, o.statfs
        ));
    }
    let is_placeholder = |e: &Entry| e.kind == Kind::Dir && rules.placeholder_ino == Some(e.ino);

    // Walk both key sets in order, so lines come out sorted by path.
    let mut ki = k.entries.iter().peekable();
    let mut oi = o.entries.iter().peekable();
    loop {
        match (ki.peek(), oi.peek()) {
            (None, None) => break,
            (Some((kp, ke)), Some((op, _))) if kp < op => {
                out.push(format!(
                    "{}: only in kernel ({:?})",
                    display_path(kp),
                    ke.kind
                ));
                ki.next();
            }
            (Some((kp, ke)), None) => {
                out.push(format!(
                    "{}: only in kernel ({:?})",
                    display_path(kp),
                    ke.kind
                ));
                ki.next();
            }
            (Some((kp, _)), Some((op, oe))) if op < kp => {
                out.push(format!(
                    "{}: only in other ({:?})",
                    display_path(op),
                    oe.kind
                ));
                oi.next();
            }
            (None, Some((op, oe))) => {
                out.push(format!(
                    "{}: only in other ({:?})",
                    display_path(op),
                    oe.kind
                ));
                oi.next();
            }
            (Some((p, ke)), Some((_, oe))) => {
                diff_entry(p, ke, oe, is_placeholder(ke), rules, &mut out);
                ki.next();
                oi.next();
            }
        }
    }

    // Only paths present on both sides, placeholders excluded, take part in group checks.
    let common: Vec<(&Vec<u8>, &Entry, &Entry)> = k
        .entries
        .iter()
        .filter_map(|(p, ke)| o.entries.get(p).map(|oe| (p, ke, oe)))
        .filter(|(_, ke, _)| !is_placeholder(ke) && ke.kind != Kind::Unknown)
        .collect();
    if rules.check_hardlink_groups {
        group_check(
            "same inode",
            &common,
            |ke| (ke.dev, ke.ino),
            |oe| rules.inode_numbers.identity(oe),
            &mut out,
        );
    }
    if rules.check_subvolume_groups {
        group_check(
            "same subvolume",
            &common,
            |ke| (ke.dev, 0),
            |oe| (rules.inode_numbers.subvol(oe), 0),
            &mut out,
        );
    }
    out
}

/// Checks that two partitions of the same paths are equal. Each path is labelled with the
/// first (smallest) path of its block on each side; the partitions are equal exactly when
/// every path gets the same label on both sides. Each mismatch is reported once (not once per
/// path), so a wholesale error does not produce a line per path.
fn group_check<K, O>(
    what: &str,
    common: &[(&Vec<u8>, &Entry, &Entry)],
    kkey: impl Fn(&Entry) -> K,
    okey: impl Fn(&Entry) -> O,
    out: &mut Vec<String>,
) where
    K: std::hash::Hash + Eq,
    O: std::hash::Hash + Eq,
{
    let mut klabel: HashMap<K, &Vec<u8>> = HashMap::new();
    let mut olabel: HashMap<O, &Vec<u8>> = HashMap::new();
    let mut kmembers: HashMap<&Vec<u8>, Vec<&Vec<u8>>> = HashMap::new();
    let mut omembers: HashMap<&Vec<u8>, Vec<&Vec<u8>>> = HashMap::new();
    let mut labels = Vec::with_capacity(common.len());
    for (p, ke, oe) in common {
        // `common` is in path order, so the first path seen for a key is the smallest.
        let kl = *klabel.entry(kkey(ke)).or_insert(p);
        let ol = *olabel.entry(okey(oe)).or_insert(p);
        kmembers.entry(kl).or_default().push(p);
        omembers.entry(ol).or_default().push(p);
        labels.push((p, kl, ol));
    }
    let mut seen_k: HashSet<&Vec<u8>> = HashSet::new();
    let mut seen_o: HashSet<&Vec<u8>> = HashSet::new();
    let show = |v: &Vec<&Vec<u8>>| {
        let mut s: Vec<String> = v.iter().take(4).map(|p| display_path(p)).collect();
        if v.len() > 4 {
            s.push(format!("... ({} paths)", v.len()));
        }
        format!("{{{}}}", s.join(", "))
    };
    for (p, kl, ol) in labels {
        if kl == ol && kmembers[kl].len() == omembers[ol].len() {
            continue;
        }
        // One line per incident: a split kernel block or a merged other block is reported
        // at its first path only.
        let fresh = !seen_k.contains(kl) && !seen_o.contains(ol);
        seen_k.insert(kl);
        seen_o.insert(ol);
        if !fresh {
            continue;
        }
        out.push(format!(
            "{}: {what} as {} on the kernel side, but as {} on the other side",
            display_path(p),
            show(&kmembers[kl]),
            show(&omembers[ol]),
        ));
    }
}

fn diff_entry(
    p: &[u8],
    k: &Entry,
    o: &Entry,
    placeholder: bool,
    rules: &CompareRules,
    out: &mut Vec<String>,
) {
    let path = display_path(p);
    let mut field = |name: &str, kv: String, ov: String| {
        if kv != ov {
            out.push(format!("{path}: {name}: kernel={kv} other={ov}"));
        }
    };
    field("type", format!("{:?}", k.kind), format!("{:?}", o.kind));
    field("mode", format!("{:o}", k.mode), format!("{:o}", o.mode));
    field("uid", k.uid.to_string(), o.uid.to_string());
    field("gid", k.gid.to_string(), o.gid.to_string());
    field("size", k.size.to_string(), o.size.to_string());
    field("nlink", k.nlink.to_string(), o.nlink.to_string());
    field("blocks", k.blocks.to_string(), o.blocks.to_string());
    field("blksize", k.blksize.to_string(), o.blksize.to_string());
    field("rdev", format!("{:#x}", k.rdev), format!("{:#x}", o.rdev));
    let oino = rules.inode_numbers.low(o.ino);
    if k.ino != oino {
        field(
            "ino",
            k.ino.to_string(),
            format!("{oino} (raw {:#x})", o.ino),
        );
    }
    if rules.compare_dev {
        field("dev", k.dev.to_string(), o.dev.to_string());
    }
    if !placeholder {
        if rules.compare_atime {
            field("atime", k.atime.to_string(), o.atime.to_string());
        }
        field("mtime", k.mtime.to_string(), o.mtime.to_string());
        field("ctime", k.ctime.to_string(), o.ctime.to_string());
    }
    let sha = |h: &Option<[u8; 32]>| h.map_or("none".to_string(), |h| hex(&h));
    field("content sha256", sha(&k.sha256), sha(&o.sha256));
    if rules.compare_data_map && (k.data_map != o.data_map || k.data_map_error != o.data_map_error)
    {
        let show = |m: &Option<Vec<(u64, u64)>>, err: &Option<String>| match (m, err) {
            (_, Some(e)) => format!("error {e}"),
            (Some(m), None) => {
                let mut s: Vec<String> =
                    m.iter().take(8).map(|(a, b)| format!("{a}..{b}")).collect();
                if m.len() > 8 {
                    s.push(format!("... ({} ranges)", m.len()));
                }
                format!("[{}]", s.join(", "))
            }
            (None, None) => "none".into(),
        };
        out.push(format!(
            "{path}: data map: kernel={} other={}",
            show(&k.data_map, &k.data_map_error),
            show(&o.data_map, &o.data_map_error)
        ));
    }
    if k.target != o.target {
        let t = |t: &Option<Vec<u8>>| {
            t.as_deref()
                .map_or("none".to_string(), |t| format!("\"{}\"", escape_bytes(t)))
        };
        out.push(format!(
            "{path}: symlink target: kernel={} other={}",
            t(&k.target),
            t(&o.target)
        ));
    }
    if k.errors != o.errors {
        out.push(format!(
            "{path}: errors: kernel={:?} other={:?}",
            k.errors, o.errors
        ));
    }
    diff_xattrs(&path, &k.xattrs, &o.xattrs, out);
    match (&k.listing, &o.listing) {
        (Some(kl), Some(ol)) => diff_listing(&path, kl, ol, rules, out),
        (None, None) => {}
        // A missing listing on one side already shows as a type or error difference.
        _ => {}
    }
}

fn diff_xattrs(
    path: &str,
    k: &BTreeMap<Vec<u8>, Vec<u8>>,
    o: &BTreeMap<Vec<u8>, Vec<u8>>,
    out: &mut Vec<String>,
) {
    for (name, kv) in k {
        match o.get(name) {
            None => out.push(format!(
                "{path}: xattr \"{}\" only in kernel ({} bytes)",
                escape_bytes(name),
                kv.len()
            )),
            Some(ov) if ov != kv => out.push(format!(
                "{path}: xattr \"{}\" value: {}",
                escape_bytes(name),
                bytes_diff(kv, ov)
            )),
            _ => {}
        }
    }
    for (name, ov) in o {
        if !k.contains_key(name) {
            out.push(format!(
                "{path}: xattr \"{}\" only in other ({} bytes)",
                escape_bytes(name),
                ov.len()
            ));
        }
    }
}

fn diff_listing(
    path: &str,
    k: &[DirEntry],
    o: &[DirEntry],
    rules: &CompareRules,
    out: &mut Vec<String>,
) {
    fn group(l: &[DirEntry]) -> BTreeMap<&[u8], Vec<&DirEntry>> {
        let mut m: BTreeMap<&[u8], Vec<&DirEntry>> = BTreeMap::new();
        for d in l {
            m.entry(d.name.as_slice()).or_default().push(d);
        }
        m
    }
    let (km, om) = (group(k), group(o));
    for (name, kd) in &km {
        let n = escape_bytes(name);
        let Some(od) = om.get(name) else {
            out.push(format!("{path}: readdir: \"{n}\" only in kernel"));
            continue;
        };
        if kd.len() != od.len() {
            out.push(format!(
                "{path}: readdir: \"{n}\" listed {} times by the kernel, {} times by other",
                kd.len(),
                od.len()
            ));
        }
        let (kd, od) = (kd[0], od[0]);
        if rules.compare_dirent_type && kd.kind != od.kind {
            out.push(format!(
                "{path}: readdir: \"{n}\" d_type: kernel={:?} other={:?}",
                kd.kind, od.kind
            ));
        }
        let other_low = rules.inode_numbers.low(od.ino);
        // The kernel gives a subvolume entry the subvolume id as d_ino. oleo cannot: fuser's
        // readdirplus uses one number for both the node id and d_ino, so oleo's d_ino is
        // the entry's st_ino (256 for a subvolume root, 2 for a placeholder).
        let subvolume_entry =
            rules.subvolume_dirent_ino_is_st_ino && (other_low == 256 || other_low == 2);
        if rules.compare_dirent_ino && kd.ino != other_low && !subvolume_entry {
            out.push(format!(
                "{path}: readdir: \"{n}\" d_ino: kernel={} other={} (raw {:#x})",
                kd.ino,
                rules.inode_numbers.low(od.ino),
                od.ino
            ));
        }
    }
    for name in om.keys() {
        if !km.contains_key(name) {
            out.push(format!(
                "{path}: readdir: \"{}\" only in other",
                escape_bytes(name)
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(ino: u64, dev: u64) -> Entry {
        Entry {
            kind: Kind::File,
            mode: 0o100644,
            nlink: 1,
            size: 5,
            blocks: 8,
            ino,
            dev,
            mtime: Time {
                sec: 1_700_000_000,
                nsec: 123_456_789,
            },
            sha256: Some([7; 32]),
            ..Entry::default()
        }
    }

    fn dir(ino: u64, dev: u64, names: &[(&str, u64, Kind)]) -> Entry {
        Entry {
            kind: Kind::Dir,
            mode: 0o40755,
            nlink: 1,
            ino,
            dev,
            listing: Some(
                names
                    .iter()
                    .map(|(n, i, k)| DirEntry {
                        name: n.as_bytes().to_vec(),
                        ino: *i,
                        kind: *k,
                    })
                    .collect(),
            ),
            ..Entry::default()
        }
    }

    fn manifest(items: Vec<(&[u8], Entry)>) -> Manifest {
        Manifest {
            entries: items.into_iter().map(|(p, e)| (p.to_vec(), e)).collect(),
            statfs: None,
        }
    }

    /// A kernel-side tree: root (dev 40) with file a, hard link b, and subvolume sv (dev 41)
    /// holding file c.
    fn kernel_tree() -> Manifest {
        let mut a = file(257, 40);
        a.nlink = 2;
        manifest(vec![
            (
                b"",
                dir(
                    256,
                    40,
                    &[
                        ("a", 257, Kind::File),
                        ("b", 257, Kind::File),
                        ("sv", 256, Kind::Dir),
                    ],
                ),
            ),
            (b"a", a.clone()),
            (b"b", a),
            (b"sv", dir(256, 41, &[("c", 257, Kind::File)])),
            (b"sv/c", file(257, 41)),
        ])
    }

    /// The same tree as oleo shows it: one st_dev, subvolume index in the high bits.
    fn oleo_tree() -> Manifest {
        let mut m = kernel_tree();
        let sv = 1u64 << 48;
        for (p, e) in m.entries.iter_mut() {
            e.dev = 99;
            if p.starts_with(b"sv") {
                e.ino |= sv;
            }
        }
        m.entries
            .get_mut(b"".as_slice())
            .unwrap()
            .listing
            .as_mut()
            .unwrap()[2]
            .ino = 256 | sv;
        m.entries
            .get_mut(b"sv".as_slice())
            .unwrap()
            .listing
            .as_mut()
            .unwrap()[0]
            .ino = 257 | sv;
        m
    }

    #[test]
    fn identical_trees_have_no_diff() {
        let k = kernel_tree();
        assert_eq!(
            Manifest::diff(&k, &oleo_tree(), &CompareRules::default()),
            Vec::<String>::new()
        );
        assert_eq!(
            Manifest::diff(&k, &k, &CompareRules::kernel_vs_kernel()),
            Vec::<String>::new()
        );
    }

    #[test]
    fn every_stat_field_is_compared() {
        let k = kernel_tree();
        let mut o = oleo_tree();
        let a = o.entries.get_mut(b"a".as_slice()).unwrap();
        a.mode = 0o100600;
        a.uid = 5;
        a.gid = 6;
        a.size = 6;
        a.blocks = 16;
        a.blksize = 512;
        a.rdev = 1;
        a.mtime.nsec += 1;
        a.atime.sec = 3;
        a.ctime.sec = 4;
        a.sha256 = Some([8; 32]);
        let d = Manifest::diff(&k, &o, &CompareRules::default());
        for f in [
            "mode",
            "uid",
            "gid",
            "size",
            "blocks",
            "blksize",
            "rdev",
            "mtime",
            "atime",
            "ctime",
            "content sha256",
        ] {
            assert!(
                d.iter().any(|l| l.starts_with(&format!("a: {f}:"))),
                "no {f} line in {d:#?}"
            );
        }
        // b is the same inode as a on the kernel side and still is on the oleo side: only
        // a's fields differ, no group line.
        assert!(!d.iter().any(|l| l.contains("same inode")), "{d:#?}");
    }

    #[test]
    fn nlink_and_nanoseconds_are_exact() {
        let k = kernel_tree();
        let mut o = oleo_tree();
        o.entries.get_mut(b"sv/c".as_slice()).unwrap().nlink = 2;
        o.entries.get_mut(b"sv".as_slice()).unwrap().mtime.nsec = 1;
        let d = Manifest::diff(&k, &o, &CompareRules::default());
        assert_eq!(
            d,
            vec![
                "sv: mtime: kernel=0.000000000 other=0.000000001",
                "sv/c: nlink: kernel=1 other=2"
            ]
        );
    }

    #[test]
    fn dev_is_ignored_and_ino_is_masked() {
        let k = kernel_tree();
        let mut o = oleo_tree();
        // Wrong low bits are an error even though the high bits are right.
        o.entries.get_mut(b"sv/c".as_slice()).unwrap().ino = (1 << 48) | 300;
        let d = Manifest::diff(&k, &o, &CompareRules::default());
        assert!(
            d.iter()
                .any(|l| l.starts_with("sv/c: ino: kernel=257 other=300")),
            "{d:#?}"
        );
        let rules = CompareRules {
            compare_dev: true,
            ..CompareRules::default()
        };
        let d = Manifest::diff(&k, &oleo_tree(), &rules);
        assert!(d.iter().any(|l| l.starts_with("a: dev:")), "{d:#?}");
    }

    #[test]
    fn broken_hard_link_group_is_reported_once() {
        let k = kernel_tree();
        let mut o = oleo_tree();
        // oleo shows b as an inode of its own.
        o.entries.get_mut(b"b".as_slice()).unwrap().ino = 258;
        let d = Manifest::diff(&k, &o, &CompareRules::default());
        assert_eq!(
            d,
            vec![
                "b: ino: kernel=257 other=258 (raw 0x102)",
                "a: same inode as {a, b} on the kernel side, but as {a} on the other side",
            ]
        );
    }

    #[test]
    fn colliding_inodes_are_reported() {
        // oleo forgetting the subvolume bits: sv and the root both look like inode 256.
        let k = kernel_tree();
        let mut o = oleo_tree();
        for e in o.entries.values_mut() {
            e.ino &= (1 << 48) - 1;
        }
        for e in o.entries.values_mut() {
            if let Some(l) = &mut e.listing {
                for d in l {
                    d.ino &= (1 << 48) - 1;
                }
            }
        }
        let d = Manifest::diff(&k, &o, &CompareRules::default());
        assert!(
            d.iter()
                .any(|l| l.starts_with(".: same inode as {.} on the kernel side, but as {., sv}")),
            "{d:#?}"
        );
        assert!(d.iter().any(|l| l.contains("same subvolume")), "{d:#?}");
    }

    #[test]
    fn placeholder_times_are_not_compared_but_the_rest_is() {
        let mut k = kernel_tree();
        let mut ph = dir(2, 39, &[]);
        ph.mtime = Time { sec: 5, nsec: 5 };
        k.entries.insert(b"sv/nested".to_vec(), ph.clone());
        let mut o = oleo_tree();
        ph.dev = 99;
        ph.ino = (1 << 48) | 2;
        ph.mtime = Time { sec: 9, nsec: 9 };
        ph.ctime = Time { sec: 9, nsec: 9 };
        o.entries.insert(b"sv/nested".to_vec(), ph.clone());
        assert_eq!(
            Manifest::diff(&k, &o, &CompareRules::default()),
            Vec::<String>::new()
        );
        ph.mode = 0o40700;
        o.entries.insert(b"sv/nested".to_vec(), ph);
        let d = Manifest::diff(&k, &o, &CompareRules::default());
        assert_eq!(d, vec!["sv/nested: mode: kernel=40755 other=40700"]);
    }

    #[test]
    fn missing_and_extra_paths() {
        let k = kernel_tree();
        let mut o = oleo_tree();
        o.entries.remove(b"b".as_slice());
        o.entries.insert(b"zz".to_vec(), file(400, 99));
        let d = Manifest::diff(&k, &o, &CompareRules::default());
        assert!(
            d.contains(&"b: only in kernel (File)".to_string()),
            "{d:#?}"
        );
        assert!(
            d.contains(&"zz: only in other (File)".to_string()),
            "{d:#?}"
        );
    }

    #[test]
    fn readdir_differences() {
        let k = kernel_tree();
        let mut o = oleo_tree();
        let l = o
            .entries
            .get_mut(b"".as_slice())
            .unwrap()
            .listing
            .as_mut()
            .unwrap();
        l[0].kind = Kind::Unknown; // a: DT_UNKNOWN
        l[1].ino = 999; // b: wrong d_ino
        l.push(l[2].clone()); // sv listed twice
        l.push(DirEntry {
            name: b"ghost".to_vec(),
            ino: 1000,
            kind: Kind::File,
        });
        let d = Manifest::diff(&k, &o, &CompareRules::default());
        let want = [
            ".: readdir: \"a\" d_type: kernel=File other=Unknown",
            ".: readdir: \"b\" d_ino: kernel=257 other=999 (raw 0x3e7)",
            ".: readdir: \"sv\" listed 1 times by the kernel, 2 times by other",
            ".: readdir: \"ghost\" only in other",
        ];
        for w in want {
            assert!(d.iter().any(|l| l == w), "missing {w:?} in {d:#?}");
        }
    }

    #[test]
    fn xattr_differences() {
        let mut k = kernel_tree();
        let mut o = oleo_tree();
        let ka = k.entries.get_mut(b"a".as_slice()).unwrap();
        ka.xattrs.insert(b"user.x".to_vec(), b"1".to_vec());
        ka.xattrs.insert(b"user.big".to_vec(), vec![b'q'; 3900]);
        ka.xattrs.insert(b"security.s".to_vec(), vec![]);
        let oa = o.entries.get_mut(b"a".as_slice()).unwrap();
        oa.xattrs.insert(b"user.x".to_vec(), b"2".to_vec());
        let mut big = vec![b'q'; 3900];
        big[3000] = b'r';
        oa.xattrs.insert(b"user.big".to_vec(), big);
        oa.xattrs.insert(b"trusted.t".to_vec(), b"t".to_vec());
        let d = Manifest::diff(&k, &o, &CompareRules::default());
        assert_eq!(
            d,
            vec![
                "a: xattr \"security.s\" only in kernel (0 bytes)",
                "a: xattr \"user.big\" value: kernel 3900 bytes, other 3900 bytes, first difference at byte 3000 (0x71 vs 0x72)",
                "a: xattr \"user.x\" value: kernel=\"1\" other=\"2\"",
                "a: xattr \"trusted.t\" only in other (1 bytes)",
            ]
        );
    }

    #[test]
    fn data_map_is_compared_unless_turned_off() {
        let mut k = kernel_tree();
        let mut o = oleo_tree();
        k.entries.get_mut(b"a".as_slice()).unwrap().data_map = Some(vec![(0, 4096), (8192, 12288)]);
        o.entries.get_mut(b"a".as_slice()).unwrap().data_map = Some(vec![(0, 12288)]);
        assert_eq!(
            Manifest::diff(&k, &o, &CompareRules::default()),
            vec!["a: data map: kernel=[0..4096, 8192..12288] other=[0..12288]"]
        );
        let rules = CompareRules {
            compare_data_map: false,
            ..CompareRules::default()
        };
        assert!(Manifest::diff(&k, &o, &rules).is_empty());
    }

    #[test]
    fn statfs_is_compared_only_when_asked() {
        let mut k = kernel_tree();
        let mut o = oleo_tree();
        k.statfs = Some(StatFs {
            bsize: 4096,
            bfree: 10,
            ..StatFs::default()
        });
        o.statfs = Some(StatFs {
            bsize: 4096,
            bfree: 11,
            ..StatFs::default()
        });
        assert!(Manifest::diff(&k, &o, &CompareRules::default()).is_empty());
        let rules = CompareRules {
            compare_statfs: true,
            ..CompareRules::default()
        };
        let d = Manifest::diff(&k, &o, &rules);
        assert_eq!(d.len(), 1);
        assert!(d[0].starts_with("statfs: "), "{d:?}");
    }

    #[test]
    fn paths_are_escaped() {
        assert_eq!(display_path(b""), ".");
        assert_eq!(display_path(b"bad-\xff\xfe/ok"), "bad-\\xff\\xfe/ok");
        assert_eq!(
            display_path("caf\u{e9}\n\"q\"\\".as_bytes()),
            "caf\u{e9}\\x0a\\\"q\\\"\\\\"
        );
    }

    #[test]
    fn errors_are_compared() {
        let k = kernel_tree();
        let mut o = oleo_tree();
        let a = o.entries.get_mut(b"a".as_slice()).unwrap();
        a.sha256 = None;
        a.errors.push("read: EIO".into());
        let d = Manifest::diff(&k, &o, &CompareRules::default());
        assert!(
            d.iter()
                .any(|l| l == "a: errors: kernel=[] other=[\"read: EIO\"]"),
            "{d:#?}"
        );
    }

    #[test]
    fn capture_of_a_plain_directory() {
        // No root needed: a small tree in /tmp, captured twice, is identical.
        let t = crate::TempDir::new("manifest-unit").unwrap();
        let root = t.subdir("r").unwrap();
        std::fs::write(root.join("f"), b"hello").unwrap();
        std::fs::create_dir(root.join("d")).unwrap();
        std::os::unix::fs::symlink("f", root.join("d/l")).unwrap();
        std::fs::write(root.join(OsStr::from_bytes(b"n\xff")), b"").unwrap();
        let a = Manifest::capture(&root).unwrap();
        let b = Manifest::capture(&root).unwrap();
        assert_eq!(a.len(), 5);
        assert_eq!(
            a.get(b"d/l").unwrap().target.as_deref(),
            Some(b"f".as_slice())
        );
        assert_eq!(a.get(b"f").unwrap().sha256.unwrap()[..2], [0x2c, 0xf2]);
        // The host filesystem may update atimes as capture reads files (relatime), and others
        // write to it meanwhile (statfs).
        let rules = CompareRules {
            compare_atime: false,
            compare_statfs: false,
            ..CompareRules::kernel_vs_kernel()
        };
        assert_eq!(Manifest::diff(&a, &b, &rules), Vec::<String>::new());
        assert!(a.dump().contains("n\\xff File"));
    }
}
