//! Uncached data IO through io_uring: each thread submits its request to a ring of its
//! own and waits for it. A synchronous O_DIRECT pwrite keeps the host filesystem's inode
//! lock until the disk answers when it fills a hole of a sparse image (ext4, xfs), which
//! serialises every writer; submitted through a ring, the lock covers the submission only,
//! so many requests are in flight at once. A file read puts all its device reads in flight
//! together (`read_batch`), as the kernel sends its bios, and hears of each as it ends.
//! Where io_uring is unavailable (seccomp, an old kernel) the caller falls back to
//! pread/pwrite.

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

/// Entries of a thread's ring: the most reads of one batch in flight at once.
const RING_SIZE: u32 = 32;

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
        let ring = slot
            .get_or_insert_with(|| IoUring::new(RING_SIZE).ok())
            .as_mut()?;
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

/// One read of a batch: the bytes at `offset` of `fd`, scattered over `iov` in order.
pub(crate) struct VecRead {
    pub fd: RawFd,
    pub offset: u64,
    pub iov: Vec<libc::iovec>,
}

impl VecRead {
    fn len(&self) -> usize {
        self.iov.iter().map(|v| v.iov_len).sum()
    }
}

/// Runs every read of `reqs` at once through this thread's ring (a device's reads of one
/// request all in flight together, as the kernel's bios are) and returns each one's
/// result; `done(i)` runs as soon as read i has all its bytes, while later ones are still
/// in flight (the caller checks what has come). A short read is finished with preadv;
/// without a ring, all go through preadv.
///
/// SAFETY (for callers): every iovec must point to memory valid for writes and not
/// otherwise accessed until this returns, except a read's own memory from `done` on.
pub(crate) unsafe fn read_batch(
    reqs: &[VecRead],
    done: &mut dyn FnMut(usize),
) -> Vec<io::Result<()>> {
    // Bytes each request got from the ring; None: not run there (error or no ring).
    let mut got: Vec<Option<usize>> = vec![None; reqs.len()];
    RING.with(|cell| {
        let mut slot = cell.borrow_mut();
        let Some(ring) = slot
            .get_or_insert_with(|| IoUring::new(RING_SIZE).ok())
            .as_mut()
        else {
            return;
        };
        for (base, group) in reqs.chunks(RING_SIZE as usize).enumerate() {
            let first = NEXT_ID.with(|n| {
                let id = n.get();
                n.set(id.wrapping_add(group.len() as u64));
                id
            });
            for (i, r) in group.iter().enumerate() {
                let sqe = opcode::Readv::new(types::Fd(r.fd), r.iov.as_ptr(), r.iov.len() as u32)
                    .offset(r.offset)
                    .build()
                    .user_data(first.wrapping_add(i as u64));
                // SAFETY: the iovecs and their buffers outlive the request: every one
                // pushed is waited for below.
                if unsafe { ring.submission().push(&sqe) }.is_err() {
                    break;
                }
            }
            let pushed = ring.submission().len();
            let mut pending = pushed;
            let mut failures = 0u32;
            while pending > 0 {
                match ring.submit_and_wait(1) {
                    Ok(_) => failures = 0,
                    Err(e) if retry(&e) => {}
                    Err(_) if ring.submission().len() == pushed && pending == pushed => {
                        // None of this group reached the kernel, so none runs on the
                        // buffers: leave the ring and read them all with preadv.
                        ring.submission().sync();
                        *slot = Some(None);
                        return;
                    }
                    Err(e) => {
                        // Some are in flight on the caller's buffers: they must be waited
                        // for; a ring that keeps failing is beyond repair.
                        failures += 1;
                        if failures > 10_000 {
                            log::error!("io_uring keeps failing with reads in flight: {e}");
                            std::process::abort();
                        }
                    }
                }
                for cqe in ring.completion() {
                    let i = cqe.user_data().wrapping_sub(first) as usize;
                    if i < pushed {
                        pending -= 1;
                        let at = base * RING_SIZE as usize + i;
                        if cqe.result() >= 0 {
                            got[at] = Some(cqe.result() as usize);
                            if cqe.result() as usize >= reqs[at].len() {
                                done(at);
                            }
                        }
                    }
                }
            }
        }
    });
    reqs.iter()
        .zip(got)
        .enumerate()
        .map(|(i, (r, g))| {
            let have = g.unwrap_or(0);
            if have >= r.len() {
                return Ok(());
            }
            let res = preadv_all(r, have);
            if res.is_ok() {
                done(i);
            }
            res
        })
        .collect()
}

/// Reads what is left of `r` after its first `done` bytes with preadv, until all of it is
/// there (EOF before that is an error).
fn preadv_all(r: &VecRead, mut done: usize) -> io::Result<()> {
    let total = r.len();
    while done < total {
        // The iovecs from byte `done` on.
        let mut skip = done;
        let mut iov: Vec<libc::iovec> = Vec::with_capacity(r.iov.len());
        for v in &r.iov {
            if skip >= v.iov_len {
                skip -= v.iov_len;
                continue;
            }
            iov.push(libc::iovec {
                // SAFETY: within the caller's buffer (skip < iov_len).
                iov_base: unsafe { v.iov_base.cast::<u8>().add(skip) }.cast(),
                iov_len: v.iov_len - skip,
            });
            skip = 0;
        }
        let n = iov.len().min(libc::UIO_MAXIOV as usize) as libc::c_int;
        // SAFETY: the iovecs point into the caller's buffers, valid for writes.
        let r = unsafe { libc::preadv(r.fd, iov.as_ptr(), n, (r.offset + done as u64) as i64) };
        match r {
            r if r < 0 => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
            0 => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "device ended before the transfer did",
                ))
            }
            n => done += n as usize,
        }
    }
    Ok(())
}
