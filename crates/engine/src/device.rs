//! Block devices: where bytes physically live. For now one image file or block device,
//! read with positional reads so many threads can read at once without a lock. Opened
//! read-write, it also takes positional writes and cache flushes (fdatasync).

use crate::error::{Error, Result};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// One thing the device was asked to do, as a crash simulator records it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IoEvent {
    Write { offset: u64, data: Vec<u8> },
    Flush,
}

pub struct Device {
    file: File,
    /// When set, every write and flush is also appended here (crash simulation).
    recording: parking_lot::Mutex<Option<Vec<IoEvent>>>,
    size: u64,
    writable: bool,
    /// Writes left before an injected failure (tests of crash consistency); MAX: never.
    write_budget: AtomicU64,
    writes: AtomicU64,
    flushes: AtomicU64,
}

impl Device {
    pub fn open(path: &Path) -> Result<Device> {
        Device::with_file(File::open(path)?, false)
    }

    /// Opens for reading and writing: the transaction layer writes through it.
    pub fn open_rw(path: &Path) -> Result<Device> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)?;
        Device::with_file(file, true)
    }

    fn with_file(file: File, writable: bool) -> Result<Device> {
        // Block devices report size 0 in metadata: seek to the end instead.
        let size = {
            use std::io::{Seek, SeekFrom};
            let mut f = &file;
            f.seek(SeekFrom::End(0))?
        };
        Ok(Device {
            file,
            recording: parking_lot::Mutex::new(None),
            size,
            writable,
            write_budget: AtomicU64::new(u64::MAX),
            writes: AtomicU64::new(0),
            flushes: AtomicU64::new(0),
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
        if !self.writable {
            return Err(Error::ReadOnly);
        }
        let end = offset.checked_add(buf.len() as u64);
        if end.is_none_or(|e| e > self.size) {
            return Err(Error::InvalidArgument(format!(
                "write of {} bytes at physical {offset} past the end of the device ({} bytes)",
                buf.len(),
                self.size
            )));
        }
        let budget = self.write_budget.load(Ordering::SeqCst);
        if budget == 0 {
            return Err(Error::Io(std::io::Error::other("injected write failure")));
        }
        if budget != u64::MAX {
            self.write_budget.store(budget - 1, Ordering::SeqCst);
        }
        self.file.write_all_at(buf, offset)?;
        if let Some(log) = self.recording.lock().as_mut() {
            log.push(IoEvent::Write {
                offset,
                data: buf.to_vec(),
            });
        }
        self.writes.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Waits until every write so far is on stable storage (a cache flush).
    pub fn flush(&self) -> Result<()> {
        if !self.writable {
            return Err(Error::ReadOnly);
        }
        if self.write_budget.load(Ordering::SeqCst) == 0 {
            return Err(Error::Io(std::io::Error::other("injected flush failure")));
        }
        self.file.sync_data()?;
        if let Some(log) = self.recording.lock().as_mut() {
            log.push(IoEvent::Flush);
        }
        self.flushes.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Starts (or restarts) recording writes and flushes.
    pub fn start_recording(&self) {
        *self.recording.lock() = Some(Vec::new());
    }

    /// What was recorded since `start_recording` (recording goes on).
    pub fn take_recording(&self) -> Vec<IoEvent> {
        self.recording
            .lock()
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    /// Fills `buf` from `offset`; reading past the end of the device is an error (a truncated
    /// image), never a short read passed off as data.
    pub fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
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
        self.file.read_exact_at(buf, offset)?;
        Ok(())
    }
}
