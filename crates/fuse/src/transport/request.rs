//! Decoding one request the kernel sent: its header and what the opcode carries. A request
//! that does not parse is answered EINVAL (a kernel we do not understand), never trusted.

use super::abi::{self, opcode, InHeader};
use std::sync::atomic::{AtomicBool, Ordering};
use zerocopy::FromBytes;

/// Who asked, and about which node (from the request's `fuse_in_header`).
#[derive(Clone, Copy, Debug)]
pub struct Request {
    /// The request's id, unique among those in flight.
    pub unique: u64,
    /// The node the request is about (for creates and lookups: the parent directory).
    pub nodeid: u64,
    /// The caller's filesystem uid, or [`abi::INVALID_UIDGID`] (ALLOW_IDMAP: any request
    /// but those that make an inode). On an idmapped mount, mapped through its idmap.
    pub uid: u32,
    /// The caller's filesystem gid, or [`abi::INVALID_UIDGID`], as `uid`.
    pub gid: u32,
    /// The caller's thread id.
    pub pid: u32,
}

/// What the kernel asks for, by opcode. Names are bytes without their NUL; "the node" is
/// [`Request::nodeid`].
#[derive(Debug)]
pub enum Op<'a> {
    /// INIT: the kernel's side of the handshake and its capabilities, all 64 bits
    /// (`flags | flags2 << 32`). The session answers it, asking
    /// [`Handler::init`](super::Handler::init); a handler never sees it.
    Init(abi::InitIn, u64),
    /// DESTROY: the connection is going away. The session answers it, and calls
    /// [`Handler::destroy`](super::Handler::destroy) once the workers are done.
    Destroy,
    /// INTERRUPT: the kernel gave up on a request. The session drops it (no reply).
    Interrupt,
    /// LOOKUP of `name` in the directory node.
    Lookup {
        /// The name looked up.
        name: &'a [u8],
    },
    /// FORGET: drop this many lookup references to the node (no reply).
    Forget(u64),
    /// BATCH_FORGET: FORGET for each node listed (no reply).
    BatchForget(Vec<abi::ForgetOne>),
    /// GETATTR of the node.
    Getattr {
        /// The open handle asked about, if the caller used one (fstat).
        fh: Option<u64>,
    },
    /// SETATTR of the node: chmod, chown, truncate, utimes.
    Setattr(abi::SetattrIn),
    /// READLINK: the symlink node's target.
    Readlink,
    /// SYMLINK: create `name` in the directory node, pointing to `target`.
    Symlink {
        /// Name of the new link.
        name: &'a [u8],
        /// What it points to.
        target: &'a [u8],
    },
    /// MKNOD: create a device, fifo, socket or file `name` in the directory node.
    Mknod {
        /// Mode, device number and umask.
        arg: abi::MknodIn,
        /// Name of the new node.
        name: &'a [u8],
    },
    /// MKDIR: create directory `name` in the directory node.
    Mkdir {
        /// Mode and umask.
        arg: abi::MkdirIn,
        /// Name of the new directory.
        name: &'a [u8],
    },
    /// UNLINK `name` from the directory node.
    Unlink {
        /// The name removed.
        name: &'a [u8],
    },
    /// RMDIR: remove directory `name` from the directory node.
    Rmdir {
        /// The name removed.
        name: &'a [u8],
    },
    /// RENAME or RENAME2: move `name` of the directory node to `newname` in `newdir`.
    Rename {
        /// Node id of the target directory.
        newdir: u64,
        /// renameat2(2) flags (0 for RENAME).
        flags: u32,
        /// The name moved.
        name: &'a [u8],
        /// Its new name.
        newname: &'a [u8],
    },
    /// LINK: make `oldnode` also known as `name` in the directory node.
    Link {
        /// The node linked.
        oldnode: u64,
        /// The new name.
        name: &'a [u8],
    },
    /// OPEN the file node.
    Open {
        /// open(2) flags.
        flags: u32,
        /// `FUSE_OPEN_*` flags.
        open_flags: u32,
    },
    /// READ from an open file.
    Read(abi::ReadIn),
    /// WRITE `data` to an open file.
    Write {
        /// Handle, offset and flags.
        arg: abi::WriteIn,
        /// The bytes to write.
        data: &'a [u8],
    },
    /// STATFS of the filesystem.
    Statfs,
    /// RELEASE: the last reference to an open file's handle went away.
    Release(abi::ReleaseIn),
    /// FSYNC of an open file.
    Fsync {
        /// The handle.
        fh: u64,
        /// fdatasync: data only.
        datasync: bool,
    },
    /// SETXATTR `name` of the node to `value`.
    Setxattr {
        /// setxattr(2) flags (XATTR_CREATE, XATTR_REPLACE).
        flags: u32,
        /// SETXATTR_EXT's flags (0 without it).
        setxattr_flags: u32,
        /// The attribute's full name.
        name: &'a [u8],
        /// Its new value.
        value: &'a [u8],
    },
    /// GETXATTR `name` of the node.
    Getxattr {
        /// Size of the caller's buffer; 0 asks for the size needed.
        size: u32,
        /// The attribute's full name.
        name: &'a [u8],
    },
    /// LISTXATTR: the node's attribute names.
    Listxattr {
        /// Size of the caller's buffer; 0 asks for the size needed.
        size: u32,
    },
    /// REMOVEXATTR `name` of the node.
    Removexattr {
        /// The attribute's full name.
        name: &'a [u8],
    },
    /// FLUSH: a close(2) of a descriptor of an open file.
    Flush,
    /// OPENDIR: open the directory node.
    Opendir {
        /// open(2) flags.
        flags: u32,
    },
    /// READDIR: list the directory from an offset.
    Readdir(abi::ReadIn),
    /// READDIRPLUS: list the directory, with each entry's attributes.
    Readdirplus(abi::ReadIn),
    /// RELEASEDIR: the last reference to an open directory's handle went away.
    Releasedir(abi::ReleaseIn),
    /// FSYNCDIR of an open directory.
    Fsyncdir {
        /// The handle.
        fh: u64,
        /// fdatasync: data only.
        datasync: bool,
    },
    /// ACCESS: may the caller access the node as `mask` says.
    Access {
        /// access(2) mode: R_OK, W_OK, X_OK, F_OK.
        mask: u32,
    },
    /// CREATE and open file `name` in the directory node.
    Create {
        /// open(2) flags, mode and umask.
        arg: abi::CreateIn,
        /// Name of the new file.
        name: &'a [u8],
    },
    /// STATX of the node.
    Statx(abi::StatxIn),
    /// O_TMPFILE in directory `nodeid`: a create without a name.
    Tmpfile(abi::CreateIn),
    /// FALLOCATE: allocate or punch a range of an open file.
    Fallocate(abi::FallocateIn),
    /// LSEEK with SEEK_DATA or SEEK_HOLE.
    Lseek(abi::LseekIn),
    /// COPY_FILE_RANGE from the node's open file to another.
    CopyFileRange(abi::CopyFileRangeIn),
    /// SYNCFS: sync the whole filesystem.
    Syncfs,
    /// IOCTL on an open file, with the `in_size` bytes of its argument.
    Ioctl {
        /// Handle, command and sizes.
        arg: abi::IoctlIn,
        /// The argument's bytes.
        data: &'a [u8],
    },
    /// An opcode we do not serve: answered ENOSYS, so the kernel stops asking.
    Unknown(u32),
}

