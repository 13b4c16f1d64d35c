//! Block devices: where bytes physically live. For now one image file or block device,
//! read with positional reads so many threads can read at once without a lock.

use crate::error::{Error, Result};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

pub struct Device {
    file: File,
    size: u64,
}

impl Device {
    pub fn open(path: &Path) -> Result<Device> {
        let file = File::open(path)?;
        // Block devices report size 0 in metadata: seek to the end instead.
        let size = {
            use std::io::{Seek, SeekFrom};
            let mut f = &file;
            f.seek(SeekFrom::End(0))?
        };
        Ok(Device { file, size })
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
