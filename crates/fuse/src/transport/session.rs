//! A served mount: the INIT handshake, then worker threads that each read requests from
//! their own clone of the device descriptor (FUSE_DEV_IOC_CLONE, so the kernel hands
//! requests to whichever worker is idle), pass them to the handler and let it reply.
//!
//! Only a few workers (one per core) wait in the kernel at a time (`Readers`). With more,
//! every request wakes a sleeping thread; with few, a worker that finishes a request
//! often finds the next one queued and takes it without sleeping (measured with fs_mark,
//! 2 threads: 21k creates/s where 16 gave 16k). The other workers wait in userspace for a
//! handler that is about to wait for long (an fsync waiting for its commit: `will_block`)
//! and would leave no worker reading; those are what the extra workers are for. The
//! engine says when it is about to wait (`oleo::blocking`): for a commit's IO, for a commit
//! to become durable, for another writer of the same file.

use super::abi::{self, init};
use super::counts::{self, RequestCounts};
use super::reply::{Channel, Errno, Notifier, Reply};
use super::request::{parse, Op, Request};
use super::uring;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::Arc;

/// What a filesystem served over FUSE implements.
pub trait Handler: Send + Sync + 'static {
    /// Called once, with the kernel's capabilities, before any other request.
    fn init(&self, kernel_flags: u64) -> InitConfig;
    /// Answers one request (every path must consume `reply`).
    fn dispatch(&self, req: &Request, op: Op<'_>, reply: Reply<'_>);
    /// The mount is gone: called once, after the last request. An error (the final commit
    /// failed) is what [`Session::run`] returns.
    fn destroy(&self) -> std::io::Result<()>;
}

/// What the server asks for at INIT.
#[derive(Clone, Copy, Debug)]
pub struct InitConfig {
    /// INIT flags wanted; only those the kernel offers are taken.
    pub flags: u64,
    /// Largest WRITE payload wanted (at least 4 KiB is used).
    pub max_write: u32,
    /// Largest readahead wanted (capped at what the kernel offers).
    pub max_readahead: u32,
}

/// Who may use the mount besides what the kernel already checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Everyone the kernel lets through (allow_other, or only the owner without it).
    All,
    /// allow_root: the kernel lets everyone through (allow_other), we let root and the
    /// mount's owner.
    RootAndOwner,
}

/// A mounted FUSE connection and the handler that serves it: [`Session::run`] shakes
/// hands with the kernel, then serves requests on worker threads until the filesystem is
/// unmounted.
pub struct Session<H: Handler> {
    handler: Arc<H>,
    ch: Arc<Channel>,
    threads: usize,
    access: Access,
    owner: u32,
    counts: Arc<RequestCounts>,
}

/// Requests the kernel may have in flight to us without a caller waiting on each:
/// write-backs, readahead, and every piece of an asynchronous O_DIRECT read or write
/// (ASYNC_DIO: io_uring, libaio). Past it, such a request waits in the caller's kernel
/// thread before it is even queued. With 64, fio's seed-002 mix (2 × 64 in flight) spent
/// its waits there (`fuse_get_req` in `fuse_simple_background`); 256 took it from 411 to
/// 457 MiB/s each way (kernel btrfs: 484-538 in the same hour).
const MAX_BACKGROUND: u16 = 256;

/// Requests carry at most max_write bytes of data after their header and arguments.
fn buffer_size(max_write: u32) -> usize {
    max_write as usize + 64 * 1024
}

impl<H: Handler> Session<H> {
    /// A session on a mounted /dev/fuse descriptor; `threads` workers serve it.
    pub fn from_fd(handler: H, fd: OwnedFd, threads: usize, access: Access) -> Session<H> {
        Session {
            handler: Arc::new(handler),
            ch: Arc::new(Channel(fd)),
            threads: threads.max(1),
            access,
            // SAFETY: geteuid cannot fail.
            owner: unsafe { libc::geteuid() },
            counts: Arc::default(),
        }
    }

    /// The requests of each opcode the kernel sent this connection so far (`counts`).
    pub fn request_counts(&self) -> Arc<RequestCounts> {
        Arc::clone(&self.counts)
    }

    /// What lets the handler tell the kernel its caches went stale, for this connection.
    pub fn notifier(&self) -> Notifier {
        Notifier(Arc::clone(&self.ch))
    }