/// A malformed request.
#[derive(Debug)]
pub struct Malformed;

/// Reads fixed structs and NUL-terminated names off the front of a request's body.
struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn get<T: FromBytes>(&mut self) -> Result<T, Malformed> {
        let (v, rest) = T::read_from_prefix(self.0).map_err(|_| Malformed)?;
        self.0 = rest;
        Ok(v)
    }

    fn name(&mut self) -> Result<&'a [u8], Malformed> {
        let end = self.0.iter().position(|&b| b == 0).ok_or(Malformed)?;
        let (name, rest) = self.0.split_at(end);
        self.0 = &rest[1..];
        Ok(name)
    }

    fn bytes(&mut self, n: usize) -> Result<&'a [u8], Malformed> {
        if self.0.len() < n {
            return Err(Malformed);
        }
        let (b, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(b)
    }
}

/// Whether the kernel sends SETXATTR's longer header (set once, at INIT).
static SETXATTR_EXT: AtomicBool = AtomicBool::new(false);

/// Records what INIT agreed on that changes how requests are laid out.
pub fn set_setxattr_ext(on: bool) {
    SETXATTR_EXT.store(on, Ordering::Relaxed);
}

/// Splits a buffer read from the device into the request and its operation.
pub fn parse(buf: &[u8]) -> Result<(Request, Op<'_>), (Option<u64>, Malformed)> {
    let (h, _) = InHeader::read_from_prefix(buf).map_err(|_| (None, Malformed))?;
    let unique = h.unique;
    let len = h.len as usize;
    if len > buf.len() || len < size_of::<InHeader>() {
        return Err((Some(unique), Malformed));
    }
    // Extensions (security context, supplementary groups) sit at the end; we ask for none.
    let body_end = len
        .checked_sub(usize::from(h.total_extlen) * 8)
        .filter(|&e| e >= size_of::<InHeader>())
        .ok_or((Some(unique), Malformed))?;
    let mut c = Cursor(&buf[size_of::<InHeader>()..body_end]);
    let op = op(h.opcode, &mut c).map_err(|e| (Some(unique), e))?;
    let req = Request {
        unique,
        nodeid: h.nodeid,
        uid: h.uid,
        gid: h.gid,
        pid: h.pid,
    };
    Ok((req, op))
}

