//! Writes whose data goes to the device with no filesystem lock held (the kernel's
//! ordered extents). A write of a regular file takes the file's own lock, then:
//! 1. under the shared lock, reads what a partial first or last sector keeps;
//! 2. under the exclusive lock, briefly, reserves data space (ENOSPC here, before anything
//!    changed);
//! 3. with no filesystem lock, compresses the data if the file asks for it (on all cores,
//!    `compression`), writes it and computes its checksums;
//! 4. under the exclusive lock, puts in the extent and csum items and the inode, in the
//!    running transaction (which may be a later one than in step 2: the reservation
//!    outlives commits).
//!
//! Until step 4 the file's items point at its old data, so a read sees the whole old or
//! the whole new data of a write. Small writes, and writes that reshape the file (inline
//! data, an old last sector to zero), take the one-step path under the exclusive lock.

use crate::data::compression::Policy;
use crate::data::file_write::Piece;
use crate::error::{Error, Result};
use crate::io::device::IoBuf;
use crate::transaction::fs::{FileKind, FsCore, InodeId};
use oleo_format::items::{FileExtent, FileExtentBody, INODE_FLAG_NODATASUM};
use oleo_format::key::{item, Key};

/// Writes shorter than this take the one-step path: the extra lock round trips would cost
/// more than the data IO they take out of the lock.
const MIN_ORDERED: usize = 32 << 10;

/// What step 1 found: the sector-aligned bytes to write at `start`.
pub(crate) struct Plan {
    pub(crate) start: u64,
    /// None when the caller's data is those bytes (sector-aligned at both ends).
    pub(crate) buf: Option<IoBuf>,
    pub(crate) len: usize,
    pub(crate) sums: bool,
    pub(crate) compress: Option<Policy>,
    pub(crate) sector: usize,
    /// The buffer is the caller's data alone (zero padded): nothing was read from the file.
    pub(crate) data_only: bool,
}

impl FsCore {
    /// Step 1, or None when the write must take the one-step path.
    pub(crate) fn plan_write(&self, id: InodeId, offset: u64, data: &[u8]) -> Result<Option<Plan>> {
        let sector = u64::from(self.sb.sectorsize);
        if data.len() as u64 <= sector {
            return Ok(None);
        }
        let attr = self.getattr(id)?;
        let compress = self.compress_policy(id, attr.flags)?;
        // Compression is worth the round trips: it is what step 3 takes out of the lock.
        if data.len() < MIN_ORDERED && compress.is_none() {
            return Ok(None);
        }
        let Some(end) = offset.checked_add(data.len() as u64) else {
            return Ok(None);
        };
        let old_size = attr.size;
        // A compressed inline extent may hold a whole sector.
        let inline_limit = if compress.is_some() {
            sector
        } else {
            self.max_inline.min(sector - 1)
        };
        if attr.kind != FileKind::File
            || end > i64::MAX as u64
            || old_size.max(end) <= inline_limit
            || self.has_inline_extent(id)?
        {
            return Ok(None);
        }
        let a = offset - offset % sector;
        let b = end.next_multiple_of(sector);
        // The old last sector must read as zeros past the old size once the file grows:
        // only when this write rewrites that sector is there nothing more to do.
        let last = old_size - old_size % sector;
        if end > old_size && !old_size.is_multiple_of(sector) && last < a {
            return Ok(None);
        }
        let len = (b - a) as usize;
        let plan = |buf: Option<IoBuf>, data_only: bool| Plan {
            start: a,
            buf,
            len,
            sums: attr.flags & INODE_FLAG_NODATASUM == 0,
            compress,
            sector: sector as usize,
            data_only,
        };
        if a == offset && end == b {
            return Ok(Some(plan(None, true)));
        }
        let mut buf = self.take_staging(len);
        let read_sector = |at: u64, dst: &mut [u8]| -> Result<()> {
            let got = self.read(id, at, sector as u32)?;
            dst[..got.len()].copy_from_slice(&got);
            dst[got.len()..].fill(0);
            Ok(())
        };
        if a < offset {
            read_sector(a, &mut buf[..sector as usize])?;
        }
        let tail_read = end < b && end < old_size;
        if end < b {
            let tail_at = b - sector;
            if tail_read {
                read_sector(tail_at, &mut buf[(tail_at - a) as usize..len])?;
            } else {
                buf[(end - a) as usize..len].fill(0);
            }
        }
        buf[(offset - a) as usize..(end - a) as usize].copy_from_slice(data);
        Ok(Some(plan(Some(buf), a == offset && !tail_read)))
    }

    /// True if the file's data is an inline extent (always its only one).
    fn has_inline_extent(&self, id: InodeId) -> Result<bool> {
        let tree = self.tree_of(id)?;
        let key = Key::new(id.ino, item::EXTENT_DATA, 0);
        let Some(body) = crate::ctree::lookup(self, &tree, &key)? else {
            return Ok(false);
        };
        let fe = FileExtent::parse(&body)
            .map_err(|e| Error::corrupt(0, format!("extent of {}: {e}", id.ino)))?;
        Ok(matches!(fe.body, FileExtentBody::Inline { .. }))
    }

    /// Gives reserved data space back (a write that could not finish).
    pub(crate) fn cancel_reservations(&mut self, pieces: &[Piece]) {
        let groups = match self.running.as_deref_mut() {
            Some(t) => Some(&mut t.block_groups),
            None => self.block_groups.as_mut(),
        };
        if let Some(g) = groups {
            for p in pieces {
                g.cancel_reserved(p.bytenr);
            }
        }
    }
}

/// How a write reaches the file.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct WriteHow {
    /// A caller's O_DIRECT write: data goes around the image's page cache.
    pub uncached: bool,
    /// mtime and ctime stay (their owner sends them itself, see `write_keep_times`).
    pub keep_times: bool,
}

/// Compressed pieces are small: those that lie end to end on disk go out as one write
/// around the image's page cache (as the kernel's on a direct-IO loop device), instead of
/// many small buffered ones whose writeback comes back later in a storm.
pub(crate) struct Gather<'a> {
    pub(crate) io: &'a crate::io::disk_io::DiskIo,
    /// Holds the run; big enough for all of a write's compressed pieces.
    pub(crate) buf: Option<IoBuf>,
    /// Logical start and length of the run, and the chunk it lies in.
    pub(crate) run: Option<(u64, usize, Option<u64>)>,
}

impl Gather<'_> {
    pub(crate) fn push(&mut self, bytenr: u64, piece: &[u8]) -> Result<()> {
        let Some(buf) = self.buf.as_mut() else {
            return self.io.write_logical_mode(bytenr, piece, true);
        };
        // One write maps to one chunk: adjacent addresses may be two chunks.
        let chunk = self.io.chunks().lookup(bytenr).map(|(start, _)| start);
        let joins = self
            .run
            .is_some_and(|(start, len, c)| start + len as u64 == bytenr && c == chunk);
        if !joins {
            if let Some((start, len, _)) = self.run.take() {
                self.io.write_logical_mode(start, &buf[..len], true)?;
            }
        }
        let (_, len, _) = self.run.get_or_insert((bytenr, 0, chunk));
        buf[*len..*len + piece.len()].copy_from_slice(piece);
        *len += piece.len();
        Ok(())
    }

    pub(crate) fn flush(&mut self) -> Result<()> {
        match (self.run.take(), &self.buf) {
            (Some((start, len, _)), Some(buf)) => {
                self.io.write_logical_mode(start, &buf[..len], true)
            }
            _ => Ok(()),
        }
    }
}