    fn gate(&self) -> Gate {
        Gate {
            access: self.access,
            owner: self.owner,
            counts: Arc::clone(&self.counts),
        }
    }

    /// Serves until the filesystem is unmounted, then calls `destroy`; fails if serving or
    /// `destroy` failed.
    pub fn run(self) -> std::io::Result<()> {
        let (max_write, over_uring) = self.handshake()?;
        // Over io_uring, the device still brings FORGETs and INTERRUPTs.
        let rings = if over_uring {
            uring::start(
                Arc::clone(&self.handler),
                Arc::clone(&self.ch),
                self.gate(),
                max_write,
                self.threads,
            )
        } else {
            Vec::new()
        };
        // Over io_uring the device brings only FORGETs and INTERRUPTs: two workers do.
        let device_workers = if over_uring { 2 } else { self.threads };
        let readers = Arc::new(Readers::new(device_workers.min(max_readers())));
        let mut workers = Vec::new();
        for i in 1..device_workers {
            let ch = match clone_channel(&self.ch) {
                Ok(ch) => Arc::new(ch),
                Err(e) => {
                    log::warn!("FUSE_DEV_IOC_CLONE failed ({e}): workers share one descriptor");
                    Arc::clone(&self.ch)
                }
            };
            let worker = Worker {
                handler: Arc::clone(&self.handler),
                ch,
                gate: self.gate(),
                readers: Arc::clone(&readers),
            };
            workers.push(
                std::thread::Builder::new()
                    .name(format!("oleo-fuse-{i}"))
                    .spawn(move || worker.serve(max_write))?,
            );
        }
        let me = Worker {
            handler: Arc::clone(&self.handler),
            ch: Arc::clone(&self.ch),
            gate: self.gate(),
            readers,
        };
        let mut result = me.serve(max_write);
        for w in workers.into_iter().chain(rings) {
            match w.join() {
                Ok(r) => result = result.and(r),
                Err(_) => result = Err(std::io::Error::other("a FUSE worker panicked")),
            }
        }
        log::info!(
            "FUSE requests served: {}",
            counts::summary(&self.counts.snapshot())
        );
        let closed = self.handler.destroy();
        if let (Err(_), Err(e)) = (&result, &closed) {
            // Only the first error is returned: this one must not go unsaid.
            log::error!("{e}");
        }
        result.and(closed)
    }

    /// Reads INIT and answers it; returns the negotiated max_write and whether requests
    /// come over io_uring from now on.
    fn handshake(&self) -> std::io::Result<(u32, bool)> {
        let mut buf = vec![0u8; buffer_size(0)];
        loop {
            let Some(n) = read_request(&self.ch, &mut buf)? else {
                return Err(std::io::Error::other("unmounted before INIT"));
            };
            self.counts.record_message(&buf[..n]);
            let (req, op) = match parse(&buf[..n]) {
                Ok(x) => x,
                Err((unique, _)) => {
                    if let Some(u) = unique {
                        Reply::new(&self.ch, u).error(Errno::EINVAL);
                    }
                    continue;
                }
            };
            let reply = Reply::new(&self.ch, req.unique);
            let Op::Init(arg, kernel_flags) = op else {
                // Nothing else may come first.
                reply.error(Errno::EIO);
                continue;
            };
            if arg.major != abi::KERNEL_VERSION || arg.minor < abi::MIN_KERNEL_MINOR_VERSION {
                // A newer major makes the kernel retry with ours; an older one is too old.
                if arg.major > abi::KERNEL_VERSION {
                    reply.init(&abi::InitOut {
                        major: abi::KERNEL_VERSION,
                        minor: abi::KERNEL_MINOR_VERSION,
                        ..Default::default()
                    });
                    continue;
                }
                reply.error(Errno(libc::EPROTO));
                return Err(std::io::Error::other(format!(
                    "the kernel's FUSE protocol {}.{} is older than 7.{} (Linux 5.8)",
                    arg.major,
                    arg.minor,
                    abi::MIN_KERNEL_MINOR_VERSION
                )));
            }
            let want = self.handler.init(kernel_flags);
            let mut flags = want.flags & kernel_flags;
            // allow_root's gate needs every caller's uid, which ALLOW_IDMAP takes away.
            if self.access != Access::All {
                flags &= !init::ALLOW_IDMAP;
            }
            // Once asked for, the kernel holds every request until all queues have an
            // entry: ask only when a ring can be set up here (seccomp may forbid io_uring).
            if flags & init::OVER_IO_URING != 0 {
                if let Err(e) = uring::probe() {
                    log::info!("FUSE over io_uring offered but unusable here ({e}): /dev/fuse");
                    flags &= !init::OVER_IO_URING;
                }
            }
            let max_write = want.max_write.max(4096);
            let mut out = abi::InitOut {
                major: abi::KERNEL_VERSION,
                minor: abi::KERNEL_MINOR_VERSION,
                max_readahead: want.max_readahead.min(arg.max_readahead),
                flags: flags as u32,
                max_background: MAX_BACKGROUND,
                congestion_threshold: MAX_BACKGROUND / 4 * 3,
                max_write,
                time_gran: 1,
                ..Default::default()
            };
            if flags & init::MAX_PAGES != 0 {
                out.max_pages = max_write.div_ceil(4096) as u16;
            }
            if kernel_flags & init::INIT_EXT != 0 {
                out.flags |= init::INIT_EXT as u32;
                out.flags2 = (flags >> 32) as u32;
            }
            log::debug!(
                "FUSE {}.{}: flags {flags:#x}, max_write {max_write}",
                arg.major,
                arg.minor
            );
            super::request::set_setxattr_ext(flags & init::SETXATTR_EXT != 0);
            reply.init(&out);
            return Ok((max_write, flags & init::OVER_IO_URING != 0));
        }
    }
}

