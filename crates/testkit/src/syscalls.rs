//! System calls as a program makes them, for differential tests: a seeded generator of
//! calls over a table of open file descriptors and the paths that exist (open with every
//! flag that changes data or names, O_TMPFILE and linkat, write, pwrite(v), pwritev2
//! flags, truncate, every fallocate mode, copy_file_range, mmap writes with msync, fsync,
//! renames with each flag, links, nodes of every kind, xattrs and POSIX ACLs, chmod, chown,
//! utimensat), an executor that runs one call on one side (a directory on some
//! filesystem, with its own descriptor table), a way to run a call as an unprivileged user
//! (on a thread whose credentials alone are dropped), and captures of whole trees to
//! compare (every xattr, ACLs included), or to compare one filesystem with itself later
//! (inode numbers, ctime and mtime too).

use std::collections::BTreeMap;
use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::ops::{data_for, join, walk, Rng};

/// Descriptors a sequence keeps open at once.
pub const SLOTS: usize = 8;
/// Who the unprivileged steps run as.
pub const USER: (u32, u32) = (1000, 1000);
/// The result of a call both sides refused to make (opening a device node, a fifo or a
/// socket: they would open real devices, or block).
pub const NOT_MADE: i32 = 0;

/// A time for utimensat: a fixed second (nanoseconds 5 for atime, 7 for mtime, so that a
/// tree capture knows it was set), now, or unchanged.
#[derive(Debug, Clone, Copy)]
pub enum Ts {
    At(i64),
    Now,
    Omit,
}

#[derive(Debug, Clone)]
pub enum Call {
    Open {
        path: Vec<u8>,
        flags: i32,
        mode: u32,
        slot: usize,
    },
    OpenTmpfile {
        dir: Vec<u8>,
        flags: i32,
        mode: u32,
        slot: usize,
    },
    /// linkat of an open descriptor: with AT_EMPTY_PATH, or through /proc/self/fd.
    LinkFd {
        slot: usize,
        path: Vec<u8>,
        via_proc: bool,
    },
    Close {
        slot: usize,
    },
    /// write(2) at the descriptor's position.
    Write {
        slot: usize,
        len: u64,
        fill: u8,
    },
    Pwrite {
        slot: usize,
        off: u64,
        len: u64,
        fill: u8,
    },
    /// pwritev (flags None) or pwritev2 (offset -1: the descriptor's position).
    Pwritev {
        slot: usize,
        off: i64,
        lens: Vec<u64>,
        fill: u8,
        flags: Option<i32>,
    },
    Read {
        slot: usize,
        off: u64,
        len: u64,
    },
    Lseek {
        slot: usize,
        off: i64,
        whence: i32,
    },
    Ftruncate {
        slot: usize,
        size: u64,
    },
    Truncate {
        path: Vec<u8>,
        size: u64,
    },
    Fallocate {
        slot: usize,
        mode: i32,
        off: u64,
        len: u64,
    },
    CopyFileRange {
        from: usize,
        to: usize,
        off_in: u64,
        off_out: u64,
        len: u64,
    },
    /// A shared writable mapping of [off, off + len) (cut at the file's end), written,
    /// msync(MS_SYNC), unmapped.
    MmapWrite {
        slot: usize,
        off: u64,
        len: u64,
        fill: u8,
    },
    Fsync {
        slot: usize,
        data_only: bool,
    },
    Fstat {
        slot: usize,
    },
    Fchmod {
        slot: usize,
        mode: u32,
    },
    Futimens {
        slot: usize,
        atime: Ts,
        mtime: Ts,
    },
    Rename {
        from: Vec<u8>,
        to: Vec<u8>,
        flags: u32,
    },
    Link {
        from: Vec<u8>,
        to: Vec<u8>,
    },
    Unlink {
        path: Vec<u8>,
    },
    Mkdir {
        path: Vec<u8>,
        mode: u32,
    },
    Rmdir {
        path: Vec<u8>,
    },
    Symlink {
        path: Vec<u8>,
        target: Vec<u8>,
    },
    Mknod {
        path: Vec<u8>,
        mode: u32,
        rdev: u64,
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
    GetXattr {
        path: Vec<u8>,
        name: Vec<u8>,
    },
    ListXattr {
        path: Vec<u8>,
    },
    Chmod {
        path: Vec<u8>,
        mode: u32,
    },
    Chown {
        path: Vec<u8>,
        uid: u32,
        gid: u32,
        follow: bool,
    },
    Utimens {
        path: Vec<u8>,
        atime: Ts,
        mtime: Ts,
        follow: bool,
    },
    Stat {
        path: Vec<u8>,
        follow: bool,
    },
    /// BTRFS_IOC_SYNC: a transaction commit.
    Sync,
}

/// One step of a sequence: a call, made as root or as [`USER`].
#[derive(Debug, Clone)]
pub struct Step {
    pub call: Call,
    pub as_user: bool,
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

impl std::fmt::Display for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.as_user {
            write!(f, "[as {}:{}] ", USER.0, USER.1)?;
        }
        match &self.call {
            Call::Open {
                path,
                flags,
                mode,
                slot,
            } => write!(
                f,
                "fd{slot} = open({:?}, {}, {mode:o})",
                text(path),
                open_flags(*flags)
            ),
            Call::OpenTmpfile {
                dir,
                flags,
                mode,
                slot,
            } => write!(
                f,
                "fd{slot} = open({:?}, {}, {mode:o})",
                text(dir),
                open_flags(*flags)
            ),
            Call::SetXattr {
                path,
                name,
                value,
                flags,
            } => write!(
                f,
                "setxattr({:?}, {:?}, {} bytes {}, flags {flags})",
                text(path),
                text(name),
                value.len(),
                if name.starts_with(b"system.posix_acl") {
                    acl_text(value)
                } else {
                    String::new()
                }
            ),
            c => {
                // The derived form, with byte strings shown as text.
                let dbg = format!("{c:?}");
                f.write_str(&bytes_as_text(&dbg))
            }
        }
    }
}

/// Rewrites every `[98, 99, ...]` of a derived Debug string as `"bc"` (byte strings as
/// text), and `[]` as `""`.
fn bytes_as_text(dbg: &str) -> String {
    let mut out = String::new();
    let mut rest = dbg;
    while let Some(i) = rest.find('[') {
        out += &rest[..i];
        let tail = &rest[i + 1..];
        let Some(j) = tail.find(']') else {
            out += &rest[i..];
            return out;
        };
        let inner = &tail[..j];
        let named = ["path: ", "from: ", "to: ", "dir: ", "name: ", "target: "]
            .iter()
            .any(|k| out.ends_with(k));
        let bytes: Option<Vec<u8>> = if !named {
            None
        } else if inner.is_empty() {
            Some(Vec::new())
        } else {
            inner.split(", ").map(|n| n.parse::<u8>().ok()).collect()
        };
        match bytes {
            Some(b) => out += &format!("{:?}", text(&b)),
            None => out += &rest[i..i + 2 + j],
        }
        rest = &tail[j + 1..];
    }
    out + rest
}

