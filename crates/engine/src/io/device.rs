//! Block devices: where bytes physically live. For now one image file or block device,
//! read with positional reads so many threads can read at once without a lock. Opened
//! read-write, it also takes positional writes and cache flushes (fdatasync).
//!
//! Outside the crate (`oleo::device`) two of its types are public: [`IoBuf`], the
//! O_DIRECT-aligned buffer, and [`IoEvent`], what a recording of the device's writes and
//! flushes holds (`Filesystem::start_io_recording`, for crash simulation).

use crate::error::{Error, Result};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// Writes at least this large go around the page cache (O_DIRECT, when aligned).
pub(crate) const DIRECT_MIN: usize = 64 << 10;
/// Once this much has gone into the image's page cache, its writeback is started: a
/// flush (every fsync) writes back all that is dirty in the image, not only the
/// fsynced file's part, so what is dirty there must stay small.
const WRITEBACK_BATCH: u64 = 8 << 20;
/// linux/fs.h's BLKDISCARD, `_IO(0x12, 119)`: discard a byte range of a block device.
const BLKDISCARD: libc::c_ulong = 0x1277;
/// Offset, length and memory alignment O_DIRECT needs (the largest logical block size).
pub(crate) const DIRECT_ALIGN: usize = 4096;

/// A zeroed byte buffer aligned for O_DIRECT: file data is staged in these.
pub struct IoBuf {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
    huge: bool,
}

// SAFETY: IoBuf owns its allocation exclusively, like a Box<[u8]>.
unsafe impl Send for IoBuf {}
// SAFETY: shared access is read-only through Deref.
unsafe impl Sync for IoBuf {}

impl IoBuf {
    /// A buffer of `len` zero bytes, its start aligned to 4096 bytes (the largest logical
    /// block size O_DIRECT asks for). Allocation failure aborts, as for a `Vec`.
    pub fn zeroed(len: usize) -> IoBuf {
        Self::alloc(len, false)
    }

    /// `zeroed`, in transparent huge pages where the host allows them, for a large buffer
    /// that is used again and again (a FUSE reply buffer, scrub reads): the kernel pins
    /// the pages of every O_DIRECT read into it, and pinning 4 KiB pages one by one took
    /// a tenth of a scrub's time. Takes whole huge pages.
    pub fn huge(len: usize) -> IoBuf {
        Self::alloc(len, true)
    }

    /// A copy of `bytes` in a buffer of its own, aligned as `zeroed`'s (never zeroed first).
    pub(crate) fn copy_of(bytes: &[u8]) -> IoBuf {
        if bytes.is_empty() {
            return Self::zeroed(0);
        }
        let layout = Self::layout(bytes.len(), false);
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { std::alloc::alloc(layout) };
        let ptr =
            std::ptr::NonNull::new(raw).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        // SAFETY: the allocation holds `bytes.len()` bytes and cannot overlap `bytes`; after
        // the copy every byte of it is initialized.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), ptr.as_ptr(), bytes.len()) };
        IoBuf {
            ptr,
            len: bytes.len(),
            huge: false,
        }
    }

    fn alloc(len: usize, huge: bool) -> IoBuf {
        if len == 0 {
            return IoBuf {
                ptr: std::ptr::NonNull::<u8>::dangling(),
                len: 0,
                huge: false,
            };
        }
        let layout = Self::layout(len, huge);
        let raw = if huge {
            // SAFETY: the layout has a non-zero size.
            let raw = unsafe { std::alloc::alloc(layout) };
            if !raw.is_null() {
                // SAFETY: [raw, raw + size) is this allocation; the advice is only a hint
                // (refused where THP is off), and zeroing it then faults the pages in.
                unsafe {
                    libc::madvise(raw.cast(), layout.size(), libc::MADV_HUGEPAGE);
                    std::ptr::write_bytes(raw, 0, layout.size());
                }
            }
            raw
        } else {
            // SAFETY: the layout has a non-zero size.
            unsafe { std::alloc::alloc_zeroed(layout) }
        };
        let ptr =
            std::ptr::NonNull::new(raw).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        IoBuf { ptr, len, huge }
    }

