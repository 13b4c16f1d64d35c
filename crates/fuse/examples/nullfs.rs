//! The FUSE floor: a filesystem on oleo's transport that keeps names, hard links,
//! symlinks and attributes in hash maps, and file contents in memory (fs_mark keeps its
//! own logs in the tree it tests, dbench reads back what it wrote), and nothing else: no
//! disk, no commit, an fsync that returns at once, xattrs in a map. It mounts as oleo
//! mounts (default_permissions) and answers opens, listings, copy_file_range, FLUSH and
//! INIT as oleo does (KEEP_CACHE, zero-message OPENDIR, READDIRPLUS), so the kernel asks it
//! what it asks oleo: fs_mark, dbench, bigdir-ops and untar-cp run on it. What a
//! workload reaches on it is the
//! most any FUSE filesystem can reach on the machine with the same transport and INIT
//! flags as oleo: bench/ runs it as the `fuse-floor` target. Root only (it mounts with
//! mount(2), not fusermount3). The transport counts its requests by opcode: the
//! FUSE_STATS ioctl on its root answers them while it runs (`oleo mount-stats MNT`), and
//! it prints them at unmount.
//!
//! Usage: nullfs MOUNTPOINT [devfuse]   (serves until unmounted; io_uring where enabled)

use oleo_fuse::transport::abi;
use oleo_fuse::transport::{
    Access, DirBuf, Errno, Handler, InitConfig, Op, Reply, Request, Session,
};
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::ffi::CString;
use std::os::fd::{AsRawFd, OwnedFd};

const S_IFDIR: u32 = 0o040000;
const S_IFREG: u32 = 0o100000;
const S_IFLNK: u32 = 0o120000;
const S_IFMT: u32 = 0o170000;

/// An inode's attributes. Times are real (creation, then what SETATTR sets), as oleo's are:
/// a floor answering 0 would make the kernel send a SETATTR of the times after every write.
#[derive(Clone, Copy)]
struct Meta {
    mode: u32,
    size: u64,
    /// atime, mtime, ctime: seconds and nanoseconds.
    times: [(u64, u32); 3],
}

impl Meta {
    fn new(mode: u32, size: u64) -> Meta {
        let t = now();
        Meta {
            mode,
            size,
            times: [t; 3],
        }
    }
}