/// O_* flags by name.
pub fn open_flags(flags: i32) -> String {
    let mut v = vec![match flags & libc::O_ACCMODE {
        libc::O_RDONLY => "O_RDONLY",
        libc::O_WRONLY => "O_WRONLY",
        _ => "O_RDWR",
    }];
    let names = [
        (libc::O_TMPFILE, "O_TMPFILE"),
        (libc::O_CREAT, "O_CREAT"),
        (libc::O_EXCL, "O_EXCL"),
        (libc::O_TRUNC, "O_TRUNC"),
        (libc::O_APPEND, "O_APPEND"),
        (libc::O_DIRECT, "O_DIRECT"),
        (libc::O_SYNC, "O_SYNC"),
        (libc::O_NOFOLLOW, "O_NOFOLLOW"),
        (libc::O_NOATIME, "O_NOATIME"),
    ];
    let mut rest = flags;
    for (bit, name) in names {
        if rest & bit == bit {
            v.push(name);
            rest &= !bit;
        }
    }
    if rest & libc::O_DSYNC != 0 {
        v.push("O_DSYNC");
        rest &= !libc::O_DSYNC;
    }
    if rest & libc::O_DIRECTORY != 0 {
        v.push("O_DIRECTORY");
    }
    v.join("|")
}

// ---------------------------------------------------------------------------------------
// POSIX ACLs in their xattr form (version 2, then (tag u16, perm u16, id u32) entries).

const ACL_USER_OBJ: u16 = 1;
const ACL_USER: u16 = 2;
const ACL_GROUP_OBJ: u16 = 4;
const ACL_GROUP: u16 = 8;
const ACL_MASK: u16 = 0x10;
const ACL_OTHER: u16 = 0x20;

/// A random ACL: mostly valid (named users and groups with a mask, or the minimal three
/// entries), at times invalid (no mask, a duplicate, a bad tag).
pub fn random_acl(rng: &mut Rng) -> Vec<u8> {
    let mut e: Vec<(u16, u16, u32)> = vec![(ACL_USER_OBJ, rng.below(8) as u16, u32::MAX)];
    let named = rng.chance(70);
    if named {
        if rng.chance(70) {
            e.push((ACL_USER, rng.below(8) as u16, USER.0));
        }
        if rng.chance(30) {
            e.push((ACL_USER, rng.below(8) as u16, 65534));
        }
    }
    e.push((ACL_GROUP_OBJ, rng.below(8) as u16, u32::MAX));
    if named && rng.chance(50) {
        e.push((ACL_GROUP, rng.below(8) as u16, USER.1));
    }
    if named && !rng.chance(8) {
        e.push((ACL_MASK, rng.below(8) as u16, u32::MAX));
    }
    e.push((ACL_OTHER, rng.below(8) as u16, u32::MAX));
    if rng.chance(4) {
        let i = rng.below(e.len() as u64) as usize;
        e.insert(i, e[i]);
    }
    if rng.chance(3) {
        e[0].0 = 0x40;
    }
    let mut v = 2u32.to_le_bytes().to_vec();
    for (tag, perm, id) in e {
        v.extend(tag.to_le_bytes());
        v.extend(perm.to_le_bytes());
        v.extend(id.to_le_bytes());
    }
    v
}

/// An ACL value as `getfacl` would show it, short.
pub fn acl_text(v: &[u8]) -> String {
    if v.len() < 4 {
        return format!("{v:?}");
    }
    v[4..]
        .chunks(8)
        .map(|c| {
            if c.len() < 8 {
                return "?".to_string();
            }
            let tag = u16::from_le_bytes([c[0], c[1]]);
            let perm = u16::from_le_bytes([c[2], c[3]]);
            let id = u32::from_le_bytes([c[4], c[5], c[6], c[7]]);
            let t = match tag {
                ACL_USER_OBJ => "u::".to_string(),
                ACL_USER => format!("u:{id}:"),
                ACL_GROUP_OBJ => "g::".to_string(),
                ACL_GROUP => format!("g:{id}:"),
                ACL_MASK => "m::".to_string(),
                ACL_OTHER => "o::".to_string(),
                t => format!("tag{t:#x}:"),
            };
            format!("{t}{perm:o}")
        })
        .collect::<Vec<_>>()
        .join(",")
}

// ---------------------------------------------------------------------------------------
// Running calls.

fn errno() -> i32 {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

fn ret(r: isize) -> Result<u64, i32> {
    if r < 0 {
        Err(errno())
    } else {
        Ok(r as u64)
    }
}

fn c(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).expect("no NUL in a path")
}

/// FNV-1a: results that carry data (reads, stats, xattr values) compare by this.
pub fn fnv(data: &[u8]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for &b in data {
        h = (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
    }
    h
}

/// A buffer aligned for O_DIRECT.
struct Aligned {
    ptr: *mut u8,
    layout: std::alloc::Layout,
}

impl Aligned {
    fn new(len: usize) -> Aligned {
        let layout = std::alloc::Layout::from_size_align(len.max(1), 4096).unwrap();
        // SAFETY: the layout has a nonzero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!ptr.is_null(), "out of memory");
        Aligned { ptr, layout }
    }
    fn from(data: &[u8]) -> Aligned {
        let a = Aligned::new(data.len());
        // SAFETY: `a` holds at least data.len() bytes.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), a.ptr, data.len()) };
        a
    }
    fn slice(&self, len: usize) -> &[u8] {
        // SAFETY: allocated with at least `len` bytes (callers ask for at most that).
        unsafe { std::slice::from_raw_parts(self.ptr, len.min(self.layout.size())) }
    }
}

impl Drop for Aligned {
    fn drop(&mut self) {
        // SAFETY: allocated with this layout.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) }
    }
}

fn timespec(t: Ts, nsec: i64) -> libc::timespec {
    match t {
        Ts::At(s) => libc::timespec {
            tv_sec: s,
            tv_nsec: nsec,
        },
        Ts::Now => libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_NOW,
        },
        Ts::Omit => libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_OMIT,
        },
    }
}

fn stat_hash(st: &libc::stat) -> u64 {
    let v = [
        u64::from(st.st_mode),
        u64::from(st.st_uid),
        u64::from(st.st_gid),
        st.st_size as u64,
        st.st_nlink,
        st.st_rdev,
    ];
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    fnv(&bytes)
}

