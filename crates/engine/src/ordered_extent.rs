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

use crate::compression::{compress_chunks, Compressed, Policy};
use crate::device::IoBuf;
use crate::error::{Error, Result};
use crate::file_item::data_csums;
use crate::file_write::{OrderedWrite, Piece};
use crate::filesystem::Filesystem;
use crate::fs::{FileKind, FsCore, InodeId};
use crate::reservation::Reserve;
use oleo_format::items::{
    Compression, FileExtent, FileExtentBody, INODE_FLAG_NODATACOW, INODE_FLAG_NODATASUM,
    INODE_FLAG_PREALLOC, INODE_FLAG_SYNC,
};
use oleo_format::key::{item, Key};

/// Writes shorter than this take the one-step path: the extra lock round trips would cost
/// more than the data IO they take out of the lock.
const MIN_ORDERED: usize = 32 << 10;

/// What step 1 found: the sector-aligned bytes to write at `start`.
struct Plan {
    start: u64,
    /// None when the caller's data is those bytes (sector-aligned at both ends).
    buf: Option<IoBuf>,
    len: usize,
    sums: bool,
    compress: Option<Policy>,
    sector: usize,
    /// The buffer is the caller's data alone (zero padded): nothing was read from the file.
    data_only: bool,
}

impl FsCore {
    /// Step 1, or None when the write must take the one-step path.
    fn plan_write(&self, id: InodeId, offset: u64, data: &[u8]) -> Result<Option<Plan>> {
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
    fn cancel_reservations(&mut self, pieces: &[Piece]) {
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

impl Filesystem {
    /// Writes `data` at `offset` of `id`; returns the bytes written (all of them).
    /// A file flagged SYNC (chattr +S) is made durable before this returns.
    pub fn write(&self, id: InodeId, offset: u64, data: &[u8]) -> Result<usize> {
        self.write_mode(id, offset, data, WriteHow::default())
    }

    /// `write` for the write-back of a cache whose owner keeps the file's mtime and
    /// ctime itself and sends them later (the kernel's FUSE writeback cache): the
    /// write leaves both as they are, so they never step back and forth.
    /// `uncached` as for `write_direct`.
    pub fn write_keep_times(
        &self,
        id: InodeId,
        offset: u64,
        data: &[u8],
        uncached: bool,
    ) -> Result<usize> {
        let how = WriteHow {
            keep_times: true,
            uncached,
        };
        self.write_mode(id, offset, data, how)
    }

    /// `write` for a caller's O_DIRECT write: data written in place goes to the device
    /// itself, not into an image file's page cache, wherever it is sector aligned.
    pub fn write_direct(&self, id: InodeId, offset: u64, data: &[u8]) -> Result<usize> {
        let how = WriteHow {
            uncached: true,
            ..WriteHow::default()
        };
        self.write_mode(id, offset, data, how)
    }

    fn write_mode(&self, id: InodeId, offset: u64, data: &[u8], how: WriteHow) -> Result<usize> {
        // Which paths may take the write (the paths check again under their locks).
        let attr = self.lookup_op(|core| core.getattr(id))?;
        let n = self.write_data(id, offset, data, &attr, how)?;
        if attr.flags & INODE_FLAG_SYNC != 0 {
            self.fsync(id, false)?;
        }
        Ok(n)
    }

    fn write_data(
        &self,
        id: InodeId,
        offset: u64,
        data: &[u8],
        attr: &crate::fs::Attr,
        how: WriteHow,
    ) -> Result<usize> {
        if attr.flags & INODE_FLAG_NODATACOW != 0 {
            if let Some(n) = self.write_in_place(id, offset, data, how)? {
                return Ok(n);
            }
        }
        // Space fallocate set aside takes the data where it is (`prealloc_fill`).
        if attr.flags & INODE_FLAG_PREALLOC != 0 {
            let grows = offset.saturating_add(data.len() as u64) > attr.size;
            if let Some(n) = self.fill_prealloc(id, offset, data, grows, how)? {
                return Ok(n);
            }
        }
        let early = self.compress_early(id, offset, data, attr)?;
        let _file = self.inode_locks().lock(id);
        let plan = self.core_read().plan_write(id, offset, data)?;
        let Some(plan) = plan else {
            return self.core_mut().write(id, offset, data, how.keep_times);
        };
        let bytes = plan.buf.as_deref().map_or(data, |b| &b[..plan.len]);
        let compressed = match (&plan.compress, early) {
            (Some(p), Some((q, c))) if plan.data_only && p.same(&q) => Some(c),
            (Some(p), _) => Some(compress_chunks(p, bytes, plan.sector)),
            (None, _) => None,
        };
        let end = offset + data.len() as u64;
        let r = self.write_ordered(id, end, &plan, bytes, compressed.as_ref(), how);
        if let Some(buf) = plan.buf {
            self.core_read().give_back_staging(buf);
        }
        r.map(|()| data.len())
    }

    /// A write that starts on a sector is compressed before it waits for its file's lock,
    /// so the writes of one file compress on all cores at once; step 1 then finds whether
    /// its buffer is this data alone (else the write compresses again, under the lock).
    fn compress_early(
        &self,
        id: InodeId,
        offset: u64,
        data: &[u8],
        attr: &crate::fs::Attr,
    ) -> Result<Option<(Policy, Compressed)>> {
        let (policy, sector) = {
            let core = self.core_read();
            (
                core.compress_policy(id, attr.flags)?,
                core.superblock().sectorsize as usize,
            )
        };
        let Some(policy) = policy else {
            return Ok(None);
        };
        if !offset.is_multiple_of(sector as u64) || data.len() <= sector {
            return Ok(None);
        }
        let c = if data.len().is_multiple_of(sector) {
            compress_chunks(&policy, data, sector)
        } else {
            let mut padded = data.to_vec();
            padded.resize(data.len().next_multiple_of(sector), 0);
            compress_chunks(&policy, &padded, sector)
        };
        Ok(Some((policy, c)))
    }

    /// Steps 2 to 4; `bytes` are the plan's.
    fn write_ordered(
        &self,
        id: InodeId,
        end: u64,
        plan: &Plan,
        bytes: &[u8],
        compressed: Option<&Compressed>,
        how: WriteHow,
    ) -> Result<()> {
        let len = plan.len as u64;
        let layout = compressed
            .zip(plan.compress.as_ref())
            .map(|(c, p)| (&c.chunks[..], p.kind));
        let (pieces, io, csum, sector) = {
            let mut core = self.core_mut();
            core.check_subvol_writable(id.subvol)?;
            core.check_not_immutable(id)?;
            // Reserved as if uncompressed: a compressed extent may find no run of its size.
            let pieces = core.write_op(Reserve::items(1).data(len), |t| {
                t.reserve_write(len, layout)
            })?;
            let sb = core.superblock();
            (
                pieces,
                std::sync::Arc::clone(&core.io),
                sb.csum_type(),
                sb.sectorsize as usize,
            )
        };
        // Compressed pieces come one per chunk, by file offset.
        let mut streams = std::collections::HashMap::new();
        if let Some(c) = compressed {
            let mut off = 0usize;
            for chunk in &c.chunks {
                if let Some(z) = &chunk.stream {
                    streams.insert(off, &z[..]);
                }
                off += chunk.len as usize;
            }
        }
        // A run of compressed pieces never holds more than all of them.
        let compressed_bytes: usize = streams.values().map(|z| z.len()).sum();
        let mut gather = Gather {
            io: &io,
            buf: (compressed_bytes > 0).then(|| self.core_read().take_staging(compressed_bytes)),
            run: None,
        };
        let mut sums = Vec::with_capacity(pieces.len());
        let mut at = 0usize;
        let mut io_result = Ok(());
        for p in &pieces {
            let (piece, r) = if p.compression == Compression::None {
                let piece = &bytes[at..at + p.disk_len as usize];
                let r = gather
                    .flush()
                    .and_then(|()| io.write_logical(p.bytenr, piece));
                (piece, r)
            } else {
                let piece = streams[&at];
                (piece, gather.push(p.bytenr, piece))
            };
            if let Err(e) = r {
                io_result = Err(e);
                break;
            }
            sums.push(if plan.sums {
                data_csums(csum, sector, piece)
            } else {
                Vec::new()
            });
            at += p.ram_len as usize;
        }
        if io_result.is_ok() {
            io_result = gather.flush();
        }
        if let Some(buf) = gather.buf {
            self.core_read().give_back_staging(buf);
        }
        let mut core = self.core_mut();
        if let Err(e) = io_result {
            core.cancel_reservations(&pieces);
            return Err(e);
        }
        let csize = csum.size() as u64;
        let extents = pieces.len() as u64 + 2;
        let need = Reserve::items(10).bulk(len / sector as u64 * csize + extents * 200);
        let w = OrderedWrite {
            id,
            start: plan.start,
            end,
            pieces: &pieces,
            sums: &sums,
            nocompress: compressed.is_some_and(|c| c.incompressible),
            keep_times: how.keep_times,
        };
        let r = core.write_op(need, |t| t.finish_ordered_write(&w));
        if r.is_err() && core.aborted.is_none() {
            // Nothing changed (the reservation of metadata failed): the space is free again.
            core.cancel_reservations(&pieces);
        }
        r
    }
}

/// Compressed pieces are small: those that lie end to end on disk go out as one write
/// around the image's page cache (as the kernel's on a direct-IO loop device), instead of
/// many small buffered ones whose writeback comes back later in a storm.
struct Gather<'a> {
    io: &'a crate::disk_io::DiskIo,
    /// Holds the run; big enough for all of a write's compressed pieces.
    buf: Option<IoBuf>,
    /// Logical start and length of the run, and the chunk it lies in.
    run: Option<(u64, usize, Option<u64>)>,
}

impl Gather<'_> {
    fn push(&mut self, bytenr: u64, piece: &[u8]) -> Result<()> {
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

    fn flush(&mut self) -> Result<()> {
        match (self.run.take(), &self.buf) {
            (Some((start, len, _)), Some(buf)) => {
                self.io.write_logical_mode(start, &buf[..len], true)
            }
            _ => Ok(()),
        }
    }
}