/// The kernel's own clock for file times (current_time: the coarse realtime clock), as
/// oleo's engine reads it: a write in the same tick as the CREATE then moves no time.
fn now() -> (u64, u32) {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid out-pointer; CLOCK_REALTIME_COARSE always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME_COARSE, &mut ts) };
    (ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// An inode's xattrs: (name, value).
type Xattrs = Vec<(Vec<u8>, Vec<u8>)>;

#[derive(Default)]
struct Tree {
    /// (directory, name) -> (inode, the entry's place in `children`).
    names: HashMap<(u64, Vec<u8>), (u64, u64)>,
    modes: HashMap<u64, Meta>,
    /// Directory -> its entries by place, in the order they were made (a listing's offset
    /// is the place past the last entry given): a name comes and goes in O(log n), so a
    /// big directory costs the floor no more than a small one, as oleo's B-tree does.
    children: HashMap<u64, BTreeMap<u64, (Vec<u8>, u64)>>,
    places: u64,
    data: HashMap<u64, Vec<u8>>,
    /// Names of each inode that has more than one (hard links); the others have one.
    links: HashMap<u64, u32>,
    xattrs: HashMap<u64, Xattrs>,
    next: u64,
}

impl Tree {
    /// `name` in `dir` leads to `ino` (replacing what it named, which the caller forgets).
    fn add_name(&mut self, dir: u64, name: &[u8], ino: u64) -> Option<u64> {
        self.places += 1;
        let place = self.places;
        let old = self.names.insert((dir, name.to_vec()), (ino, place));
        let c = self.children.entry(dir).or_default();
        if let Some((_, p)) = old {
            c.remove(&p);
        }
        c.insert(place, (name.to_vec(), ino));
        old.map(|(i, _)| i)
    }

    /// Takes `name` out of `dir`; the inode it led to.
    fn remove_name(&mut self, dir: u64, name: &[u8]) -> Option<u64> {
        let (ino, place) = self.names.remove(&(dir, name.to_vec()))?;
        if let Some(c) = self.children.get_mut(&dir) {
            c.remove(&place);
        }
        Some(ino)
    }

    /// `ino` lost a name: with its last name its contents go, so that a workload that
    /// deletes what it wrote (dbench) runs in bounded memory.
    fn forget_name(&mut self, ino: u64) {
        match self.links.get_mut(&ino) {
            Some(n) if *n > 2 => *n -= 1,
            Some(_) => {
                self.links.remove(&ino);
            }
            None => {
                self.data.remove(&ino);
                self.xattrs.remove(&ino);
            }
        }
    }

    fn nlink(&self, ino: u64, mode: u32) -> u32 {
        if mode & S_IFMT == S_IFDIR {
            2
        } else {
            self.links.get(&ino).copied().unwrap_or(1)
        }
    }

    fn entry(&self, ino: u64) -> Option<abi::EntryOut> {
        let m = self.modes.get(&ino)?;
        Some(entry(ino, m, self.nlink(ino, m.mode)))
    }
}

struct NullFs {
    uring: bool,
    tree: Mutex<Tree>,
}

fn attr(ino: u64, m: &Meta, nlink: u32) -> abi::Attr {
    let [a, mt, c] = m.times;
    abi::Attr {
        ino,
        size: m.size,
        mode: m.mode,
        nlink,
        atime: a.0,
        atimensec: a.1,
        mtime: mt.0,
        mtimensec: mt.1,
        ctime: c.0,
        ctimensec: c.1,
        blksize: 4096,
        ..Default::default()
    }
}

fn entry(ino: u64, m: &Meta, nlink: u32) -> abi::EntryOut {
    abi::EntryOut {
        nodeid: ino,
        entry_valid: 1,
        attr_valid: 1,
        attr: attr(ino, m, nlink),
        ..Default::default()
    }
}

impl NullFs {
    fn make(&self, parent: u64, name: &[u8], mode: u32) -> Result<abi::EntryOut, Errno> {
        self.make_with(parent, name, mode, None)
    }

    /// A new inode named `name` in `parent`; a symlink's target is its contents.
    fn make_with(
        &self,
        parent: u64,
        name: &[u8],
        mode: u32,
        target: Option<&[u8]>,
    ) -> Result<abi::EntryOut, Errno> {
        let mut t = self.tree.lock();
        if t.names.contains_key(&(parent, name.to_vec())) {
            return Err(Errno(libc::EEXIST));
        }
        t.next += 1;
        let ino = t.next;
        t.add_name(parent, name, ino);
        let size = target.map_or(0, |d| d.len() as u64);
        let meta = Meta::new(mode, size);
        t.modes.insert(ino, meta);
        if let Some(d) = target {
            t.data.insert(ino, d.to_vec());
        }
        Ok(entry(ino, &meta, 1))
    }
}

impl Handler for NullFs {
    fn init(&self, _kernel_flags: u64) -> InitConfig {
        // oleo's flags for a writable mount.
        let flags = oleo_fuse::init_flags(true, self.uring);
        InitConfig {
            flags,
            max_write: 1 << 20,
            max_readahead: 1 << 20,
        }
    }

    fn dispatch(&self, req: &Request, op: Op<'_>, reply: Reply<'_>) {
        let node = req.nodeid;
        match op {
            Op::Lookup { name } => {
                let t = self.tree.lock();
                match t
                    .names
                    .get(&(node, name.to_vec()))
                    .and_then(|&(i, _)| t.entry(i))
                {
                    Some(e) => reply.entry(&e),
                    None => reply.entry(&abi::EntryOut {
                        entry_valid: 1,
                        ..Default::default()
                    }),
                }
            }
            Op::Getattr { .. } | Op::Setattr(_) => {
                let mut t = self.tree.lock();
                if let Op::Setattr(arg) = &op {
                    use abi::fattr;
                    if arg.valid & fattr::SIZE != 0 {
                        t.data.entry(node).or_default().resize(arg.size as usize, 0);
                    }
                    if let Some(m) = t.modes.get_mut(&node) {
                        let v = arg.valid;
                        if v & fattr::SIZE != 0 {
                            m.size = arg.size;
                        }
                        if v & fattr::MODE != 0 {
                            m.mode = (m.mode & S_IFMT) | (arg.mode & 0o7777);
                        }
                        let set = |now_bit: u32, given: (u64, u32)| {
                            if v & now_bit != 0 {
                                now()
                            } else {
                                given
                            }
                        };
                        if v & fattr::ATIME != 0 {
                            m.times[0] = set(fattr::ATIME_NOW, (arg.atime, arg.atimensec));
                        }
                        if v & fattr::MTIME != 0 {
                            m.times[1] = set(fattr::MTIME_NOW, (arg.mtime, arg.mtimensec));
                        }
                        m.times[2] = if v & fattr::CTIME != 0 {
                            (arg.ctime, arg.ctimensec)
                        } else {
                            now()
                        };
                    }
                }
                match t.modes.get(&node) {
                    Some(m) => reply.attr(&abi::AttrOut {
                        attr_valid: 1,
                        attr: attr(node, m, t.nlink(node, m.mode)),
                        ..Default::default()
                    }),
                    None => reply.error(Errno(libc::ENOENT)),
                }
            }
            Op::Mkdir { arg, name } => match self.make(node, name, S_IFDIR | (arg.mode & 0o7777)) {
                Ok(e) => reply.entry(&e),
                Err(e) => reply.error(e),
            },
            Op::Create { arg, name } => {
                match self.make(node, name, S_IFREG | (arg.mode & 0o7777)) {
                    Ok(e) => reply.created(&e, 0, abi::fopen::KEEP_CACHE),
                    Err(e) => reply.error(e),
                }
            }
            Op::Symlink { name, target } => {
                match self.make_with(node, name, S_IFLNK | 0o777, Some(target)) {
                    Ok(e) => reply.entry(&e),
                    Err(e) => reply.error(e),
                }
            }
            Op::Readlink => {
                let t = self.tree.lock();
                reply.data(t.data.get(&node).map_or(&[][..], Vec::as_slice))
            }
            Op::Link { oldnode, name } => {
                let mut t = self.tree.lock();
                if t.names.contains_key(&(node, name.to_vec())) {
                    return reply.error(Errno(libc::EEXIST));
                }
                if !t.modes.contains_key(&oldnode) {
                    return reply.error(Errno(libc::ENOENT));
                }
                t.add_name(node, name, oldnode);
                *t.links.entry(oldnode).or_insert(1) += 1;
                match t.entry(oldnode) {
                    Some(e) => reply.entry(&e),
                    None => reply.error(Errno(libc::ENOENT)),
                }
            }
            Op::Unlink { name } | Op::Rmdir { name } => {
                let mut t = self.tree.lock();
                match t.remove_name(node, name) {
                    Some(ino) => {
                        t.forget_name(ino);
                        reply.ok()
                    }
                    None => reply.error(Errno(libc::ENOENT)),
                }
            }
            Op::Rename {
                newdir,
                name,
                newname,
                ..
            } => {
                let mut t = self.tree.lock();
                let Some(ino) = t.remove_name(node, name) else {
                    return reply.error(Errno(libc::ENOENT));
                };
                if let Some(old) = t.add_name(newdir, newname, ino) {
                    t.forget_name(old);
                }
                reply.ok()
            }
            // No xattrs, answered as oleo answers a file without them (ENOSYS would make
            // the kernel stop asking, which oleo cannot let it do).
            Op::Setxattr { name, value, .. } => {
                let mut t = self.tree.lock();
                let list = t.xattrs.entry(node).or_default();
                list.retain(|(n, _)| n != name);
                list.push((name.to_vec(), value.to_vec()));
                reply.ok()
            }
            Op::Getxattr { size, name } => {
                let t = self.tree.lock();
                let found = t
                    .xattrs
                    .get(&node)
                    .and_then(|l| l.iter().find(|(n, _)| n == name));
                match found {
                    None => reply.error(Errno(libc::ENODATA)),
                    Some((_, v)) if size == 0 => reply.xattr_size(v.len() as u32),
                    Some((_, v)) if v.len() > size as usize => reply.error(Errno(libc::ERANGE)),
                    Some((_, v)) => reply.data(v),
                }
            }
            Op::Listxattr { size } => {
                let t = self.tree.lock();
                let mut names = Vec::new();
                for (n, _) in t.xattrs.get(&node).map_or(&[][..], Vec::as_slice) {
                    names.extend_from_slice(n);
                    names.push(0);
                }
                match size {
                    0 => reply.xattr_size(names.len() as u32),
                    s if names.len() > s as usize => reply.error(Errno(libc::ERANGE)),
                    _ => reply.data(&names),
                }
            }
            Op::Removexattr { name } => {
                let mut t = self.tree.lock();
                let list = t.xattrs.entry(node).or_default();
                let before = list.len();
                list.retain(|(n, _)| n != name);
                if list.len() == before {
                    reply.error(Errno(libc::ENODATA))
                } else {
                    reply.ok()
                }
            }
            Op::CopyFileRange(arg) => {
                let mut t = self.tree.lock();
                let src = t.data.get(&node).map_or(&[][..], Vec::as_slice);
                let from = (arg.off_in as usize).min(src.len());
                let to = from.saturating_add(arg.len as usize).min(src.len());
                let chunk = src[from..to].to_vec();
                let end = arg.off_out as usize + chunk.len();
                let dst = t.data.entry(arg.nodeid_out).or_default();
                if dst.len() < end {
                    dst.resize(end, 0);
                }
                dst[arg.off_out as usize..end].copy_from_slice(&chunk);
                let size = dst.len() as u64;
                if let Some(m) = t.modes.get_mut(&arg.nodeid_out) {
                    m.size = size;
                }
                reply.written(chunk.len() as u32)
            }
            Op::Readdir(arg) | Op::Readdirplus(arg) => {
                let plus = matches!(op, Op::Readdirplus(_));
                let t = self.tree.lock();
                let mut buf = DirBuf::new(arg.size);
                let Some(list) = t.children.get(&node) else {
                    return buf.send(reply);
                };
                for (&place, (name, ino)) in list.range(arg.offset..) {
                    let m = &t.modes[ino];
                    let off = place + 1;
                    let added = if plus {
                        buf.add_plus(&entry(*ino, m, t.nlink(*ino, m.mode)), off, m.mode, name)
                    } else {
                        buf.add(*ino, off, m.mode, name)
                    };
                    if !added {
                        break;
                    }
                }
                buf.send(reply)
            }
            // oleo's open flags: the page cache survives opens, listings are cached.
            Op::Open { .. } => reply.opened(0, abi::fopen::KEEP_CACHE),
            // Zero-message opendir, as oleo asks for it: listings are then cached.
            Op::Opendir { .. } => reply.error(Errno(libc::ENOSYS)),
            Op::Write { arg, data } => {
                let mut t = self.tree.lock();
                let end = arg.offset as usize + data.len();
                let file = t.data.entry(node).or_default();
                if file.len() < end {
                    file.resize(end, 0);
                }
                file[arg.offset as usize..end].copy_from_slice(data);
                let size = file.len() as u64;
                if let Some(m) = t.modes.get_mut(&node) {
                    m.size = size;
                }
                reply.written(data.len() as u32)
            }
            Op::Read(arg) => {
                let t = self.tree.lock();
                let file = t.data.get(&node).map_or(&[][..], Vec::as_slice);
                let from = (arg.offset as usize).min(file.len());
                let to = (from + arg.size as usize).min(file.len());
                reply.data(&file[from..to])
            }
            Op::Release(_) | Op::Releasedir(_) | Op::Fsync { .. } | Op::Fsyncdir { .. } => {
                reply.ok()
            }
            Op::Forget(_) | Op::BatchForget(_) => reply.none(),
            Op::Statfs => reply.statfs(&abi::StatfsOut {
                blocks: 1 << 30,
                bfree: 1 << 30,
                bavail: 1 << 30,
                files: 1 << 30,
                ffree: 1 << 30,
                bsize: 4096,
                namelen: 255,
                frsize: 4096,
                ..Default::default()
            }),
            _ => reply.error(Errno(libc::ENOSYS)),
        }
    }

    fn destroy(&self) -> std::io::Result<()> {
        Ok(())
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let Some(mnt) = args.get(1) else {
        eprintln!("usage: nullfs MOUNTPOINT [devfuse]");
        std::process::exit(2);
    };
    let uring = args.get(2).map(String::as_str) != Some("devfuse");
    let fd: OwnedFd = match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
    {
        Ok(f) => f.into(),
        Err(e) => {
            eprintln!("nullfs: /dev/fuse: {e}");
            std::process::exit(1);
        }
    };
    let opts = format!(
        "fd={},rootmode=40000,user_id=0,group_id=0,allow_other,default_permissions",
        fd.as_raw_fd()
    );
    let (Ok(opts), Ok(target)) = (CString::new(opts), CString::new(mnt.as_str())) else {
        eprintln!("nullfs: {mnt}: a mount point cannot contain NUL");
        std::process::exit(2);
    };
    // SAFETY: every pointer is a NUL-terminated string that outlives the call.
    let r = unsafe {
        libc::mount(
            c"nullfs".as_ptr(),
            target.as_ptr(),
            c"fuse.nullfs".as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV,
            opts.as_ptr().cast(),
        )
    };
    if r != 0 {
        eprintln!("mount {mnt}: {}", std::io::Error::last_os_error());
        std::process::exit(1);
    }
    let mut tree = Tree {
        next: 1,
        ..Tree::default()
    };
    tree.modes.insert(1, Meta::new(S_IFDIR | 0o755, 0));
    let fs = NullFs {
        uring,
        tree: Mutex::new(tree),
    };
    let session = Session::from_fd(fs, fd, 16, Access::All);
    // Its requests by opcode: read while mounted with the FUSE_STATS ioctl on the root
    // (`oleo mount-stats MNT`, bench/), printed here at unmount.
    let counts = session.request_counts();
    let served = session.run();
    eprintln!(
        "nullfs: FUSE requests served: {}",
        oleo_fuse::transport::counts::summary(&counts.snapshot())
    );
    if let Err(e) = served {
        eprintln!("nullfs: {e}");
        std::process::exit(1);
    }
}