/// One side of a differential test: a directory and the descriptors opened in it.
pub struct Side {
    pub root: PathBuf,
    fds: Vec<Option<OwnedFd>>,
}

impl Side {
    pub fn new(root: &Path) -> Side {
        Side {
            root: root.to_path_buf(),
            fds: (0..SLOTS).map(|_| None).collect(),
        }
    }

    fn p(&self, rel: &[u8]) -> PathBuf {
        self.root.join(std::ffi::OsStr::from_bytes(rel))
    }

    fn fd(&self, slot: usize) -> Result<RawFd, i32> {
        self.fds[slot]
            .as_ref()
            .map(|f| f.as_raw_fd())
            .ok_or(libc::EBADF)
    }

    /// The stat of an open descriptor (for messages).
    pub fn fstat(&self, slot: usize) -> Option<libc::stat> {
        let fd = self.fd(slot).ok()?;
        // SAFETY: zeroed stat is a valid out buffer; fd is open.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        (unsafe { libc::fstat(fd, &mut st) } == 0).then_some(st)
    }

    /// The stat (mode, uid, gid, size, nlink, rdev) of what `call` names on this side, for
    /// messages.
    pub fn describe(&self, call: &Call) -> String {
        let show = |st: &libc::stat| {
            format!(
                "mode {:o} uid {} gid {} size {} nlink {} rdev {:#x}",
                st.st_mode, st.st_uid, st.st_gid, st.st_size, st.st_nlink, st.st_rdev
            )
        };
        let slot = match call {
            Call::Open { slot, .. } | Call::OpenTmpfile { slot, .. } => Some(*slot),
            Call::LinkFd { slot, .. }
            | Call::Close { slot }
            | Call::Write { slot, .. }
            | Call::Pwrite { slot, .. }
            | Call::Pwritev { slot, .. }
            | Call::Read { slot, .. }
            | Call::Lseek { slot, .. }
            | Call::Ftruncate { slot, .. }
            | Call::Fallocate { slot, .. }
            | Call::MmapWrite { slot, .. }
            | Call::Fsync { slot, .. }
            | Call::Fstat { slot }
            | Call::Fchmod { slot, .. }
            | Call::Futimens { slot, .. } => Some(*slot),
            Call::CopyFileRange { to, .. } => Some(*to),
            _ => None,
        };
        let path = match call {
            Call::Open { path, .. }
            | Call::Truncate { path, .. }
            | Call::Unlink { path }
            | Call::Rmdir { path }
            | Call::SetXattr { path, .. }
            | Call::RemoveXattr { path, .. }
            | Call::GetXattr { path, .. }
            | Call::ListXattr { path }
            | Call::Chmod { path, .. }
            | Call::Chown { path, .. }
            | Call::Utimens { path, .. }
            | Call::Stat { path, .. } => Some(path),
            Call::Rename { from, .. } | Call::Link { from, .. } => Some(from),
            _ => None,
        };
        let mut out = Vec::new();
        if let Some(st) = slot.and_then(|s| self.fstat(s)) {
            out.push(format!("fd: {}", show(&st)));
        }
        if let Some(p) = path {
            // SAFETY: zeroed stat is a valid out buffer; the path is NUL-terminated.
            let mut st: libc::stat = unsafe { std::mem::zeroed() };
            if unsafe { libc::lstat(c(&self.p(p)).as_ptr(), &mut st) } == 0 {
                out.push(format!("path: {}", show(&st)));
            } else {
                out.push("path: absent".to_string());
            }
        }
        out.join("; ")
    }

    /// The descriptor in `slot`, if open.
    pub fn raw_fd(&self, slot: usize) -> Option<RawFd> {
        self.fd(slot).ok()
    }

    /// Sets the mtime (not the atime) of an open descriptor (to put a time back).
    pub fn futimens(&self, slot: usize, mtime: (i64, i64)) -> Result<(), i32> {
        let fd = self.fd(slot)?;
        let ts = [
            libc::timespec {
                tv_sec: 0,
                tv_nsec: libc::UTIME_OMIT,
            },
            libc::timespec {
                tv_sec: mtime.0,
                tv_nsec: mtime.1,
            },
        ];
        // SAFETY: fd is open, ts holds two timespecs.
        ret(unsafe { libc::futimens(fd, ts.as_ptr()) } as isize).map(|_| ())
    }

    /// fchmod of an open descriptor (to put a mode back).
    pub fn fchmod(&self, slot: usize, mode: u32) -> Result<(), i32> {
        let fd = self.fd(slot)?;
        // SAFETY: fd is open.
        ret(unsafe { libc::fchmod(fd, mode) } as isize).map(|_| ())
    }

    /// Closes every descriptor; the results of the closes (an error a close reports).
    pub fn close_all(&mut self) -> Vec<Result<u64, i32>> {
        (0..SLOTS)
            .map(|s| self.exec(&Call::Close { slot: s }))
            .collect()
    }

