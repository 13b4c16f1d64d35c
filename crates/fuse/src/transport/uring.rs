//! FUSE over io_uring (Linux 6.14+, with the fuse module's `enable_uring` set): the kernel
//! keeps one queue per possible CPU and puts a request on the queue of the CPU its caller
//! runs on. We serve each queue with a few threads pinned to that CPU, each owning one
//! ring entry (a header block and a payload buffer registered with the kernel) and its
//! own io_uring. One io_uring command both commits a reply and waits for the next request,
//! so a request costs no read or write system call, and its caller and its server share a
//! CPU instead of waking each other across CPUs.
//!
//! The kernel hands a new request to the entry that became free last, so the thread that
//! just answered takes the next one while it is still running; a handler that waits for
//! long (an fsync) holds only its own entry while the queue's other threads go on.
//! FORGET and INTERRUPT still come through /dev/fuse (the session's device workers).

use super::abi::{uring as u, InHeader, OutHeader};
use super::reply::{Channel, Errno, Reply, Staged};
use super::request::parse;
use super::session::{Gate, Handler};
use io_uring::{cqueue, opcode, squeue, types, IoUring};
use std::cell::RefCell;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::thread::JoinHandle;
use zerocopy::{FromBytes, IntoBytes};

type Ring = IoUring<squeue::Entry128, cqueue::Entry>;

/// Room before the payload for the request's header and per-opcode header, so that the
/// request reads as one contiguous message without copying its payload.
const PREFIX: usize = size_of::<InHeader>() + u::OP_IN_SZ;
/// Where the payload starts in an entry's buffer (a page boundary).
const ALIGN: usize = 4096;
const _: () = assert!(PREFIX <= ALIGN);

fn new_ring() -> io::Result<Ring> {
    Ring::builder()
        .setup_single_issuer()
        .setup_defer_taskrun()
        .setup_coop_taskrun()
        .build(4)
}

/// Whether this process may set up the rings at all (seccomp or a sysctl may forbid it).
pub(crate) fn probe() -> io::Result<()> {
    new_ring().map(drop)
}

/// The kernel's queue count: the possible CPUs (`/sys/devices/system/cpu/possible`).
fn possible_cpus() -> usize {
    let count = std::fs::read_to_string("/sys/devices/system/cpu/possible")
        .ok()
        .and_then(|s| cpu_list_len(s.trim()));
    count.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// How many CPUs a list such as "0-3,6" names.
fn cpu_list_len(list: &str) -> Option<usize> {
    let mut n = 0;
    for part in list.split(',') {
        n += match part.split_once('-') {
            Some((a, b)) => b.parse::<usize>().ok()?.checked_sub(a.parse().ok()?)? + 1,
            None => part.parse::<usize>().map(|_| 1).ok()?,
        };
    }
    (n > 0).then_some(n)
}

/// Starts the queue threads: `threads` spread over the queues, at least two per queue.
pub(crate) fn start<H: Handler>(
    handler: Arc<H>,
    ch: Arc<Channel>,
    gate: Gate,
    max_write: u32,
    threads: usize,
) -> Vec<JoinHandle<io::Result<()>>> {
    let queues = possible_cpus();
    let per_queue = (threads / queues).max(2);
    // At least what the kernel checks: max_write, max_pages pages, FUSE_MIN_READ_BUFFER.
    let payload = (max_write as usize).next_multiple_of(4096).max(8192);
    let mut out = Vec::new();
    for qid in 0..queues {
        for i in 0..per_queue {
            let (handler, ch) = (Arc::clone(&handler), Arc::clone(&ch));
            let gate = gate.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("oleo-uring-{qid}.{i}"))
                .spawn(move || serve_queue(&*handler, &ch, &gate, qid as u16, payload));
            match spawned {
                Ok(t) => out.push(t),
                Err(e) => log::error!("FUSE ring thread for CPU {qid} not started: {e}"),
            }
        }
    }
    log::info!("FUSE over io_uring: {queues} queues, {per_queue} entries each");
    out
}

/// Runs this thread on `cpu` only, where the requests of this queue come from.
fn pin_to(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is valid, CPU_SET stays inside it (checked bound), and
    // sched_setaffinity reads exactly its size.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if cpu >= 8 * size_of::<libc::cpu_set_t>() {
            return;
        }
        libc::CPU_SET(cpu, &mut set);
        // Failing (a cpuset without this CPU) only costs locality.
        libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set);
    }
}

