//! A file's data in the stream: WRITEs, FALLOCATE or zeros for preallocated ranges,
//! TRUNCATE for a trailing hole.

use super::{show, Sender, BIG_READ};
use oleo::format::send_stream::Command;
use oleo::InodeId;
use std::io::Write;

impl<W: Write> Sender<'_, W> {
    /// The file's data: WRITEs of what its extents hold, zeros or FALLOCATE for
    /// preallocated ranges, nothing for holes; a TRUNCATE when the last range sent does
    /// not end at the size.
    pub(super) fn data(&mut self, id: InodeId, path: &[u8], size: u64) -> Result<(), String> {
        let end_sent = self.data_range(id, path, 0, size, size)?;
        if end_sent != size {
            self.cmd(&Command::Truncate {
                path: path.to_vec(),
                size,
            })?;
        }
        Ok(())
    }

    /// The data of `[from, to)` of a file of `size` bytes, as `data` sends it, without the
    /// TRUNCATE: holes in it are skipped (the receiver must already have them as holes or
    /// zeros). Returns the end of the last range sent (`from` if none).
    pub(super) fn data_range(
        &mut self,
        id: InodeId,
        path: &[u8],
        from: u64,
        to: u64,
        size: u64,
    ) -> Result<u64, String> {
        let err = |e: oleo::Error| format!("{}: {e}", show(path));
        let extents = self.fs.file_extents(id).map_err(err)?;
        let to = to.min(size);
        let mut end_sent = from;
        for x in extents {
            let start = x.file_offset.max(end_sent);
            let end = x.file_offset.saturating_add(x.len).min(to);
            if start >= end {
                continue;
            }
            if x.prealloc {
                if self.w.version() >= 2 {
                    self.cmd(&Command::Fallocate {
                        path: path.to_vec(),
                        mode: 0,
                        offset: start,
                        len: end - start,
                    })?;
                } else {
                    let zeros = vec![0u8; self.read_size];
                    let mut off = start;
                    while off < end {
                        let n = (end - off).min(self.read_size as u64) as usize;
                        self.cmd(&Command::Write {
                            path: path.to_vec(),
                            offset: off,
                            data: zeros[..n].to_vec(),
                        })?;
                        off += n as u64;
                    }
                }
                end_sent = end;
                continue;
            }
            let mut off = start;
            while off < end {
                let want = (end - off).min(BIG_READ) as u32;
                let buf = self.fs.read(id, off, want).map_err(err)?;
                if buf.is_empty() {
                    return Err(format!(
                        "{}: no data at offset {off} of a {size}-byte file",
                        show(path)
                    ));
                }
                for (i, chunk) in buf.chunks(self.read_size).enumerate() {
                    self.cmd(&Command::Write {
                        path: path.to_vec(),
                        offset: off + (i * self.read_size) as u64,
                        data: chunk.to_vec(),
                    })?;
                }
                off += buf.len() as u64;
            }
            end_sent = off;
        }
        Ok(end_sent)
    }
}
