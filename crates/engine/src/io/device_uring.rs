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
    /// Ids of this thread's requests, to tell their completions apart.
    static NEXT_ID: std::cell::Cell<u64> = const { std::cell::Cell::new(1) };
}

/// Errors of io_uring_enter after which the wait is simply tried again.
fn retry(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EINTR | libc::EAGAIN | libc::EBUSY)
    )
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
            let id = NEXT_ID.with(|n| {
                let id = n.get();
                n.set(id.wrapping_add(1));
                id
            });
            let sqe = sqe.user_data(id);
            // SAFETY: the buffer outlives the request (we wait for it below).
            if unsafe { ring.submission().push(&sqe) }.is_err() {
                return Some(Err(io::Error::other("io_uring submission queue full")));
            }
            // Until this request's own completion is there: io_uring_enter returns once the
            // request is submitted even when a signal cut its wait short, and the request
            // still runs then (the buffer must outlive it); a completion of another id is
            // not ours to take.
            let result = loop {
                match ring.submit_and_wait(1) {
                    Ok(_) => {}
                    Err(e) if retry(&e) => {}
                    Err(e) => {
                        if !ring.submission().is_empty() {
                            // Never reached the kernel: nothing runs on the buffer.
                            ring.submission().sync();
                            *slot = Some(None);
                            return Some(Err(e));
                        }
                    }
                }
                let mut mine = None;
                for cqe in ring.completion() {
                    if cqe.user_data() == id {
                        mine = Some(cqe.result());
                    }
                }
                if let Some(r) = mine {
                    break r;
                }
            };
            if result == -libc::EINTR || result == -libc::EAGAIN {
                continue;
            }
            match result {
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