    /// Makes one call; its result (a count, an offset or a digest) or errno.
    pub fn exec(&mut self, call: &Call) -> Result<u64, i32> {
        // SAFETY (every block below): plain system calls on NUL-terminated paths, open
        // descriptors and buffers of the lengths passed.
        unsafe {
            match call {
                Call::Open {
                    path,
                    flags,
                    mode,
                    slot,
                } => {
                    self.fds[*slot] = None;
                    let p = self.p(path);
                    // Never a device node, fifo or socket, not even through a symlink.
                    if let Ok(m) = std::fs::metadata(&p) {
                        if !(m.is_file() || m.is_dir()) {
                            return Err(NOT_MADE);
                        }
                    }
                    let fd = libc::open(c(&p).as_ptr(), flags | libc::O_CLOEXEC, *mode);
                    if fd < 0 {
                        return Err(errno());
                    }
                    self.fds[*slot] = Some(OwnedFd::from_raw_fd(fd));
                    Ok(0)
                }
                Call::OpenTmpfile {
                    dir,
                    flags,
                    mode,
                    slot,
                } => {
                    self.fds[*slot] = None;
                    let fd = libc::open(
                        c(&self.p(dir)).as_ptr(),
                        flags | libc::O_TMPFILE | libc::O_CLOEXEC,
                        *mode,
                    );
                    if fd < 0 {
                        return Err(errno());
                    }
                    self.fds[*slot] = Some(OwnedFd::from_raw_fd(fd));
                    Ok(0)
                }
                Call::LinkFd {
                    slot,
                    path,
                    via_proc,
                } => {
                    let fd = self.fd(*slot)?;
                    let to = c(&self.p(path));
                    let r = if *via_proc {
                        let from = CString::new(format!("/proc/self/fd/{fd}")).unwrap();
                        libc::linkat(
                            libc::AT_FDCWD,
                            from.as_ptr(),
                            libc::AT_FDCWD,
                            to.as_ptr(),
                            libc::AT_SYMLINK_FOLLOW,
                        )
                    } else {
                        libc::linkat(
                            fd,
                            c"".as_ptr(),
                            libc::AT_FDCWD,
                            to.as_ptr(),
                            libc::AT_EMPTY_PATH,
                        )
                    };
                    ret(r as isize)
                }
                Call::Close { slot } => match self.fds[*slot].take() {
                    None => Ok(0),
                    Some(f) => ret(libc::close(std::os::fd::IntoRawFd::into_raw_fd(f)) as isize),
                },
                Call::Write { slot, len, fill } => {
                    let fd = self.fd(*slot)?;
                    let b = Aligned::from(&data_for(0, *len, *fill));
                    ret(libc::write(fd, b.ptr.cast(), *len as usize))
                }
                Call::Pwrite {
                    slot,
                    off,
                    len,
                    fill,
                } => {
                    let fd = self.fd(*slot)?;
                    let b = Aligned::from(&data_for(*off, *len, *fill));
                    ret(libc::pwrite(fd, b.ptr.cast(), *len as usize, *off as i64))
                }
                Call::Pwritev {
                    slot,
                    off,
                    lens,
                    fill,
                    flags,
                } => {
                    let fd = self.fd(*slot)?;
                    let total: u64 = lens.iter().sum();
                    let b = Aligned::from(&data_for((*off).max(0) as u64, total, *fill));
                    let mut at = 0usize;
                    let iov: Vec<libc::iovec> = lens
                        .iter()
                        .map(|&l| {
                            let v = libc::iovec {
                                iov_base: b.ptr.add(at).cast(),
                                iov_len: l as usize,
                            };
                            at += l as usize;
                            v
                        })
                        .collect();
                    ret(match flags {
                        None => libc::pwritev(fd, iov.as_ptr(), iov.len() as i32, *off),
                        Some(fl) => libc::pwritev2(fd, iov.as_ptr(), iov.len() as i32, *off, *fl),
                    })
                }
                Call::Read { slot, off, len } => {
                    let fd = self.fd(*slot)?;
                    let b = Aligned::new(*len as usize);
                    let n = ret(libc::pread(fd, b.ptr.cast(), *len as usize, *off as i64))?;
                    Ok(fnv(b.slice(n as usize)) ^ n)
                }
                Call::Lseek { slot, off, whence } => {
                    let fd = self.fd(*slot)?;
                    ret(libc::lseek(fd, *off, *whence) as isize)
                }
                Call::Ftruncate { slot, size } => {
                    let fd = self.fd(*slot)?;
                    ret(libc::ftruncate(fd, *size as i64) as isize)
                }
                Call::Truncate { path, size } => {
                    ret(libc::truncate(c(&self.p(path)).as_ptr(), *size as i64) as isize)
                }
                Call::Fallocate {
                    slot,
                    mode,
                    off,
                    len,
                } => {
                    let fd = self.fd(*slot)?;
                    ret(libc::fallocate(fd, *mode, *off as i64, *len as i64) as isize)
                }
                Call::CopyFileRange {
                    from,
                    to,
                    off_in,
                    off_out,
                    len,
                } => {
                    // As a program copies: until done or at the source's end (kernel btrfs
                    // shortens a copy to whole blocks when it clones).
                    let (a, b) = (self.fd(*from)?, self.fd(*to)?);
                    let (mut i, mut o) = (*off_in as i64, *off_out as i64);
                    let mut done = 0;
                    while done < *len {
                        let n = (*len - done) as usize;
                        match ret(libc::copy_file_range(a, &mut i, b, &mut o, n, 0) as isize) {
                            Ok(0) => break,
                            Ok(k) => done += k,
                            Err(e) if done == 0 => return Err(e),
                            Err(_) => break,
                        }
                    }
                    Ok(done)
                }
                Call::MmapWrite {
                    slot,
                    off,
                    len,
                    fill,
                } => {
                    let fd = self.fd(*slot)?;
                    let mut st: libc::stat = std::mem::zeroed();
                    ret(libc::fstat(fd, &mut st) as isize)?;
                    let size = st.st_size as u64;
                    if st.st_mode & libc::S_IFMT != libc::S_IFREG || *off >= size {
                        return Ok(size << 1);
                    }
                    let end = (off + len).min(size);
                    let start = off & !4095;
                    let maplen = (end - start) as usize;
                    let m = libc::mmap(
                        std::ptr::null_mut(),
                        maplen,
                        libc::PROT_READ | libc::PROT_WRITE,
                        libc::MAP_SHARED,
                        fd,
                        start as i64,
                    );
                    if m == libc::MAP_FAILED {
                        return Err(errno());
                    }
                    let data = data_for(*off, end - off, *fill);
                    std::ptr::copy_nonoverlapping(
                        data.as_ptr(),
                        m.cast::<u8>().add((off - start) as usize),
                        data.len(),
                    );
                    let r = libc::msync(m, maplen, libc::MS_SYNC);
                    let e = errno();
                    libc::munmap(m, maplen);
                    if r != 0 {
                        return Err(e);
                    }
                    Ok(((end - off) << 1) | 1)
                }
                Call::Fsync { slot, data_only } => {
                    let fd = self.fd(*slot)?;
                    ret(if *data_only {
                        libc::fdatasync(fd)
                    } else {
                        libc::fsync(fd)
                    } as isize)
                }
                Call::Fstat { slot } => {
                    let fd = self.fd(*slot)?;
                    let mut st: libc::stat = std::mem::zeroed();
                    ret(libc::fstat(fd, &mut st) as isize)?;
                    Ok(stat_hash(&st))
                }
                Call::Fchmod { slot, mode } => {
                    let fd = self.fd(*slot)?;
                    ret(libc::fchmod(fd, *mode) as isize)
                }
                Call::Futimens { slot, atime, mtime } => {
                    let fd = self.fd(*slot)?;
                    let ts = [timespec(*atime, 5), timespec(*mtime, 7)];
                    ret(libc::futimens(fd, ts.as_ptr()) as isize)
                }
                Call::Rename { from, to, flags } => ret(libc::renameat2(
                    libc::AT_FDCWD,
                    c(&self.p(from)).as_ptr(),
                    libc::AT_FDCWD,
                    c(&self.p(to)).as_ptr(),
                    *flags,
                ) as isize),
                Call::Link { from, to } => {
                    ret(libc::link(c(&self.p(from)).as_ptr(), c(&self.p(to)).as_ptr()) as isize)
                }
                Call::Unlink { path } => ret(libc::unlink(c(&self.p(path)).as_ptr()) as isize),
                Call::Mkdir { path, mode } => {
                    ret(libc::mkdir(c(&self.p(path)).as_ptr(), *mode) as isize)
                }
                Call::Rmdir { path } => ret(libc::rmdir(c(&self.p(path)).as_ptr()) as isize),
                Call::Symlink { path, target } => {
                    let t = CString::new(target.clone()).unwrap();
                    ret(libc::symlink(t.as_ptr(), c(&self.p(path)).as_ptr()) as isize)
                }
                Call::Mknod { path, mode, rdev } => ret(libc::mknod(
                    c(&self.p(path)).as_ptr(),
                    *mode,
                    *rdev as libc::dev_t,
                ) as isize),
                Call::SetXattr {
                    path,
                    name,
                    value,
                    flags,
                } => {
                    let n = CString::new(name.clone()).unwrap();
                    ret(libc::lsetxattr(
                        c(&self.p(path)).as_ptr(),
                        n.as_ptr(),
                        value.as_ptr().cast(),
                        value.len(),
                        *flags,
                    ) as isize)
                }
                Call::RemoveXattr { path, name } => {
                    let n = CString::new(name.clone()).unwrap();
                    ret(libc::lremovexattr(c(&self.p(path)).as_ptr(), n.as_ptr()) as isize)
                }
                Call::GetXattr { path, name } => {
                    let n = CString::new(name.clone()).unwrap();
                    let mut buf = vec![0u8; 65536];
                    let len = ret(libc::lgetxattr(
                        c(&self.p(path)).as_ptr(),
                        n.as_ptr(),
                        buf.as_mut_ptr().cast(),
                        buf.len(),
                    ))?;
                    Ok(fnv(&buf[..len as usize]) ^ len)
                }
                Call::ListXattr { path } => {
                    let mut buf = vec![0u8; 65536];
                    let len = ret(libc::llistxattr(
                        c(&self.p(path)).as_ptr(),
                        buf.as_mut_ptr().cast(),
                        buf.len(),
                    ))?;
                    // The order is the filesystem's; both are btrfs, so it must agree too.
                    Ok(fnv(&buf[..len as usize]) ^ len)
                }
                Call::Chmod { path, mode } => {
                    ret(libc::chmod(c(&self.p(path)).as_ptr(), *mode) as isize)
                }
                Call::Chown {
                    path,
                    uid,
                    gid,
                    follow,
                } => {
                    let p = c(&self.p(path));
                    ret(if *follow {
                        libc::chown(p.as_ptr(), *uid, *gid)
                    } else {
                        libc::lchown(p.as_ptr(), *uid, *gid)
                    } as isize)
                }
                Call::Utimens {
                    path,
                    atime,
                    mtime,
                    follow,
                } => {
                    let ts = [timespec(*atime, 5), timespec(*mtime, 7)];
                    let flags = if *follow {
                        0
                    } else {
                        libc::AT_SYMLINK_NOFOLLOW
                    };
                    ret(libc::utimensat(
                        libc::AT_FDCWD,
                        c(&self.p(path)).as_ptr(),
                        ts.as_ptr(),
                        flags,
                    ) as isize)
                }
                Call::Stat { path, follow } => {
                    let mut st: libc::stat = std::mem::zeroed();
                    let p = c(&self.p(path));
                    ret(if *follow {
                        libc::stat(p.as_ptr(), &mut st)
                    } else {
                        libc::lstat(p.as_ptr(), &mut st)
                    } as isize)?;
                    Ok(stat_hash(&st))
                }
                Call::Sync => errno_of_io(crate::mount::btrfs_sync(&self.root)),
            }
        }
    }
}

