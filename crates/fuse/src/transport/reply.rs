//! Answers: one reply per request, written to the device as one message (header and body
//! gathered with writev) or, for a request that came through io_uring, kept until the
//! handler returns and then committed through its ring entry; and the notifications the
//! server may send unasked.

use super::abi::{self, OutHeader};
use std::cell::RefCell;
use std::io::IoSlice;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use zerocopy::IntoBytes;

/// An error number for the kernel (positive, as errno).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Errno(
    /// The errno value, e.g. `libc::ENOENT`.
    pub i32,
);

impl Errno {
    /// `EPERM`: Operation not permitted.
    pub const EPERM: Errno = Errno(libc::EPERM);
    /// `EIO`: I/O error.
    pub const EIO: Errno = Errno(libc::EIO);
    /// `EACCES`: Permission denied.
    pub const EACCES: Errno = Errno(libc::EACCES);
    /// `EINVAL`: Invalid argument.
    pub const EINVAL: Errno = Errno(libc::EINVAL);
    /// `ENOSPC`: No space left on device.
    pub const ENOSPC: Errno = Errno(libc::ENOSPC);
    /// `EROFS`: Read-only filesystem.
    pub const EROFS: Errno = Errno(libc::EROFS);
    /// `ERANGE`: Result too large (a buffer too small for an xattr).
    pub const ERANGE: Errno = Errno(libc::ERANGE);
    /// `ENOSYS`: Not implemented (the kernel stops sending that request).
    pub const ENOSYS: Errno = Errno(libc::ENOSYS);
    /// `ENOTTY`: Inappropriate ioctl.
    pub const ENOTTY: Errno = Errno(libc::ENOTTY);
    /// `EOPNOTSUPP`: Operation not supported.
    pub const EOPNOTSUPP: Errno = Errno(libc::EOPNOTSUPP);
    /// `ESTALE`: Stale node id.
    pub const ESTALE: Errno = Errno(libc::ESTALE);
    /// `EOVERFLOW`: Value too large (an inode number that does not fit).
    pub const EOVERFLOW: Errno = Errno(libc::EOVERFLOW);
}

/// One opened /dev/fuse descriptor (the mount's, or a clone of it).
#[derive(Debug)]
pub struct Channel(pub(crate) OwnedFd);

