//! Uncached data IO through io_uring: each thread submits its request to a ring of its
//! own and waits for it. A synchronous O_DIRECT pwrite keeps the host filesystem's inode
//! lock until the disk answers when it fills a hole of a sparse image (ext4, xfs), which
//! serialises every writer; submitted through a ring, the lock covers the submission only,
//! so many requests are in flight at once. Where io_uring is unavailable (seccomp, an old
//! kernel) the caller falls back to pread/pwrite.

use io_uring::{opcode, types, IoUring};
use std::cell::RefCell;
use std::io;
use std::os::fd::RawFd;

thread_local! {
    /// None until first used; Some(None) where rings cannot be set up.
    static RING: RefCell<Option<Option<IoUring>>> = const { RefCell::new(None) };
}

/// Runs one read (`write` false) or write of `len` bytes at `ptr` and file `offset` on
/// `fd` through this thread's ring, until done; None if this thread has no ring.
fn transfer(
    fd: RawFd,
    ptr: *mut u8,
    len: usize,
    offset: u64,
    write: bool,
) -> Option<io::Result<()>> {
    RING.with(|cell| {
        let mut slot = cell.borrow_mut();
        let ring = slot.get_or_insert_with(|| IoUring::new(4).ok()).as_mut()?;
        let mut done = 0usize;
        while done < len {
            // SAFETY: `ptr..ptr + len` stays valid and unaliased until this loop returns,
            // as the callers' borrows guarantee; the request completes before the next.
            let (at, n) = (unsafe { ptr.add(done) }, (len - done) as u32);
            let off = offset + done as u64;
            let sqe = if write {
                opcode::Write::new(types::Fd(fd), at, n).offset(off).build()
            } else {
                opcode::Read::new(types::Fd(fd), at, n).offset(off).build()
            };
            // SAFETY: the buffer outlives the request (we wait for it below).
            if unsafe { ring.submission().push(&sqe) }.is_err() {
                return Some(Err(io::Error::other("io_uring submission queue full")));
            }
            if let Err(e) = ring.submit_and_wait(1) {
                return Some(Err(e));
            }
            let Some(cqe) = ring.completion().next() else {
                return Some(Err(io::Error::other("io_uring completion missing")));
            };
            match cqe.result() {
                r if r < 0 => return Some(Err(io::Error::from_raw_os_error(-r))),
                0 => {
                    return Some(Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "device ended before the transfer did",
                    )))
                }
                r => done += r as usize,
            }
        }
        Some(Ok(()))
    })
}

/// Writes all of `buf` at `offset` through the thread's ring; None: no ring here.
pub(crate) fn write_at(fd: RawFd, buf: &[u8], offset: u64) -> Option<io::Result<()>> {
    transfer(fd, buf.as_ptr().cast_mut(), buf.len(), offset, true)
}

/// Fills `buf` from `offset` through the thread's ring; None: no ring here.
pub(crate) fn read_at(fd: RawFd, buf: &mut [u8], offset: u64) -> Option<io::Result<()>> {
    transfer(fd, buf.as_mut_ptr(), buf.len(), offset, false)
}