fn errno_of_io(r: std::io::Result<()>) -> Result<u64, i32> {
    r.map(|_| 0)
        .map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))
}

/// Runs `f` on a thread whose credentials (and only its: raw system calls, not glibc's
/// setuid family, which changes every thread) are [`USER`] with no supplementary groups.
pub fn as_user<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    std::thread::scope(|s| {
        s.spawn(|| {
            // SAFETY: these change only the calling thread's credentials.
            unsafe {
                let none: *const libc::gid_t = std::ptr::null();
                assert_eq!(
                    libc::syscall(libc::SYS_setgroups, 0 as libc::c_long, none),
                    0
                );
                let (u, g) = (USER.0 as libc::c_long, USER.1 as libc::c_long);
                assert_eq!(libc::syscall(libc::SYS_setresgid, g, g, g), 0);
                assert_eq!(libc::syscall(libc::SYS_setresuid, u, u, u), 0);
            }
            f()
        })
        .join()
        .expect("the unprivileged thread panicked")
    })
}

// ---------------------------------------------------------------------------------------
// Generating calls.

#[derive(Clone, Copy)]
struct SlotModel {
    direct: bool,
}

/// A seeded generator of [`Step`]s. It looks at the reference tree for paths, and keeps a
/// model of which descriptors are open ([`Gen::record`] tells it what a step returned).
pub struct Gen {
    pub rng: Rng,
    slots: [Option<SlotModel>; SLOTS],
    /// Largest offsets and lengths of writes.
    pub max_off: u64,
}

const XATTR_NAMES: &[&[u8]] = &[
    b"user.a",
    b"user.b",
    b"user.long-name-of-an-attribute",
    b"trusted.t",
    b"security.s",
    b"system.posix_acl_access",
    b"system.posix_acl_default",
];

impl Gen {
    pub fn new(seed: u64) -> Gen {
        Gen {
            rng: Rng::new(seed),
            slots: [None; SLOTS],
            max_off: 2 << 20,
        }
    }

    /// Updates the descriptor model with what the reference returned for `step`.
    pub fn record(&mut self, step: &Step, result: &Result<u64, i32>) {
        match &step.call {
            Call::Open { slot, flags, .. } | Call::OpenTmpfile { slot, flags, .. } => {
                self.slots[*slot] = result.is_ok().then_some(SlotModel {
                    direct: flags & libc::O_DIRECT != 0,
                });
            }
            Call::Close { slot } => self.slots[*slot] = None,
            _ => {}
        }
    }

    /// Whether descriptor `slot` is open with O_DIRECT.
    pub fn is_direct(&self, slot: usize) -> bool {
        self.slots[slot].is_some_and(|s| s.direct)
    }

    fn open_slot(&mut self) -> Option<usize> {
        let open: Vec<usize> = (0..SLOTS).filter(|&s| self.slots[s].is_some()).collect();
        (!open.is_empty()).then(|| open[self.rng.below(open.len() as u64) as usize])
    }