fn op<'a>(code: u32, c: &mut Cursor<'a>) -> Result<Op<'a>, Malformed> {
    Ok(match code {
        opcode::INIT => {
            let init: abi::InitIn = c.get()?;
            // flags2 follows when the kernel has INIT_EXT (7.36+).
            let high = if u64::from(init.flags) & abi::init::INIT_EXT != 0 {
                c.get::<u32>().map_or(0, u64::from)
            } else {
                0
            };
            Op::Init(init, u64::from(init.flags) | high << 32)
        }
        opcode::DESTROY => Op::Destroy,
        opcode::INTERRUPT => Op::Interrupt,
        opcode::LOOKUP => Op::Lookup { name: c.name()? },
        opcode::FORGET => Op::Forget(c.get::<abi::ForgetIn>()?.nlookup),
        opcode::BATCH_FORGET => {
            let head: abi::BatchForgetIn = c.get()?;
            let n = head.count as usize;
            let mut all = Vec::with_capacity(n.min(4096));
            for _ in 0..n {
                all.push(c.get::<abi::ForgetOne>()?);
            }
            Op::BatchForget(all)
        }
        opcode::GETATTR => {
            let g: abi::GetattrIn = c.get()?;
            Op::Getattr {
                fh: (g.getattr_flags & abi::GETATTR_FH != 0).then_some(g.fh),
            }
        }
        opcode::SETATTR => Op::Setattr(c.get()?),
        opcode::READLINK => Op::Readlink,
        opcode::SYMLINK => {
            let name = c.name()?;
            Op::Symlink {
                name,
                target: c.name()?,
            }
        }
        opcode::MKNOD => Op::Mknod {
            arg: c.get()?,
            name: c.name()?,
        },
        opcode::MKDIR => Op::Mkdir {
            arg: c.get()?,
            name: c.name()?,
        },
        opcode::UNLINK => Op::Unlink { name: c.name()? },
        opcode::RMDIR => Op::Rmdir { name: c.name()? },
        opcode::RENAME => {
            let newdir = c.get::<abi::RenameIn>()?.newdir;
            Op::Rename {
                newdir,
                flags: 0,
                name: c.name()?,
                newname: c.name()?,
            }
        }
        opcode::RENAME2 => {
            let r: abi::Rename2In = c.get()?;
            Op::Rename {
                newdir: r.newdir,
                flags: r.flags,
                name: c.name()?,
                newname: c.name()?,
            }
        }
        opcode::LINK => Op::Link {
            oldnode: c.get::<abi::LinkIn>()?.oldnodeid,
            name: c.name()?,
        },
        opcode::OPEN => {
            let o: abi::OpenIn = c.get()?;
            Op::Open {
                flags: o.flags,
                open_flags: o.open_flags,
            }
        }
        opcode::READ => Op::Read(c.get()?),
        opcode::WRITE => {
            let arg: abi::WriteIn = c.get()?;
            Op::Write {
                arg,
                data: c.bytes(arg.size as usize)?,
            }
        }
        opcode::STATFS => Op::Statfs,
        opcode::RELEASE => Op::Release(c.get()?),
        opcode::FSYNC | opcode::FSYNCDIR => {
            let f: abi::FsyncIn = c.get()?;
            let datasync = f.fsync_flags & abi::FSYNC_FDATASYNC != 0;
            if code == opcode::FSYNC {
                Op::Fsync { fh: f.fh, datasync }
            } else {
                Op::Fsyncdir { fh: f.fh, datasync }
            }
        }
        opcode::SETXATTR => {
            // The longer header only once INIT agreed on SETXATTR_EXT.
            let (size, flags) = (c.get::<u32>()?, c.get::<u32>()?);
            let setxattr_flags = if SETXATTR_EXT.load(Ordering::Relaxed) {
                let ext = (c.get::<u32>()?, c.get::<u32>()?);
                ext.0
            } else {
                0
            };
            let name = c.name()?;
            Op::Setxattr {
                flags,
                setxattr_flags,
                name,
                value: c.bytes(size as usize)?,
            }
        }
        opcode::GETXATTR => {
            let g: abi::GetxattrIn = c.get()?;
            Op::Getxattr {
                size: g.size,
                name: c.name()?,
            }
        }
        opcode::LISTXATTR => Op::Listxattr {
            size: c.get::<abi::GetxattrIn>()?.size,
        },
        opcode::REMOVEXATTR => Op::Removexattr { name: c.name()? },
        opcode::FLUSH => Op::Flush,
        opcode::OPENDIR => Op::Opendir {
            flags: c.get::<abi::OpenIn>()?.flags,
        },
        opcode::READDIR => Op::Readdir(c.get()?),
        opcode::READDIRPLUS => Op::Readdirplus(c.get()?),
        opcode::RELEASEDIR => Op::Releasedir(c.get()?),
        opcode::ACCESS => Op::Access {
            mask: c.get::<u32>()?,
        },
        opcode::CREATE => Op::Create {
            arg: c.get()?,
            name: c.name()?,
        },
        // The kernel sends a placeholder name ("/"): it means nothing.
        opcode::TMPFILE => Op::Tmpfile(c.get()?),
        opcode::STATX => Op::Statx(c.get()?),
        opcode::FALLOCATE => Op::Fallocate(c.get()?),
        opcode::LSEEK => Op::Lseek(c.get()?),
        opcode::COPY_FILE_RANGE => Op::CopyFileRange(c.get()?),
        opcode::SYNCFS => Op::Syncfs,
        opcode::IOCTL => {
            let arg: abi::IoctlIn = c.get()?;
            Op::Ioctl {
                arg,
                data: c.bytes(arg.in_size as usize)?,
            }
        }
        other => Op::Unknown(other),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use zerocopy::IntoBytes;

    fn message(opcode: u32, body: &[u8]) -> Vec<u8> {
        let h = InHeader {
            len: (size_of::<InHeader>() + body.len()) as u32,
            opcode,
            unique: 7,
            nodeid: 1,
            uid: 1000,
            gid: 100,
            pid: 42,
            ..Default::default()
        };
        let mut v = h.as_bytes().to_vec();
        v.extend_from_slice(body);
        v
    }

    #[test]
    fn names_and_structs_decode() {
        let mut body = abi::Rename2In {
            newdir: 9,
            flags: 1,
            padding: 0,
        }
        .as_bytes()
        .to_vec();
        body.extend_from_slice(b"old\0new\0");
        let buf = message(opcode::RENAME2, &body);
        let (req, op) = parse(&buf).unwrap();
        assert_eq!((req.unique, req.uid, req.pid), (7, 1000, 42));
        match op {
            Op::Rename {
                newdir,
                flags,
                name,
                newname,
            } => assert_eq!(
                (newdir, flags, name, newname),
                (9, 1, &b"old"[..], &b"new"[..])
            ),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn setxattr_header_follows_what_init_agreed() {
        let body = |ext: bool| {
            let mut b = [3u32, 1].as_bytes().to_vec();
            if ext {
                b.extend_from_slice([abi::SETXATTR_ACL_KILL_SGID, 0].as_bytes());
            }
            b.extend_from_slice(b"user.a\0xyz");
            b
        };
        let decoded = |ext: bool| match parse(&message(opcode::SETXATTR, &body(ext))).unwrap().1 {
            Op::Setxattr {
                flags,
                setxattr_flags,
                name,
                value,
            } => (flags, setxattr_flags, name.to_vec(), value.to_vec()),
            other => panic!("{other:?}"),
        };
        // One test flips the switch, so both layouts are checked here in turn.
        set_setxattr_ext(true);
        let with = decoded(true);
        set_setxattr_ext(false);
        let without = decoded(false);
        assert_eq!(with, (1, 1, b"user.a".to_vec(), b"xyz".to_vec()));
        assert_eq!(without, (1, 0, b"user.a".to_vec(), b"xyz".to_vec()));
    }

    #[test]
    fn statx_decodes() {
        let body = abi::StatxIn {
            getattr_flags: abi::GETATTR_FH,
            fh: 5,
            sx_mask: abi::STATX_BTIME,
            ..Default::default()
        };
        match parse(&message(opcode::STATX, body.as_bytes())).unwrap().1 {
            Op::Statx(s) => assert_eq!((s.fh, s.sx_mask), (5, abi::STATX_BTIME)),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn truncated_requests_are_refused_not_trusted() {
        // A name without its NUL, a write claiming more data than came, a short header.
        let buf = message(opcode::LOOKUP, b"abc");
        assert!(matches!(parse(&buf), Err((Some(7), _))));
        let mut w = abi::WriteIn {
            size: 100,
            ..Default::default()
        }
        .as_bytes()
        .to_vec();
        w.extend_from_slice(&[0; 10]);
        assert!(parse(&message(opcode::WRITE, &w)).is_err());
        assert!(matches!(parse(&[0; 10]), Err((None, _))));
        let mut lying = message(opcode::STATFS, &[]);
        lying[0] = 200;
        assert!(parse(&lying).is_err());
    }

    #[test]
    fn tmpfile_is_a_create_without_a_name() {
        let mut body = abi::CreateIn {
            flags: 2,
            mode: 0o100600,
            umask: 0o22,
            open_flags: 0,
        }
        .as_bytes()
        .to_vec();
        body.extend_from_slice(b"/\0");
        match parse(&message(opcode::TMPFILE, &body)).unwrap().1 {
            Op::Tmpfile(c) => assert_eq!((c.mode, c.umask), (0o100600, 0o22)),
            other => panic!("{other:?}"),
        }
    }
}
