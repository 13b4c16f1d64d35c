//! Native Linux AIO (io_setup, io_submit, io_getevents): the asynchronous direct IO that
//! `aio-dio` fstests and databases use, which a FUSE mount handles otherwise than a
//! synchronous write (a short asynchronous O_DIRECT write becomes EIO in the kernel).

use std::fs::File;
use std::os::fd::AsRawFd;

/// `struct iocb` of linux/aio_abi.h (little-endian layout).
#[repr(C)]
#[derive(Default)]
struct Iocb {
    data: u64,
    key: u32,
    rw_flags: i32,
    opcode: u16,
    reqprio: i16,
    fildes: u32,
    buf: u64,
    nbytes: u64,
    offset: i64,
    reserved2: u64,
    flags: u32,
    resfd: u32,
}

/// `struct io_event`.
#[repr(C)]
#[derive(Default)]
struct IoEvent {
    data: u64,
    obj: u64,
    res: i64,
    res2: i64,
}

/// An AIO context; destroyed on drop.
pub struct Aio(u64);

fn errno() -> std::io::Error {
    std::io::Error::last_os_error()
}

impl Aio {
    /// io_setup for `depth` requests in flight.
    pub fn new(depth: i64) -> std::io::Result<Aio> {
        let mut ctx: u64 = 0;
        // SAFETY: a context id to fill.
        let r = unsafe { libc::syscall(libc::SYS_io_setup, depth, &mut ctx as *mut u64) };
        if r != 0 {
            return Err(errno());
        }
        Ok(Aio(ctx))
    }

    /// One asynchronous write of `buf` at `at` (io_submit, then io_getevents for its
    /// completion); its result as the kernel gives it: bytes written, or -errno.
    pub fn write(&self, f: &File, buf: &[u8], at: u64) -> i64 {
        let mut cb = Iocb {
            opcode: 1, // IOCB_CMD_PWRITE
            fildes: f.as_raw_fd() as u32,
            buf: buf.as_ptr() as u64,
            nbytes: buf.len() as u64,
            offset: at as i64,
            ..Default::default()
        };
        let mut list = [&mut cb as *mut Iocb];
        // SAFETY: a context from io_setup, one iocb whose buffer outlives the completion we
        // wait for below.
        let r = unsafe { libc::syscall(libc::SYS_io_submit, self.0, 1, list.as_mut_ptr()) };
        if r != 1 {
            return -i64::from(errno().raw_os_error().unwrap_or(libc::EIO));
        }
        let mut ev = IoEvent::default();
        // A signal to the process (a test harness's threads, a child's exit) interrupts the
        // wait with EINTR; the write is still in flight, so wait again.
        loop {
            // SAFETY: room for one event; no timeout.
            let r = unsafe {
                libc::syscall(
                    libc::SYS_io_getevents,
                    self.0,
                    1,
                    1,
                    &mut ev as *mut IoEvent,
                    std::ptr::null::<libc::timespec>(),
                )
            };
            if r == 1 {
                return ev.res;
            }
            let e = errno();
            assert_eq!(e.raw_os_error(), Some(libc::EINTR), "io_getevents: {e}");
        }
    }
}

impl Drop for Aio {
    fn drop(&mut self) {
        // SAFETY: the context from io_setup; every write waited for its completion.
        unsafe { libc::syscall(libc::SYS_io_destroy, self.0) };
    }
}