    fn name(&mut self) -> Vec<u8> {
        let len = if self.rng.chance(3) {
            200 + self.rng.below(56)
        } else {
            1 + self.rng.below(8)
        };
        (0..len)
            .map(|_| b"abcdefghijklmnopqrstuvwxyz0123456789_-"[self.rng.below(38) as usize])
            .collect()
    }

    fn off(&mut self, direct: bool) -> u64 {
        let o = match self.rng.below(4) {
            0 => 0,
            1 => self.rng.below(9000),
            2 => self.rng.below(200_000),
            _ => self.rng.below(self.max_off),
        };
        if direct {
            o & !4095
        } else {
            o
        }
    }

    fn len(&mut self, direct: bool) -> u64 {
        let l = match self.rng.below(5) {
            0 => 1 + self.rng.below(100),
            1 => 1 + self.rng.below(5000),
            2 => 1 + self.rng.below(70_000),
            3 => 1 + self.rng.below(300_000),
            _ => 1 + self.rng.below(self.max_off / 2),
        };
        if direct {
            (l + 4095) & !4095
        } else {
            l
        }
    }

    fn ts(&mut self) -> Ts {
        match self.rng.below(10) {
            0 => Ts::Omit,
            1 => Ts::Now,
            _ => Ts::At(1_000_000_000 + self.rng.below(1 << 30) as i64),
        }
    }

    fn mode(&mut self) -> u32 {
        [
            0o644, 0o600, 0o666, 0o755, 0o777, 0o4755, 0o2755, 0o6777, 0o1777, 0o444, 0o000,
            0o2770, 0o640,
        ][self.rng.below(13) as usize]
    }