    /// The allocation behind a buffer of `len` (non-zero) bytes.
    fn layout(len: usize, huge: bool) -> std::alloc::Layout {
        let (size, align) = if huge {
            (len.next_multiple_of(HUGE_PAGE), HUGE_PAGE)
        } else {
            (len, DIRECT_ALIGN)
        };
        std::alloc::Layout::from_size_align(size, align).expect("buffer size overflows")
    }
}

/// The size of a transparent huge page on x86-64 and of the usual arm64 one.
const HUGE_PAGE: usize = 2 << 20;

impl std::ops::Deref for IoBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr is valid for len initialized (zeroed) bytes, or dangling with len 0.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl std::ops::DerefMut for IoBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in deref, and we hold the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for IoBuf {
    fn drop(&mut self) {
        if self.len > 0 {
            // SAFETY: allocated in `alloc` with this very layout.
            unsafe { std::alloc::dealloc(self.ptr.as_ptr(), Self::layout(self.len, self.huge)) };
        }
    }
}

/// One thing the device was asked to do, as a crash simulator records it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IoEvent {
    /// A write of `data` at byte `offset` of the device.
    Write {
        /// Byte offset on the device (a physical address).
        offset: u64,
        /// The bytes written.
        data: Vec<u8>,
    },
    /// A cache flush: every write before it is durable.
    Flush,
}

/// A recording shared by the devices of a set: (devid, event) in issue order.
pub(crate) type Recording = std::sync::Arc<parking_lot::Mutex<Option<Vec<(u64, IoEvent)>>>>;

pub(crate) struct Device {
    file: File,
    /// One writer per filesystem, and never beside the kernel (see `claim`).
    _claim: crate::io::claim::Claim,
    /// The same file opened with O_DIRECT, for large aligned (data) writes: they skip the
    /// host page cache copy, as the kernel's loop device does with direct IO.
    direct: Option<File>,
    /// When set, every write and flush is also appended here with this device's id
    /// (crash simulation); the devices of a set share one recording, so that it keeps the
    /// order of their IO.
    recording: Recording,
    /// The devid recorded events carry.
    rec_devid: AtomicU64,
    size: u64,
    writable: bool,
    /// A block device (discards are BLKDISCARD), not an image file (holes punched).
    block_device: bool,
    /// Writes left before an injected failure (tests of crash consistency); MAX: never.
    write_budget: AtomicU64,
    writes: AtomicU64,
    flushes: AtomicU64,
    /// Bytes written into the page cache since its writeback was last started.
    unkicked: AtomicU64,
    /// The thread that starts that writeback (`Kicker`), from the first batch on.
    kicker: std::sync::OnceLock<Option<Kicker>>,
}

/// Starts the writeback of an image's dirty pages on a thread of its own, so the writer
/// that filled a batch goes on: `sync_file_range` waits for room in the device's queue, and
/// took a fifth of the server's time in 4 KiB random writes when each writer waited.
/// At most one start waits while another runs; a writer that finds both taken starts the
/// writeback itself, waiting as before, so the dirty pages stay within about two batches
/// of what the device takes.
///
/// A process forked after the thread started (the mount forks once the filesystem is open,
/// and an open that replays a log may have written a batch by then) has the device but
/// not the thread: there the writer starts every writeback itself, and a drop closes the
/// thread's descriptor instead of waiting for a thread that does not exist.
struct Kicker {
    wake: Option<std::sync::mpsc::SyncSender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// The process the thread runs in.
    pid: u32,
    /// The thread's copy of the descriptor.
    fd: std::os::fd::RawFd,
}