/// Idle workers waiting in the kernel at most: one per core.
fn max_readers() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get().max(2))
}

std::thread_local! {
    /// The pool of the worker running on this thread.
    static POOL: std::cell::RefCell<Option<Arc<Readers>>> = const { std::cell::RefCell::new(None) };
}

/// Tells the worker pool that the request this thread serves is about to wait for long
/// (see the module doc). Does nothing outside a worker.
pub fn will_block() {
    POOL.with(|p| {
        if let Some(r) = p.borrow().as_ref() {
            r.will_block();
        }
    });
}

/// Which workers may wait in the kernel for a request (see the module doc).
struct Readers {
    state: parking_lot::Mutex<ReadersState>,
    wake: parking_lot::Condvar,
    max: usize,
}

#[derive(Default)]
struct ReadersState {
    reading: usize,
    parked: usize,
    /// The mount is gone: parked workers exit.
    stopped: bool,
}

impl Readers {
    fn new(max: usize) -> Readers {
        Readers {
            state: Default::default(),
            wake: Default::default(),
            max: max.max(1),
        }
    }

    /// Waits for a turn to read; false once the mount is gone.
    fn start_reading(&self) -> bool {
        let mut s = self.state.lock();
        while s.reading >= self.max && !s.stopped {
            s.parked += 1;
            self.wake.wait(&mut s);
            s.parked -= 1;
        }
        s.reading += 1;
        !s.stopped
    }

    fn done_reading(&self) {
        self.state.lock().reading -= 1;
    }

    /// A handler is about to wait for long: if nobody else is reading, a parked worker
    /// takes over, so the requests behind it are served meanwhile.
    fn will_block(&self) {
        let s = self.state.lock();
        if s.reading == 0 && s.parked > 0 {
            self.wake.notify_one();
        }
    }

    fn stop(&self) {
        self.state.lock().stopped = true;
        self.wake.notify_all();
    }
}

struct Worker<H: Handler> {
    handler: Arc<H>,
    ch: Arc<Channel>,
    gate: Gate,
    readers: Arc<Readers>,
}

impl<H: Handler> Worker<H> {
    fn serve(&self, max_write: u32) -> std::io::Result<()> {
        POOL.with(|p| *p.borrow_mut() = Some(Arc::clone(&self.readers)));
        let r = self.serve_requests(max_write);
        self.readers.stop();
        r
    }

    /// Reads one request when this worker's turn comes; None once the mount is gone.
    fn next_request(&self, buf: &mut [u8]) -> std::io::Result<Option<usize>> {
        if !self.readers.start_reading() {
            self.readers.done_reading();
            return Ok(None);
        }
        let r = read_request(&self.ch, buf);
        self.readers.done_reading();
        r
    }