    /// The next step, with paths from the reference tree at `reference`.
    pub fn next(&mut self, reference: &Path) -> Step {
        let (dirs, others) = walk(reference);
        let pick = |rng: &mut Rng, v: &[Vec<u8>]| v[rng.below(v.len() as u64) as usize].clone();
        let any = |rng: &mut Rng| -> Vec<u8> {
            if !others.is_empty() && rng.chance(65) {
                pick(rng, &others)
            } else {
                pick(rng, &dirs)
            }
        };
        let fresh = |g: &mut Gen| -> Vec<u8> {
            if g.rng.chance(20) {
                return any(&mut g.rng);
            }
            let d = pick(&mut g.rng, &dirs);
            let n = g.name();
            join(&d, &n)
        };
        let file = |g: &mut Gen| -> Vec<u8> {
            if others.is_empty() || g.rng.chance(10) {
                fresh(g)
            } else {
                pick(&mut g.rng, &others)
            }
        };
        let as_user = self.rng.chance(25);
        let fill = self.rng.below(256) as u8;
        let kind = self.rng.below(1000);
        // Calls on descriptors need one open: else an open it is.
        let slot = self.open_slot();
        let fd_call = (180..620).contains(&kind);
        let kind = if fd_call && slot.is_none() { 0 } else { kind };
        let slot = slot.unwrap_or(0);
        let direct = self.slots[slot].is_some_and(|s| s.direct);
        let call = match kind {
            0..=129 => {
                let mut flags = match self.rng.below(10) {
                    0..=1 => libc::O_RDONLY,
                    2..=4 => libc::O_WRONLY,
                    _ => libc::O_RDWR,
                };
                for (bit, pct) in [
                    (libc::O_CREAT, 55),
                    (libc::O_EXCL, 12),
                    (libc::O_TRUNC, 25),
                    (libc::O_APPEND, 18),
                    (libc::O_DIRECT, 12),
                    (libc::O_SYNC, 6),
                    (libc::O_DSYNC, 6),
                    (libc::O_NOFOLLOW, 15),
                    (libc::O_DIRECTORY, 3),
                    (libc::O_NOATIME, 3),
                ] {
                    if self.rng.chance(pct) {
                        flags |= bit;
                    }
                }
                let path = if flags & libc::O_CREAT != 0 && self.rng.chance(50) {
                    fresh(self)
                } else {
                    file(self)
                };
                Call::Open {
                    path,
                    flags,
                    mode: self.mode() & 0o7777,
                    slot: self.rng.below(SLOTS as u64) as usize,
                }
            }
            130..=149 => {
                let mut flags = if self.rng.chance(70) {
                    libc::O_RDWR
                } else {
                    libc::O_WRONLY
                };
                for (bit, pct) in [(libc::O_EXCL, 20), (libc::O_DIRECT, 10), (libc::O_SYNC, 5)] {
                    if self.rng.chance(pct) {
                        flags |= bit;
                    }
                }
                Call::OpenTmpfile {
                    dir: pick(&mut self.rng, &dirs),
                    flags,
                    mode: self.mode() & 0o7777,
                    slot: self.rng.below(SLOTS as u64) as usize,
                }
            }
            150..=169 => match self.open_slot() {
                Some(slot) => Call::LinkFd {
                    slot,
                    path: fresh(self),
                    via_proc: self.rng.chance(50),
                },
                None => Call::Sync,
            },
            170..=179 => Call::Sync,
            180..=239 => Call::Close { slot },
            240..=289 => Call::Write {
                slot,
                len: self.len(direct),
                fill,
            },
            290..=359 => Call::Pwrite {
                slot,
                off: self.off(direct),
                len: self.len(direct),
                fill,
            },
            360..=409 => {
                let n = 1 + self.rng.below(4);
                let lens = (0..n).map(|_| self.len(direct) / n).collect::<Vec<_>>();
                let lens = lens
                    .into_iter()
                    .map(|l| if direct { (l + 4095) & !4095 } else { l.max(1) })
                    .collect();
                let flags = match self.rng.below(8) {
                    0 | 1 => None,
                    2 => Some(0),
                    3 => Some(libc::RWF_DSYNC),
                    4 => Some(libc::RWF_SYNC),
                    5 => Some(libc::RWF_APPEND),
                    6 => Some(libc::RWF_HIPRI),
                    _ => Some(libc::RWF_NOAPPEND),
                };
                let off = if flags.is_some() && self.rng.chance(25) {
                    -1
                } else {
                    self.off(direct) as i64
                };
                Call::Pwritev {
                    slot,
                    off,
                    lens,
                    fill,
                    flags,
                }
            }
            410..=449 => Call::Read {
                slot,
                off: self.off(direct),
                len: self.len(direct),
            },
            450..=464 => {
                let whence =
                    [libc::SEEK_SET, libc::SEEK_CUR, libc::SEEK_END][self.rng.below(3) as usize];
                Call::Lseek {
                    slot,
                    off: self.rng.below(100_000) as i64
                        - if whence == libc::SEEK_SET { 0 } else { 50_000 },
                    whence,
                }
            }
            465..=494 => Call::Ftruncate {
                slot,
                size: if self.rng.chance(40) {
                    self.rng.below(10_000)
                } else {
                    self.off(false)
                },
            },
            495..=539 => {
                let mode = [
                    0,
                    libc::FALLOC_FL_KEEP_SIZE,
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                    libc::FALLOC_FL_PUNCH_HOLE,
                    libc::FALLOC_FL_ZERO_RANGE,
                    libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE,
                    libc::FALLOC_FL_COLLAPSE_RANGE,
                    libc::FALLOC_FL_INSERT_RANGE,
                    libc::FALLOC_FL_UNSHARE_RANGE,
                ][self.rng.below(9) as usize];
                Call::Fallocate {
                    slot,
                    mode,
                    off: self.off(false),
                    len: self.len(false),
                }
            }
            540..=564 => {
                let to = self.open_slot().unwrap_or(slot);
                Call::CopyFileRange {
                    from: slot,
                    to,
                    off_in: self.off(false),
                    off_out: self.off(false),
                    len: self.len(false),
                }
            }
            565..=589 => Call::MmapWrite {
                slot,
                off: self.off(false),
                len: self.len(false).min(300_000),
                fill,
            },
            590..=604 => Call::Fsync {
                slot,
                data_only: self.rng.chance(50),
            },
            605..=609 => Call::Fstat { slot },
            610..=614 => Call::Fchmod {
                slot,
                mode: self.mode(),
            },
            615..=619 => Call::Futimens {
                slot,
                atime: self.ts(),
                mtime: self.ts(),
            },
            620..=669 => {
                let flags = match self.rng.below(8) {
                    0 => libc::RENAME_NOREPLACE,
                    1 => libc::RENAME_EXCHANGE,
                    2 => libc::RENAME_WHITEOUT,
                    _ => 0,
                };
                let from = any(&mut self.rng);
                let to = if self.rng.chance(40) {
                    any(&mut self.rng)
                } else {
                    fresh(self)
                };
                Call::Rename { from, to, flags }
            }
            670..=689 => Call::Link {
                from: file(self),
                to: fresh(self),
            },
            690..=729 => Call::Unlink {
                path: any(&mut self.rng),
            },
            730..=759 => Call::Mkdir {
                path: fresh(self),
                mode: self.mode() & 0o7777,
            },
            760..=769 => Call::Rmdir {
                path: pick(&mut self.rng, &dirs),
            },
            770..=789 => {
                let path = fresh(self);
                // Targets that resolve (a sibling, a path below the root's directories) or
                // not; never absolute, never "..": a link must not lead out of the tree.
                let target = match self.rng.below(3) {
                    0 => self.name(),
                    _ => {
                        let t = any(&mut self.rng);
                        let (d, n) = crate::ops::split(&path);
                        match t.strip_prefix(d).and_then(|r| r.strip_prefix(b"/")) {
                            Some(r) if !d.is_empty() => r.to_vec(),
                            _ if d.is_empty() && !t.is_empty() => t,
                            _ => n.to_vec(),
                        }
                    }
                };
                Call::Symlink { path, target }
            }
            790..=809 => {
                let (mode, rdev) = match self.rng.below(5) {
                    0 => (libc::S_IFIFO | 0o644, 0),
                    1 => (
                        libc::S_IFCHR | 0o600,
                        libc::makedev(1 + self.rng.below(200) as u32, self.rng.below(300) as u32),
                    ),
                    2 => (
                        libc::S_IFBLK | 0o600,
                        libc::makedev(8, self.rng.below(64) as u32),
                    ),
                    3 => (libc::S_IFSOCK | 0o755, 0),
                    _ => (libc::S_IFREG | self.mode() & 0o7777, 0),
                };
                Call::Mknod {
                    path: fresh(self),
                    mode,
                    rdev,
                }
            }
            810..=869 => {
                let name = XATTR_NAMES[self.rng.below(XATTR_NAMES.len() as u64) as usize];
                let value = if name.starts_with(b"system.posix_acl") {
                    random_acl(&mut self.rng)
                } else {
                    let len = match self.rng.below(10) {
                        0 => self.rng.below(20_000),
                        1 => self.rng.below(3000),
                        _ => self.rng.below(80),
                    };
                    (0..len).map(|i| b'a' + ((i as u8 ^ fill) % 26)).collect()
                };
                let flags = match self.rng.below(4) {
                    0 => libc::XATTR_CREATE,
                    1 => libc::XATTR_REPLACE,
                    _ => 0,
                };
                Call::SetXattr {
                    path: any(&mut self.rng),
                    name: name.to_vec(),
                    value,
                    flags,
                }
            }
            870..=884 => Call::RemoveXattr {
                path: any(&mut self.rng),
                name: XATTR_NAMES[self.rng.below(XATTR_NAMES.len() as u64) as usize].to_vec(),
            },
            885..=894 => Call::GetXattr {
                path: any(&mut self.rng),
                name: XATTR_NAMES[self.rng.below(XATTR_NAMES.len() as u64) as usize].to_vec(),
            },
            895..=899 => Call::ListXattr {
                path: any(&mut self.rng),
            },
            900..=924 => Call::Chmod {
                path: any(&mut self.rng),
                mode: self.mode(),
            },
            925..=949 => {
                let ids = [0, USER.0, 65534];
                let gids = [0, USER.1, 65534, u32::MAX];
                let uid = if self.rng.chance(30) {
                    u32::MAX
                } else {
                    ids[self.rng.below(3) as usize]
                };
                Call::Chown {
                    path: any(&mut self.rng),
                    uid,
                    gid: gids[self.rng.below(4) as usize],
                    follow: self.rng.chance(30),
                }
            }
            950..=979 => Call::Utimens {
                path: any(&mut self.rng),
                atime: self.ts(),
                mtime: self.ts(),
                follow: self.rng.chance(30),
            },
            _ => Call::Stat {
                path: any(&mut self.rng),
                follow: self.rng.chance(50),
            },
        };
        let as_user = as_user && !matches!(call, Call::Sync);
        Step { call, as_user }
    }
}

// ---------------------------------------------------------------------------------------
// Whole trees.

/// What a tree capture holds of one path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    pub kind: u32,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub nlink: u64,
    pub rdev: u64,
    pub content: Option<[u8; 32]>,
    pub target: Option<Vec<u8>>,
    /// Every xattr (POSIX ACLs, trusted.* and security.* too), by name.
    pub xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
    pub ino: u64,
    pub mtime: (i64, i64),
    pub ctime: (i64, i64),
}