impl Channel {
    /// Writes one whole message. ENOENT means the request was interrupted and the kernel
    /// no longer waits for its answer: not an error.
    pub(crate) fn send(&self, parts: &[IoSlice<'_>]) -> std::io::Result<()> {
        match nix::sys::uio::writev(self.0.as_fd(), parts) {
            Ok(_) | Err(nix::errno::Errno::ENOENT) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}

/// A reply to a request from a ring entry, held until the handler has returned (the
/// request's own bytes live in the buffer the reply is committed from).
#[derive(Debug, Default)]
pub(crate) struct Staged {
    pub error: i32,
    pub body: Vec<u8>,
    /// Some(n): the body is the first n bytes of the entry's payload buffer, written there
    /// by the handler (`Reply::data_into`), and `body` is unused.
    pub in_place: Option<usize>,
}

enum Sink<'a> {
    Device(&'a Channel),
    /// The staged reply, and the entry's payload buffer when the request left it free
    /// (it carried no payload of its own).
    Ring(&'a RefCell<Staged>, Option<&'a mut [u8]>),
}

thread_local! {
    /// A reply body `data_into` fills for a request that came through the device: kept
    /// from one request to the next, so a large READ faults in no fresh pages.
    static SCRATCH: RefCell<oleo::device::IoBuf> = RefCell::new(oleo::device::IoBuf::zeroed(0));
}

/// The answer to one request; sending consumes it. One dropped unsent answers EIO, so the
/// kernel never waits forever on a forgotten request.
pub struct Reply<'a> {
    sink: Sink<'a>,
    unique: u64,
    sent: bool,
}

impl<'a> Reply<'a> {
    pub(crate) fn new(ch: &'a Channel, unique: u64) -> Reply<'a> {
        Reply {
            sink: Sink::Device(ch),
            unique,
            sent: false,
        }
    }

    /// A reply kept in `staged` (which starts as an EIO answer); `payload`: the entry's
    /// payload buffer, when free for the body.
    pub(crate) fn staged(
        staged: &'a RefCell<Staged>,
        unique: u64,
        payload: Option<&'a mut [u8]>,
    ) -> Reply<'a> {
        {
            let mut s = staged.borrow_mut();
            s.error = libc::EIO;
            s.body.clear();
            s.in_place = None;
        }
        Reply {
            sink: Sink::Ring(staged, payload),
            unique,
            sent: false,
        }
    }

    fn send(mut self, error: i32, body: &[&[u8]]) {
        self.sent = true;
        let ch = match self.sink {
            Sink::Device(ch) => ch,
            Sink::Ring(staged, _) => {
                let mut s = staged.borrow_mut();
                s.error = error;
                s.in_place = None;
                s.body.clear();
                body.iter().for_each(|b| s.body.extend_from_slice(b));
                return;
            }
        };
        let len = size_of::<OutHeader>() + body.iter().map(|b| b.len()).sum::<usize>();
        let h = OutHeader {
            len: len as u32,
            error: -error,
            unique: self.unique,
        };
        let mut parts = Vec::with_capacity(body.len() + 1);
        parts.push(IoSlice::new(h.as_bytes()));
        parts.extend(body.iter().map(|b| IoSlice::new(b)));
        if let Err(e) = ch.send(&parts) {
            log::warn!("FUSE reply to request {} failed: {e}", self.unique);
        }
    }

    /// For requests the kernel expects no answer to (FORGET, INTERRUPT).
    pub fn none(mut self) {
        self.sent = true;
    }

    /// Fails the request with `e`.
    pub fn error(self, e: Errno) {
        self.send(e.0, &[])
    }

    /// Success with no body.
    pub fn ok(self) {
        self.send(0, &[])
    }

    /// Success with `data` as the body (READ, READLINK, GETXATTR, LISTXATTR).
    pub fn data(self, data: &[u8]) {
        self.send(0, &[data])
    }

    /// `data`, taken over: a ring entry's reply then keeps it without a copy.
    pub fn data_owned(mut self, data: Vec<u8>) {
        if let Sink::Ring(staged, _) = self.sink {
            self.sent = true;
            let mut s = staged.borrow_mut();
            s.error = 0;
            s.in_place = None;
            s.body = data;
            return;
        }
        self.send(0, &[&data])
    }

    /// Success with the first n bytes of a buffer of `size` that `fill` writes and counts
    /// (READ): a ring entry's own payload buffer when it is free, so the data goes from
    /// the devices to the kernel without a copy here; else a buffer kept per thread.
    pub fn data_into(mut self, size: usize, fill: impl FnOnce(&mut [u8]) -> Result<usize, Errno>) {
        if let Sink::Ring(staged, Some(payload)) = &mut self.sink {
            if payload.len() >= size {
                let r = fill(&mut payload[..size]);
                self.sent = true;
                let mut s = staged.borrow_mut();
                s.body.clear();
                match r {
                    Ok(n) => {
                        s.error = 0;
                        s.in_place = Some(n.min(size));
                    }
                    Err(e) => {
                        s.error = e.0;
                        s.in_place = None;
                    }
                }
                return;
            }
        }
        SCRATCH.with(|cell| {
            let mut buf = cell.borrow_mut();
            if buf.len() < size {
                *buf = oleo::device::IoBuf::huge(size);
            }
            match fill(&mut buf[..size]) {
                Ok(n) => self.send(0, &[&buf[..n.min(size)]]),
                Err(e) => self.error(e),
            }
        })
    }

    /// A LOOKUP, MKNOD, MKDIR, SYMLINK or LINK answer: the entry.
    pub fn entry(self, e: &abi::EntryOut) {
        self.send(0, &[e.as_bytes()])
    }

    /// A GETATTR or SETATTR answer: the attributes.
    pub fn attr(self, a: &abi::AttrOut) {
        self.send(0, &[a.as_bytes()])
    }

    /// An OPEN or OPENDIR answer: the handle and its [`abi::fopen`] flags.
    pub fn opened(self, fh: u64, open_flags: u32) {
        let o = abi::OpenOut {
            fh,
            open_flags,
            backing_id: 0,
        };
        self.send(0, &[o.as_bytes()])
    }

    /// CREATE and TMPFILE: the new entry, and the file opened.
    pub fn created(self, e: &abi::EntryOut, fh: u64, open_flags: u32) {
        let o = abi::OpenOut {
            fh,
            open_flags,
            backing_id: 0,
        };
        self.send(0, &[e.as_bytes(), o.as_bytes()])
    }

    /// A WRITE answer: `n` bytes were written.
    pub fn written(self, n: u32) {
        let w = abi::WriteOut {
            size: n,
            padding: 0,
        };
        self.send(0, &[w.as_bytes()])
    }

    /// A STATX answer.
    pub fn statx(self, s: &abi::StatxOut) {
        self.send(0, &[s.as_bytes()])
    }

    /// A STATFS answer.
    pub fn statfs(self, s: &abi::StatfsOut) {
        self.send(0, &[s.as_bytes()])
    }

    /// GETXATTR/LISTXATTR asked with size 0: how big a buffer the value needs.
    pub fn xattr_size(self, n: u32) {
        let g = abi::GetxattrOut {
            size: n,
            padding: 0,
        };
        self.send(0, &[g.as_bytes()])
    }

    /// An ioctl's result and what it writes back to the caller's argument.
    pub fn ioctl(self, result: i32, out: &[u8]) {
        let o = abi::IoctlOut {
            result,
            flags: 0,
            in_iovs: 0,
            out_iovs: 0,
        };
        self.send(0, &[o.as_bytes(), out])
    }

    /// An LSEEK answer: the offset found.
    pub fn offset(self, offset: u64) {
        self.send(0, &[abi::LseekOut { offset }.as_bytes()])
    }

    pub(crate) fn init(self, out: &abi::InitOut) {
        self.send(0, &[out.as_bytes()])
    }
}

impl Drop for Reply<'_> {
    fn drop(&mut self) {
        if !self.sent {
            log::error!("FUSE request {} left unanswered: EIO", self.unique);
            // A staged reply already says EIO.
            if let Sink::Device(ch) = self.sink {
                let h = OutHeader {
                    len: size_of::<OutHeader>() as u32,
                    error: -libc::EIO,
                    unique: self.unique,
                };
                let _ = ch.send(&[IoSlice::new(h.as_bytes())]);
            }
        }
    }
}

/// A READDIR or READDIRPLUS answer filling up to the size the kernel asked for.
pub struct DirBuf {
    buf: Vec<u8>,
    max: usize,
}

impl DirBuf {
    /// An empty answer holding at most `max` bytes (the READDIR request's size).
    pub fn new(max: u32) -> DirBuf {
        DirBuf {
            buf: Vec::new(),
            max: max as usize,
        }
    }

