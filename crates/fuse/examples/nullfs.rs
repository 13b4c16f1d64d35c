//! The FUSE floor: a filesystem on oleo's transport that keeps names and attributes in
//! hash maps, and file contents in memory (fs_mark keeps its own logs in the tree it
//! tests, dbench reads back what it wrote), and nothing else: no disk, no commit, an
//! fsync that returns at once, no xattrs. It answers opens, listings and INIT as oleo does
//! (KEEP_CACHE, CACHE_DIR, READDIRPLUS). What a workload reaches on it is the
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
use std::collections::HashMap;
use std::ffi::CString;
use std::os::fd::{AsRawFd, OwnedFd};

const S_IFDIR: u32 = 0o040000;
const S_IFREG: u32 = 0o100000;

#[derive(Default)]
struct Tree {
    names: HashMap<(u64, Vec<u8>), u64>,
    /// Inode -> (mode, size).
    modes: HashMap<u64, (u32, u64)>,
    /// Directory -> its entries in creation order (a listing's offsets index them).
    children: HashMap<u64, Vec<(Vec<u8>, u64)>>,
    data: HashMap<u64, Vec<u8>>,
    next: u64,
}

impl Tree {
    /// `ino` lost its name in `dir` (nullfs has no hard links): its contents go, so that
    /// a workload that deletes what it wrote (dbench) runs in bounded memory.
    fn forget_name(&mut self, dir: u64, ino: u64) {
        if let Some(c) = self.children.get_mut(&dir) {
            c.retain(|&(_, i)| i != ino);
        }
        self.data.remove(&ino);
    }
}

struct NullFs {
    uring: bool,
    tree: Mutex<Tree>,
}

fn attr(ino: u64, mode: u32, size: u64) -> abi::Attr {
    abi::Attr {
        ino,
        size,
        mode,
        nlink: if mode & S_IFDIR != 0 { 2 } else { 1 },
        blksize: 4096,
        ..Default::default()
    }
}

fn entry(ino: u64, mode: u32, size: u64) -> abi::EntryOut {
    abi::EntryOut {
        nodeid: ino,
        entry_valid: 1,
        attr_valid: 1,
        attr: attr(ino, mode, size),
        ..Default::default()
    }
}

impl NullFs {
    fn make(&self, parent: u64, name: &[u8], mode: u32) -> Result<abi::EntryOut, Errno> {
        let mut t = self.tree.lock();
        if t.names.contains_key(&(parent, name.to_vec())) {
            return Err(Errno(libc::EEXIST));
        }
        t.next += 1;
        let ino = t.next;
        t.names.insert((parent, name.to_vec()), ino);
        t.modes.insert(ino, (mode, 0));
        t.children
            .entry(parent)
            .or_default()
            .push((name.to_vec(), ino));
        Ok(entry(ino, mode, 0))
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
                match t.names.get(&(node, name.to_vec())) {
                    Some(&ino) => {
                        let (mode, size) = t.modes[&ino];
                        reply.entry(&entry(ino, mode, size))
                    }
                    None => reply.entry(&abi::EntryOut {
                        entry_valid: 1,
                        ..Default::default()
                    }),
                }
            }
            Op::Getattr { .. } | Op::Setattr(_) => {
                let mut t = self.tree.lock();
                if let Op::Setattr(arg) = &op {
                    if arg.valid & abi::fattr::SIZE != 0 {
                        t.data.entry(node).or_default().resize(arg.size as usize, 0);
                        if let Some(m) = t.modes.get_mut(&node) {
                            m.1 = arg.size;
                        }
                    }
                }
                match t.modes.get(&node) {
                    Some(&(mode, size)) => reply.attr(&abi::AttrOut {
                        attr_valid: 1,
                        attr: attr(node, mode, size),
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
            Op::Unlink { name } | Op::Rmdir { name } => {
                let mut t = self.tree.lock();
                match t.names.remove(&(node, name.to_vec())) {
                    Some(ino) => {
                        t.forget_name(node, ino);
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
                let Some(ino) = t.names.remove(&(node, name.to_vec())) else {
                    return reply.error(Errno(libc::ENOENT));
                };
                if let Some(c) = t.children.get_mut(&node) {
                    c.retain(|&(_, i)| i != ino);
                }
                if let Some(old) = t.names.insert((newdir, newname.to_vec()), ino) {
                    t.forget_name(newdir, old);
                }
                let c = t.children.entry(newdir).or_default();
                c.push((newname.to_vec(), ino));
                reply.ok()
            }
            // No xattrs, answered as oleo answers a file without them (ENOSYS would make
            // the kernel stop asking, which oleo cannot let it do).
            Op::Getxattr { .. } => reply.error(Errno(libc::ENODATA)),
            Op::Readdir(arg) | Op::Readdirplus(arg) => {
                let plus = matches!(op, Op::Readdirplus(_));
                let t = self.tree.lock();
                let mut buf = DirBuf::new(arg.size);
                let list = t.children.get(&node).map_or(&[][..], Vec::as_slice);
                for (i, (name, ino)) in list.iter().enumerate().skip(arg.offset as usize) {
                    let (mode, size) = t.modes[ino];
                    let off = i as u64 + 1;
                    let added = if plus {
                        buf.add_plus(&entry(*ino, mode, size), off, mode, name)
                    } else {
                        buf.add(*ino, off, mode, name)
                    };
                    if !added {
                        break;
                    }
                }
                buf.send(reply)
            }
            // oleo's open flags: the page cache survives opens, listings are cached.
            Op::Open { .. } => reply.opened(0, abi::fopen::KEEP_CACHE),
            Op::Opendir { .. } => reply.opened(0, abi::fopen::KEEP_CACHE | abi::fopen::CACHE_DIR),
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
                    m.1 = size;
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
        "fd={},rootmode=40000,user_id=0,group_id=0,allow_other",
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
    tree.modes.insert(1, (S_IFDIR | 0o755, 0));
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