/// One ring command on the device: REGISTER (with the entry's two buffers) or
/// COMMIT_AND_FETCH.
fn command(
    ch: &Channel,
    op: u32,
    req: u::CmdReq,
    iov: Option<&[libc::iovec; 2]>,
) -> squeue::Entry128 {
    let mut cmd = [0u8; 80];
    cmd[..size_of::<u::CmdReq>()].copy_from_slice(req.as_bytes());
    let mut b = opcode::UringCmd80::new(types::Fd(ch.0.as_raw_fd()), op).cmd(cmd);
    if let Some(iov) = iov {
        b = b.addr(Some(iov.as_ptr() as u64));
    }
    let entry = b.build();
    match iov {
        None => entry,
        Some(iov) => {
            // The crate has no setter for the SQE's `len` (offset 24 in struct
            // io_uring_sqe), where REGISTER takes the iovec count.
            // SAFETY: Entry128 is a repr(C) io_uring_sqe followed by 64 command bytes,
            // 128 bytes of plain data.
            let mut raw: [u8; 128] = unsafe { std::mem::transmute(entry) };
            raw[24..28].copy_from_slice(&(iov.len() as u32).to_ne_bytes());
            // SAFETY: as above.
            unsafe { std::mem::transmute::<[u8; 128], squeue::Entry128>(raw) }
        }
    }
}

/// Submits one command and waits for the completion that answers it (each thread has
/// one command in flight).
fn exchange(ring: &mut Ring, sqe: &squeue::Entry128) -> io::Result<i32> {
    // SAFETY: the buffers the command names outlive it (see `serve_queue`).
    unsafe { ring.submission().push(sqe) }
        .map_err(|_| io::Error::other("io_uring submission queue full"))?;
    loop {
        match ring.submit_and_wait(1) {
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
            Err(e) => return Err(e),
        }
        if let Some(c) = ring.completion().next() {
            return Ok(c.result());
        }
    }
}

/// Serves one ring entry of queue `qid` until the mount goes away.
fn serve_queue<H: Handler>(
    handler: &H,
    ch: &Channel,
    gate: &Gate,
    qid: u16,
    payload_len: usize,
) -> io::Result<()> {
    pin_to(usize::from(qid));
    // The kernel writes into these while the entry is registered: they are declared
    // before the ring (dropped after it) and leaked if we leave with the entry live.
    let mut headers = vec![0u64; u::HEADERS_SZ.div_ceil(8)];
    // The payload starts on a page boundary, so O_DIRECT data goes to the device from
    // where the kernel put it (the engine copies unaligned buffers first).
    let base = ALIGN - PREFIX;
    let mut buf = oleo::device::IoBuf::huge(ALIGN + payload_len);
    let staged = RefCell::new(Staged::default());
    let mut ring = new_ring()?;
    let iov = [
        libc::iovec {
            iov_base: headers.as_mut_ptr().cast(),
            iov_len: u::HEADERS_SZ,
        },
        libc::iovec {
            iov_base: buf[ALIGN..].as_mut_ptr().cast(),
            iov_len: payload_len,
        },
    ];
    let mut sqe = command(
        ch,
        u::CMD_REGISTER,
        u::CmdReq {
            qid,
            ..Default::default()
        },
        Some(&iov),
    );
    loop {
        let res = match exchange(&mut ring, &sqe) {
            Ok(r) => r,
            Err(e) => {
                std::mem::forget((headers, buf));
                return Err(e);
            }
        };
        match -res {
            0 => {}
            // The mount is gone (or going): the kernel released the entry.
            libc::ENOTCONN | libc::ECONNABORTED | libc::ECANCELED | libc::ENODEV => return Ok(()),
            // INIT's answer not yet taken in: try again.
            libc::EAGAIN => {
                std::thread::sleep(std::time::Duration::from_millis(1));
                continue;
            }
            e => {
                std::mem::forget((headers, buf));
                let e = io::Error::from_raw_os_error(e);
                log::error!("FUSE ring entry of CPU {qid} stopped: {e}");
                return Err(e);
            }
        }
        let (unique, commit_id) =
            answer(handler, gate, headers.as_bytes(), &mut buf[base..], &staged);
        reply_into(&staged, unique, headers.as_mut_bytes(), &mut buf[ALIGN..]);
        sqe = command(
            ch,
            u::CMD_COMMIT_AND_FETCH,
            u::CmdReq {
                commit_id,
                qid,
                ..Default::default()
            },
            None,
        );
    }
}