impl Kicker {
    /// None where the descriptor cannot be shared or the thread not started: the writer
    /// then starts every writeback itself.
    fn start(file: &File) -> Option<Kicker> {
        let file = file.try_clone().ok()?;
        let fd = std::os::fd::AsRawFd::as_raw_fd(&file);
        let (wake, woken) = std::sync::mpsc::sync_channel::<()>(1);
        let thread = std::thread::Builder::new()
            .name("oleo-writeback".into())
            .spawn(move || {
                while woken.recv().is_ok() {
                    start_writeback(&file);
                }
            })
            .ok()?;
        Some(Kicker {
            wake: Some(wake),
            thread: Some(thread),
            pid: std::process::id(),
            fd,
        })
    }

    /// Hands a start to the thread; false when one is already waiting for it, or when
    /// this process has no such thread (forked since).
    fn kick(&self) -> bool {
        self.pid == std::process::id() && self.wake.as_ref().is_some_and(|w| w.try_send(()).is_ok())
    }
}

impl Drop for Kicker {
    /// Waits for the thread, so its copy of the descriptor is closed when the device is.
    fn drop(&mut self) {
        self.wake = None;
        let Some(t) = self.thread.take() else {
            return;
        };
        if self.pid == std::process::id() {
            let _ = t.join();
        } else {
            // Forked: the thread is the parent's; its descriptor here is ours to close.
            std::mem::forget(t);
            // SAFETY: the descriptor the thread's File holds, copied by the fork; no thread
            // of this process uses it, and nothing else closes it.
            unsafe { libc::close(self.fd) };
        }
    }
}

/// Starts the writeback of every dirty page of `file` (in one go: adjacent ones merge).
fn start_writeback(file: &File) {
    use std::os::fd::AsRawFd;
    // SAFETY: a plain syscall on an open descriptor; failure only loses the hint.
    unsafe { libc::sync_file_range(file.as_raw_fd(), 0, 0, libc::SYNC_FILE_RANGE_WRITE) };
}

impl Device {
    pub fn open(path: &Path) -> Result<Device> {
        let mut dev = Device::with_file(File::open(path)?, path, false)?;
        use std::os::unix::fs::OpenOptionsExt;
        dev.direct = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(path)
            .ok();
        Ok(dev)
    }