    fn serve_requests(&self, max_write: u32) -> std::io::Result<()> {
        let mut buf = vec![0u8; buffer_size(max_write)];
        while let Some(n) = self.next_request(&mut buf)? {
            let opcode = counts::opcode_of(&buf[..n]);
            self.gate.counts.record(opcode);
            let (req, op) = match parse(&buf[..n]) {
                Ok(x) => x,
                Err((unique, _)) => {
                    log::warn!("malformed FUSE request ({n} bytes)");
                    if let Some(u) = unique {
                        Reply::new(&self.ch, u).error(Errno::EINVAL);
                    }
                    continue;
                }
            };
            let reply = Reply::new(&self.ch, req.unique);
            if !self.gate.serve(&*self.handler, opcode, &req, op, reply) {
                return Ok(());
            }
        }
        Ok(())
    }
}

/// What every transport does with a parsed request before and around the handler.
#[derive(Clone)]
pub(crate) struct Gate {
    access: Access,
    owner: u32,
    /// Every request read, by opcode (counted by the transport that read it).
    pub(crate) counts: Arc<RequestCounts>,
}

impl Gate {
    /// Answers one request with this opcode; false once it was DESTROY (the last one).
    /// The time it takes counts for the opcode (`RequestCounts::record_time`).
    pub(crate) fn serve<H: Handler>(
        &self,
        handler: &H,
        opcode: u32,
        req: &Request,
        op: Op<'_>,
        reply: Reply<'_>,
    ) -> bool {
        let start = std::time::Instant::now();
        let more = self.answer(handler, req, op, reply);
        self.counts.record_time(opcode, start.elapsed());
        more
    }

    fn answer<H: Handler>(&self, handler: &H, req: &Request, op: Op<'_>, reply: Reply<'_>) -> bool {
        match op {
            Op::Interrupt => reply.none(),
            Op::Init(..) => reply.error(Errno::EIO),
            Op::Destroy => {
                reply.ok();
                return false;
            }
            op if !self.allowed(req, &op) => reply.error(Errno::EACCES),
            // The request counts, on the mount's root, for root only: answered here, so
            // every server on this transport answers it the same way.
            Op::Ioctl { arg, .. }
                if (arg.cmd == crate::subvol_ioctl::FUSE_STATS
                    || arg.cmd == crate::subvol_ioctl::FUSE_STATS_TIME)
                    && req.nodeid == abi::ROOT_ID =>
            {
                if !crate::caller::Caller::is_root(req) {
                    reply.error(Errno(libc::EPERM))
                } else if arg.cmd == crate::subvol_ioctl::FUSE_STATS {
                    reply.ioctl(0, &counts::to_bytes(&self.counts.snapshot()))
                } else {
                    reply.ioctl(0, &counts::to_bytes(&self.counts.nanos()))
                }
            }
            op => handler.dispatch(req, op, reply),
        }
        true
    }

    /// allow_root: only root and the owner, except for what ends the use of something
    /// already granted (releases, forgets) and what the kernel sends on its own.
    fn allowed(&self, req: &Request, op: &Op<'_>) -> bool {
        self.access == Access::All
            || req.uid == 0
            || req.uid == self.owner
            || matches!(
                op,
                Op::Forget(_)
                    | Op::BatchForget(_)
                    | Op::Read(_)
                    | Op::Write { .. }
                    | Op::Readdir(_)
                    | Op::Readdirplus(_)
                    | Op::Fsync { .. }
                    | Op::Fsyncdir { .. }
                    | Op::Release(_)
                    | Op::Releasedir(_)
            )
    }
}

/// Reads one request; None once the filesystem is unmounted.
fn read_request(ch: &Channel, buf: &mut [u8]) -> std::io::Result<Option<usize>> {
    loop {
        match nix::unistd::read(ch.0.as_fd(), buf) {
            Ok(n) => return Ok(Some(n)),
            // An interrupted request vanished before we read it; a signal woke us.
            Err(nix::errno::Errno::ENOENT | nix::errno::Errno::EINTR) => continue,
            Err(nix::errno::Errno::EAGAIN) => continue,
            Err(nix::errno::Errno::ENODEV) => return Ok(None),
            Err(e) => return Err(e.into()),
        }
    }
}

/// A new descriptor attached to the same connection: requests are spread across them.
fn clone_channel(ch: &Channel) -> std::io::Result<Channel> {
    let fd = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")?;
    let fd = OwnedFd::from(fd);
    let source: u32 = ch.0.as_raw_fd() as u32;
    // SAFETY: the ioctl reads one u32 from a valid pointer.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), abi::DEV_IOC_CLONE, &source) };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(Channel(fd))
}