/// Hands the request now in the entry to the handler; returns its unique and commit id.
/// The reply is left in `staged`.
fn answer<H: Handler>(
    handler: &H,
    gate: &Gate,
    headers: &[u8],
    buf: &mut [u8],
    staged: &RefCell<Staged>,
) -> (u64, u64) {
    let hsz = size_of::<InHeader>();
    let ent = u::EntInOut::read_from_bytes(&headers[u::IN_OUT_SZ + u::OP_IN_SZ..u::HEADERS_SZ])
        .unwrap_or_default();
    // The header block is larger than a request header: this read cannot fail.
    let h = InHeader::read_from_prefix(headers).map_or_else(|_| InHeader::default(), |(h, _)| h);
    gate.counts.record(h.opcode);
    let payload = ent.payload_sz as usize;
    // The per-opcode header is whatever the request's length leaves beside the payload.
    let op_len = (h.len as usize)
        .checked_sub(hsz + payload)
        .filter(|&n| n <= u::OP_IN_SZ && payload <= buf.len() - PREFIX);
    let fail = |e: Errno| {
        let mut s = staged.borrow_mut();
        s.error = e.0;
        s.body.clear();
    };
    let Some(op_len) = op_len else {
        log::warn!("malformed FUSE request from a ring entry ({} bytes)", h.len);
        fail(Errno::EINVAL);
        return (h.unique, ent.commit_id);
    };
    let start = PREFIX - op_len - hsz;
    buf[start..start + hsz].copy_from_slice(&headers[..hsz]);
    buf[start + hsz..PREFIX].copy_from_slice(&headers[u::IN_OUT_SZ..u::IN_OUT_SZ + op_len]);
    // A request without a payload (READ) leaves the payload buffer free for its reply.
    let (request, free) = if payload == 0 {
        let (head, rest) = buf.split_at_mut(PREFIX);
        (&head[start..], Some(rest))
    } else {
        (&buf[start..PREFIX + payload], None)
    };
    match parse(request) {
        Ok((req, op)) => {
            // DESTROY's answer goes out like any other; the kernel then ends the ring.
            let reply = Reply::staged(staged, req.unique, free);
            gate.serve(handler, h.opcode, &req, op, reply);
        }
        Err(_) => {
            log::warn!("malformed FUSE request from a ring entry ({} bytes)", h.len);
            fail(Errno::EINVAL);
        }
    }
    (h.unique, ent.commit_id)
}

/// Writes the staged reply into the entry: the out header, the body into the payload,
/// and the body's length where the kernel reads it.
fn reply_into(staged: &RefCell<Staged>, unique: u64, headers: &mut [u8], payload: &mut [u8]) {
    let s = staged.borrow();
    let (error, len) = match s.in_place {
        Some(n) if n <= payload.len() => (s.error, n),
        Some(_) => (libc::EIO, 0),
        None if s.body.len() <= payload.len() => {
            payload[..s.body.len()].copy_from_slice(&s.body);
            (s.error, s.body.len())
        }
        None => {
            log::error!(
                "FUSE reply of {} bytes does not fit a ring entry",
                s.body.len()
            );
            (libc::EIO, 0)
        }
    };
    let h = OutHeader {
        len: (size_of::<OutHeader>() + len) as u32,
        error: -error,
        unique,
    };
    headers[..size_of::<OutHeader>()].copy_from_slice(h.as_bytes());
    let ent = &mut headers[u::IN_OUT_SZ + u::OP_IN_SZ..u::HEADERS_SZ];
    let mut e = u::EntInOut::read_from_bytes(ent).unwrap_or_default();
    e.payload_sz = len as u32;
    ent.copy_from_slice(e.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_are_counted() {
        assert_eq!(cpu_list_len("0"), Some(1));
        assert_eq!(cpu_list_len("0-1"), Some(2));
        assert_eq!(cpu_list_len("0-3,6"), Some(5));
        assert_eq!(cpu_list_len(""), None);
        assert_eq!(cpu_list_len("3-1"), None);
    }

    #[test]
    fn header_block_has_the_kernel_layout() {
        assert_eq!(size_of::<u::EntInOut>(), 32);
        assert_eq!(size_of::<u::CmdReq>(), 24);
        assert_eq!(u::HEADERS_SZ, 288);
    }
}