/// Every xattr of `p` (not following a symlink).
pub fn all_xattrs(p: &Path) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let mut out = BTreeMap::new();
    let cp = c(p);
    let mut buf = vec![0u8; 65536];
    // SAFETY: NUL-terminated path, buffers of the lengths passed.
    let n = unsafe { libc::llistxattr(cp.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if n <= 0 {
        return out;
    }
    for name in buf[..n as usize]
        .split(|&b| b == 0)
        .filter(|n| !n.is_empty())
    {
        let cn = CString::new(name.to_vec()).unwrap();
        let mut val = vec![0u8; 65536];
        // SAFETY: as above.
        let m = unsafe {
            libc::lgetxattr(cp.as_ptr(), cn.as_ptr(), val.as_mut_ptr().cast(), val.len())
        };
        val.truncate(m.max(0) as usize);
        out.insert(name.to_vec(), if m < 0 { b"<error>".to_vec() } else { val });
    }
    out
}

/// Every path under `root` (relative; the root is the empty path).
pub fn capture(root: &Path) -> BTreeMap<Vec<u8>, Node> {
    let (dirs, others) = walk(root);
    let mut out = BTreeMap::new();
    for rel in dirs.into_iter().chain(others) {
        let p = root.join(std::ffi::OsStr::from_bytes(&rel));
        let m =
            std::fs::symlink_metadata(&p).unwrap_or_else(|e| panic!("lstat {}: {e}", p.display()));
        let content = m.is_file().then(|| {
            let mut f =
                std::fs::File::open(&p).unwrap_or_else(|e| panic!("open {}: {e}", p.display()));
            crate::manifest::hash_file(&mut f)
                .unwrap_or_else(|e| panic!("read {}: {e}", p.display()))
        });
        let target = m.file_type().is_symlink().then(|| {
            std::fs::read_link(&p)
                .unwrap()
                .as_os_str()
                .as_bytes()
                .to_vec()
        });
        out.insert(
            rel,
            Node {
                kind: m.mode() & libc::S_IFMT,
                mode: m.mode(),
                uid: m.uid(),
                gid: m.gid(),
                size: m.size(),
                nlink: m.nlink(),
                rdev: m.rdev(),
                content,
                target,
                xattrs: all_xattrs(&p),
                ino: m.ino(),
                mtime: (m.mtime(), m.mtime_nsec()),
                ctime: (m.ctime(), m.ctime_nsec()),
            },
        );
    }
    out
}

fn show_xattrs(x: &BTreeMap<Vec<u8>, Vec<u8>>) -> String {
    x.iter()
        .map(|(k, v)| {
            if k.starts_with(b"system.posix_acl") {
                format!("{}=[{}]", text(k), acl_text(v))
            } else {
                format!("{}={}B", text(k), v.len())
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// Hard-link groups of a capture: sets of paths sharing an inode number.
fn link_groups(t: &BTreeMap<Vec<u8>, Node>) -> Vec<Vec<Vec<u8>>> {
    let mut by_ino: BTreeMap<u64, Vec<Vec<u8>>> = BTreeMap::new();
    for (p, n) in t {
        if n.kind != libc::S_IFDIR {
            by_ino.entry(n.ino).or_default().push(p.clone());
        }
    }
    let mut g: Vec<_> = by_ino.into_values().filter(|v| v.len() > 1).collect();
    g.sort();
    g
}

/// The differences between two filesystems' trees: everything but inode numbers, ctimes,
/// and mtimes neither side had set explicitly (nanoseconds 7).
pub fn diff_trees(
    reference: &BTreeMap<Vec<u8>, Node>,
    other: &BTreeMap<Vec<u8>, Node>,
    what: &str,
) -> Vec<String> {
    diff_trees_except(reference, other, what, &|_| false)
}

/// [`diff_trees`], not comparing the mtime of nodes of `other` for which `skip_mtime` says
/// so.
pub fn diff_trees_except(
    reference: &BTreeMap<Vec<u8>, Node>,
    other: &BTreeMap<Vec<u8>, Node>,
    what: &str,
    skip_mtime: &dyn Fn(&Node) -> bool,
) -> Vec<String> {
    let mut diffs = Vec::new();
    for (p, a) in reference {
        let Some(b) = other.get(p) else {
            diffs.push(format!("{:?}: missing on {what}", text(p)));
            continue;
        };
        let mut d = String::new();
        macro_rules! f { ($($n:ident),*) => { $( if a.$n != b.$n { d += &format!(" {}: ref={:?} {what}={:?};", stringify!($n), a.$n, b.$n); } )* } }
        f!(kind, uid, gid, size, nlink, rdev, target);
        if a.mode != b.mode {
            d += &format!(" mode: ref={:o} {what}={:o};", a.mode, b.mode);
        }
        if (a.mtime.1 == 7 || b.mtime.1 == 7) && a.mtime != b.mtime && !skip_mtime(b) {
            d += &format!(" mtime: ref={:?} {what}={:?};", a.mtime, b.mtime);
        }
        if a.xattrs != b.xattrs {
            d += &format!(
                " xattrs: ref={} {what}={};",
                show_xattrs(&a.xattrs),
                show_xattrs(&b.xattrs)
            );
        }
        if a.content != b.content {
            d += " content differs;";
        }
        if !d.is_empty() {
            diffs.push(format!("{:?}:{d}", text(p)));
        }
    }
    for p in other.keys().filter(|p| !reference.contains_key(*p)) {
        diffs.push(format!("{:?}: extra on {what}", text(p)));
    }
    if link_groups(reference) != link_groups(other) {
        diffs.push(format!("hard-link groups differ on {what}"));
    }
    diffs
}

/// The differences between one filesystem's tree as seen live and later (after a remount,
/// or by another driver): every stat field that lives on disk must have stayed, times and
/// inode numbers included. Differences only of mtime and ctime of a node for which
/// `tolerate_times` says so are counted apart (the second result), not listed.
pub fn diff_same_fs(
    before: &BTreeMap<Vec<u8>, Node>,
    after: &BTreeMap<Vec<u8>, Node>,
    what: &str,
    tolerate_times: &dyn Fn(&Node) -> bool,
) -> (Vec<String>, usize) {
    let mut diffs = diff_trees_except(before, after, what, tolerate_times);
    let mut tolerated = 0;
    for (p, a) in before {
        let Some(b) = after.get(p) else { continue };
        if a.ino != b.ino {
            diffs.push(format!(
                "{:?}: ino: live={} {what}={};",
                text(p),
                a.ino,
                b.ino
            ));
            continue;
        }
        if a.ctime == b.ctime && a.mtime == b.mtime {
            continue;
        }
        if tolerate_times(a) {
            tolerated += 1;
            continue;
        }
        diffs.push(format!(
            "{:?}: times (mtime, ctime): live={:?} {what}={:?};",
            text(p),
            (a.mtime, a.ctime),
            (b.mtime, b.ctime)
        ));
    }
    (diffs, tolerated)
}