    /// Opens for reading and writing: the transaction layer writes through it.
    pub fn open_rw(path: &Path) -> Result<Device> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)?;
        let mut dev = Device::with_file(file, path, true)?;
        use std::os::unix::fs::OpenOptionsExt;
        // Not every filesystem under an image supports O_DIRECT (tmpfs): then buffered only.
        dev.direct = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(path)
            .ok();
        Ok(dev)
    }

    fn with_file(file: File, path: &Path, writable: bool) -> Result<Device> {
        let claim = crate::io::claim::claim(&file, path, writable)?;
        use std::os::unix::fs::FileTypeExt;
        let block_device = file.metadata()?.file_type().is_block_device();
        // Block devices report size 0 in metadata: seek to the end instead.
        let size = {
            use std::io::{Seek, SeekFrom};
            let mut f = &file;
            f.seek(SeekFrom::End(0))?
        };
        Ok(Device {
            file,
            _claim: claim,
            direct: None,
            recording: Default::default(),
            rec_devid: AtomicU64::new(0),
            size,
            writable,
            block_device,
            write_budget: AtomicU64::new(u64::MAX),
            writes: AtomicU64::new(0),
            flushes: AtomicU64::new(0),
            unkicked: AtomicU64::new(0),
            kicker: std::sync::OnceLock::new(),
        })
    }

    pub fn is_writable(&self) -> bool {
        self.writable
    }

    /// Writes and flushes done so far (to prove a commit flushes exactly where it must).
    pub fn io_counts(&self) -> (u64, u64) {
        (
            self.writes.load(Ordering::Relaxed),
            self.flushes.load(Ordering::Relaxed),
        )
    }

    /// Makes every write after the next `writes` fail with an I/O error, as a dying disk
    /// would: the tests use it to prove an interrupted commit leaves the old state intact.
    pub fn fail_writes_after(&self, writes: u64) {
        self.write_budget.store(writes, Ordering::SeqCst);
    }

    /// Writes all of `buf` at `offset`; never past the end of the device.
    pub fn write_all_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        self.write_all_at_mode(buf, offset, false)
    }

    /// `write_all_at`; with `uncached` (a caller's O_DIRECT write), around the page cache
    /// of an image whenever the range is sector aligned, as the caller asked.
    pub fn write_all_at_mode(&self, buf: &[u8], offset: u64, uncached: bool) -> Result<()> {
        self.check_write(buf.len(), offset)?;
        let budget = self.write_budget.load(Ordering::SeqCst);
        if budget == 0 {
            return Err(Error::Io(std::io::Error::other("injected write failure")));
        }
        if budget != u64::MAX {
            self.write_budget.store(budget - 1, Ordering::SeqCst);
        }
        let aligned = |x: u64| x.is_multiple_of(DIRECT_ALIGN as u64);
        let direct = self.direct.as_ref().filter(|_| {
            (buf.len() >= DIRECT_MIN || uncached) && aligned(offset) && aligned(buf.len() as u64)
        });
        if let Some(d) = direct {
            // Around the page cache the write waits for the device itself.
            crate::blocking::will_wait();
            let staged;
            let buf = if aligned(buf.as_ptr() as u64) {
                buf
            } else {
                let mut b = IoBuf::zeroed(buf.len());
                b.copy_from_slice(buf);
                staged = b;
                &staged
            };
            use std::os::fd::AsRawFd;
            match crate::io::device_uring::write_at(d.as_raw_fd(), buf, offset) {
                Some(r) => r?,
                None => d.write_all_at(buf, offset)?,
            }
        } else {
            self.file.write_all_at(buf, offset)?;
        }
        if direct.is_none() {
            self.kick_writeback(buf.len() as u64);
        }
        if let Some(log) = self.recording.lock().as_mut() {
            log.push((
                self.rec_devid.load(Ordering::Relaxed),
                IoEvent::Write {
                    offset,
                    data: buf.to_vec(),
                },
            ));
        }
        self.writes.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Whether a write of `len` bytes at `offset` may be made: the device is writable and
    /// the range lies on it.
    pub(crate) fn check_write(&self, len: usize, offset: u64) -> Result<()> {
        if !self.writable {
            return Err(Error::ReadOnly);
        }
        let end = offset.checked_add(len as u64);
        if end.is_none_or(|e| e > self.size) {
            return Err(Error::InvalidArgument(format!(
                "write of {len} bytes at physical {offset} past the end of the device ({} bytes)",
                self.size
            )));
        }
        Ok(())
    }

    /// Counts `len` bytes into the page cache and, every `WRITEBACK_BATCH`, starts the
    /// writeback of all the image's dirty pages (on the `Kicker`'s thread), so a flush
    /// finds little left to write and host memory does not fill with them.
    fn kick_writeback(&self, len: u64) {
        if self.unkicked.fetch_add(len, Ordering::Relaxed) + len < WRITEBACK_BATCH {
            return;
        }
        self.unkicked.store(0, Ordering::Relaxed);
        let kicker = self.kicker.get_or_init(|| Kicker::start(&self.file));
        if !kicker.as_ref().is_some_and(Kicker::kick) {
            start_writeback(&self.file);
        }
    }

    /// Waits until every write so far is on stable storage (a cache flush).
    /// Fails if the image is no longer ours alone to write (see `Claim::check`).
    pub fn check_claim(&self) -> Result<()> {
        self._claim.check(true)
    }

    pub fn flush(&self) -> Result<()> {
        if !self.writable {
            return Err(Error::ReadOnly);
        }
        // Every log sync flushes before its superblock: a loop device attached to the image
        // since it was opened stops it there (see `claim`; commits look each time).
        self._claim.check(false)?;
        if self.write_budget.load(Ordering::SeqCst) == 0 {
            return Err(Error::Io(std::io::Error::other("injected flush failure")));
        }
        self.file.sync_data()?;
        if let Some(log) = self.recording.lock().as_mut() {
            log.push((self.rec_devid.load(Ordering::Relaxed), IoEvent::Flush));
        }
        self.flushes.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Tells the storage under `[offset, offset + len)` that its bytes are no longer
    /// needed, as the kernel's blkdev_issue_discard: an image file gets a hole punched
    /// there (fallocate PUNCH_HOLE, size kept; the range then reads as zeros), a block
    /// device a BLKDISCARD. Returns the bytes discarded: 0 where the storage cannot
    /// (a filesystem without hole punching, a device without discard). The caller makes
    /// sure nothing in the range is in use.
    /// Drops the host page cache's clean pages of `[offset, offset + len)`: a buffered read
    /// that raced an O_DIRECT write of the same range can leave the old bytes cached after
    /// the write (the kernel invalidates the range when the write ends, but a read already
    /// in flight inserts its pages after that). Best effort.
    pub(crate) fn drop_cached(&self, offset: u64, len: u64) {
        let (Ok(off), Ok(l)) = (i64::try_from(offset), i64::try_from(len)) else {
            return;
        };
        use std::os::fd::AsRawFd;
        // SAFETY: a plain syscall on our open descriptor.
        unsafe { libc::posix_fadvise(self.file.as_raw_fd(), off, l, libc::POSIX_FADV_DONTNEED) };
    }

    pub fn discard(&self, offset: u64, len: u64) -> Result<u64> {
        if !self.writable {
            return Err(Error::ReadOnly);
        }
        let end = offset.checked_add(len).filter(|&e| e <= self.size);
        if len == 0 || end.is_none() {
            return Ok(0);
        }
        self._claim.check(false)?;
        use std::os::fd::AsRawFd;
        let fd = self.file.as_raw_fd();
        let r = if self.block_device {
            let range = [offset, len];
            // SAFETY: BLKDISCARD reads two u64s from the pointer, which outlives the call.
            unsafe { libc::ioctl(fd, BLKDISCARD, range.as_ptr()) }
        } else {
            let (Ok(off), Ok(l)) = (i64::try_from(offset), i64::try_from(len)) else {
                return Ok(0);
            };
            // SAFETY: a plain syscall on our open descriptor.
            unsafe {
                libc::fallocate(
                    fd,
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                    off,
                    l,
                )
            }
        };
        if r == 0 {
            return Ok(len);
        }
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            // The storage has no discard: nothing trimmed, nothing wrong.
            Some(libc::EOPNOTSUPP) | Some(libc::ENOTTY) => Ok(0),
            _ => Err(Error::Io(e)),
        }
    }

    /// Starts (or restarts) recording writes and flushes.
    pub fn start_recording(&self) {
        *self.recording.lock() = Some(Vec::new());
    }

    /// What was recorded since `start_recording` (recording goes on), of every device
    /// sharing the recording, each event with its devid.
    pub(crate) fn take_recording(&self) -> Vec<(u64, IoEvent)> {
        self.recording
            .lock()
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// Records into `shared`, as device `devid` (see `recording`).
    pub(crate) fn share_recording(&mut self, devid: u64, shared: Recording) {
        self.recording = shared;
        self.rec_devid.store(devid, Ordering::Relaxed);
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    /// Fills `buf` from `offset`; reading past the end of the device is an error (a truncated
    /// image), never a short read passed off as data.
    pub fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.read_exact_at_mode(buf, offset, false)
    }

    /// The descriptor a read at `offset` of parts of `lens` bytes (back to back on the
    /// device) into memory at `addrs` goes through: around the page cache with `uncached` when everything is aligned for
    /// O_DIRECT, else the buffered one. Reading past the end of the device is an error.
    pub(crate) fn read_fd(
        &self,
        lens: impl Iterator<Item = usize>,
        mut addrs: impl Iterator<Item = u64>,
        offset: u64,
        uncached: bool,
    ) -> Result<std::os::fd::RawFd> {
        use std::os::fd::AsRawFd;
        let aligned = |x: u64| x.is_multiple_of(DIRECT_ALIGN as u64);
        let (mut len, mut lens_aligned) = (0u64, true);
        for l in lens {
            len += l as u64;
            lens_aligned &= aligned(l as u64);
        }
        if offset.checked_add(len).is_none_or(|e| e > self.size) {
            return Err(Error::Io(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!(
                    "read of {len} bytes at physical {offset} past the end of the device ({} bytes)",
                    self.size
                ),
            )));
        }
        Ok(match self.direct.as_ref() {
            Some(d) if uncached && aligned(offset) && lens_aligned && addrs.all(aligned) => {
                // Around the page cache the read waits for the device itself: a FUSE
                // worker pool lets another worker take the requests behind it (over
                // /dev/fuse the seed-002 mix had two requests at the device at a time).
                crate::blocking::will_wait();
                d.as_raw_fd()
            }
            _ => self.file.as_raw_fd(),
        })
    }

    /// `read_exact_at`; with `uncached` (a caller's O_DIRECT read), around the page cache
    /// of an image whenever the range is sector aligned.
    pub fn read_exact_at_mode(&self, buf: &mut [u8], offset: u64, uncached: bool) -> Result<()> {
        let end = offset.checked_add(buf.len() as u64);
        if end.is_none_or(|e| e > self.size) {
            return Err(Error::Io(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!(
                    "read of {} bytes at physical {} past the end of the device ({} bytes)",
                    buf.len(),
                    offset,
                    self.size
                ),
            )));
        }
        let aligned = |x: u64| x.is_multiple_of(DIRECT_ALIGN as u64);
        match self.direct.as_ref() {
            Some(d) if uncached && aligned(offset) && aligned(buf.len() as u64) => {
                crate::blocking::will_wait();
                use std::os::fd::AsRawFd;
                let read = |dst: &mut [u8]| -> std::io::Result<()> {
                    match crate::io::device_uring::read_at(d.as_raw_fd(), dst, offset) {
                        Some(r) => r,
                        None => d.read_exact_at(dst, offset),
                    }
                };
                if aligned(buf.as_ptr() as u64) {
                    read(buf)?;
                } else {
                    let mut staged = IoBuf::zeroed(buf.len());
                    read(&mut staged)?;
                    buf.copy_from_slice(&staged);
                }
            }
            _ => self.file.read_exact_at(buf, offset)?,
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Buffered writes past a batch start the image's writeback on the kicker's thread,
    /// which holds a descriptor of its own; dropping the device waits for the thread, so
    /// no descriptor of the image outlives it (its claim ends with the device).
    #[test]
    fn writeback_starts_on_a_thread_that_ends_with_the_device() {
        let path = std::env::temp_dir().join(format!("oleo-kicker-{}", std::process::id()));
        std::fs::write(&path, vec![0u8; 16 << 20]).expect("scratch file");
        let path = path.canonicalize().expect("canonical path");
        let before = oleo_testkit::open_descriptors(&path);
        let dev = Device::open_rw(&path).expect("open");
        let opened = oleo_testkit::open_descriptors(&path);
        for i in 0..(2 * WRITEBACK_BATCH / 4096 + 1) {
            dev.write_all_at(&[i as u8; 4096], (i * 4096) % (16 << 20))
                .expect("write");
        }
        let started = dev.kicker.get().is_some_and(|k| k.is_some());
        assert!(started, "no writeback thread after two batches");
        assert_eq!(
            oleo_testkit::open_descriptors(&path),
            opened + 1,
            "the thread holds no descriptor"
        );
        drop(dev);
        assert_eq!(
            oleo_testkit::open_descriptors(&path),
            before,
            "a descriptor outlived the device"
        );
        let back = std::fs::read(&path).expect("read back");
        assert_eq!(back[4096], 1);
        let _ = std::fs::remove_file(&path);
    }
}