    /// Adds an entry; false (and nothing added) once the answer is full. `mode` gives the
    /// type (its S_IFMT bits); `off` is where a listing resumes after this entry.
    pub fn add(&mut self, ino: u64, off: u64, mode: u32, name: &[u8]) -> bool {
        self.push(None, ino, off, mode, name)
    }

    /// The same with the entry's attributes (READDIRPLUS): the kernel takes a lookup
    /// reference on every entry added but "." and "..".
    pub fn add_plus(&mut self, e: &abi::EntryOut, off: u64, mode: u32, name: &[u8]) -> bool {
        self.push(Some(e), e.attr.ino, off, mode, name)
    }

    fn push(
        &mut self,
        entry: Option<&abi::EntryOut>,
        ino: u64,
        off: u64,
        mode: u32,
        name: &[u8],
    ) -> bool {
        let head = entry.map_or(0, |_| size_of::<abi::EntryOut>()) + size_of::<abi::DirentHead>();
        let size = (head + name.len()).next_multiple_of(8);
        if self.buf.len() + size > self.max {
            return false;
        }
        if let Some(e) = entry {
            self.buf.extend_from_slice(e.as_bytes());
        }
        let d = abi::DirentHead {
            ino,
            off,
            namelen: name.len() as u32,
            typ: (mode & libc::S_IFMT) >> 12,
        };
        self.buf.extend_from_slice(d.as_bytes());
        self.buf.extend_from_slice(name);
        self.buf.resize(self.buf.len().next_multiple_of(8), 0);
        true
    }

    /// Answers the request with the entries added.
    pub fn send(self, reply: Reply<'_>) {
        reply.data(&self.buf)
    }
}

/// Tells the kernel things unasked: that its cache of an inode is stale. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Notifier(pub(crate) Arc<Channel>);

impl Notifier {
    /// Drops the kernel's cached attributes of `ino` and, from `off` for `len` bytes (all
    /// with len 0; none with off < 0), its cached pages.
    pub fn inval_inode(&self, ino: u64, off: i64, len: i64) -> std::io::Result<()> {
        let body = abi::NotifyInvalInodeOut { ino, off, len };
        let h = OutHeader {
            len: (size_of::<OutHeader>() + size_of::<abi::NotifyInvalInodeOut>()) as u32,
            error: abi::NOTIFY_INVAL_INODE,
            unique: 0,
        };
        self.0
            .send(&[IoSlice::new(h.as_bytes()), IoSlice::new(body.as_bytes())])
    }

    /// Drops the kernel's cached entry `name` in directory `parent` (a negative one too).
    pub fn inval_entry(&self, parent: u64, name: &[u8]) -> std::io::Result<()> {
        let body = abi::NotifyInvalEntryOut {
            parent,
            namelen: name.len() as u32,
            flags: 0,
        };
        let len = size_of::<OutHeader>() + size_of::<abi::NotifyInvalEntryOut>() + name.len() + 1;
        let h = OutHeader {
            len: len as u32,
            error: abi::NOTIFY_INVAL_ENTRY,
            unique: 0,
        };
        self.0.send(&[
            IoSlice::new(h.as_bytes()),
            IoSlice::new(body.as_bytes()),
            IoSlice::new(name),
            IoSlice::new(&[0]),
        ])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dirents_are_padded_and_stop_when_full() {
        let mut d = DirBuf::new(64);
        assert!(d.add(5, 1, libc::S_IFDIR, b"."));
        assert_eq!(d.buf.len(), 32);
        assert!(d.add(6, 2, libc::S_IFREG, b"abcdefgh"));
        assert_eq!(d.buf.len(), 64);
        assert!(!d.add(7, 3, libc::S_IFREG, b"x"));
        assert_eq!(d.buf[16..24], [1, 0, 0, 0, 4, 0, 0, 0]);
    }
}
