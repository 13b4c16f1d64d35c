//! What a program does to a file's contents through the filesystem (the kernel's
//! file_operations in file.c): write in one step, fallocate in every mode, and
//! copy_file_range (shared extents where it can, copies where it must).

use crate::error::{Error, Result};
use crate::inode::inode_item::now;
use crate::transaction::fs::{FileKind, FsCore, InodeId};
use crate::transaction::space::reservation::Reserve;
use crate::transaction::Transaction;
use crate::vfs::inode_ops::{S_IFDIR, S_IFMT, S_IFREG};
use oleo_format::items::INODE_FLAG_NODATASUM;

/// How `fallocate` changes the range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FallocMode {
    /// Allocate (prealloc extents over holes); grows the size unless `keep_size`.
    Allocate {
        /// FALLOC_FL_KEEP_SIZE: the file size stays even if the range ends past it.
        keep_size: bool,
    },
    /// Deallocate (FALLOC_FL_PUNCH_HOLE): the range reads as zeros, the size stays.
    PunchHole,
    /// Zeros over the range, allocated (FALLOC_FL_ZERO_RANGE); grows the size unless
    /// `keep_size`.
    ZeroRange {
        /// FALLOC_FL_KEEP_SIZE: the file size stays even if the range ends past it.
        keep_size: bool,
    },
}

impl Transaction<'_> {
    fn fallocate(
        &mut self,
        id: InodeId,
        offset: u64,
        len: u64,
        mode: FallocMode,
        keep_times: bool,
    ) -> Result<()> {
        let mut inode = self.read_inode(id)?;
        if inode.mode & S_IFMT != S_IFREG {
            return Err(if inode.mode & S_IFMT == S_IFDIR {
                Error::IsDir
            } else {
                Error::NoDevice
            });
        }
        if len == 0 {
            return Err(Error::InvalidArgument("fallocate of zero bytes".into()));
        }
        match mode {
            FallocMode::Allocate { keep_size } => {
                self.preallocate(id, &mut inode, offset, len, keep_size)?
            }
            FallocMode::PunchHole => self.punch_hole(id, &mut inode, offset, len)?,
            FallocMode::ZeroRange { keep_size } => {
                self.punch_hole(id, &mut inode, offset, len)?;
                self.preallocate(id, &mut inode, offset, len, keep_size)?;
            }
        }
        // Like file_modified() in the kernel's fallocate paths: every mode stamps both.
        if !keep_times {
            let t = now();
            inode.ctime = t;
            inode.mtime = t;
        }
        self.write_inode(id, &mut inode)
    }
}

impl FsCore {
    /// Writes `data` at `offset`; returns the bytes written (all of them).
    pub(crate) fn write(
        &mut self,
        id: InodeId,
        offset: u64,
        data: &[u8],
        keep_times: bool,
    ) -> Result<usize> {
        self.check_subvol_writable(id.subvol)?;
        self.check_not_immutable(id)?;
        let need = self.write_reserve(id, offset, data.len() as u64)?;
        self.write_op(need, |t| t.write_file(id, offset, data, keep_times))?;
        Ok(data.len())
    }

    /// What writing `len` bytes at `offset` may take: the sectors it covers, the sector
    /// at the old end of file (rewritten with zeros past it), per-extent items and csums.
    fn write_reserve(&self, id: InodeId, offset: u64, len: u64) -> Result<Reserve> {
        let sector = u64::from(self.sb.sectorsize);
        let size = self.getattr(id)?.size;
        let end = offset.saturating_add(len);
        let mut data = end.next_multiple_of(sector) - (offset - offset % sector);
        // The sector at the old end is rewritten with zeros past it, and an inline extent
        // turns into a regular one (inline files are at most a sector: a compressed one
        // may hold a whole sector).
        if end > size && size % sector != 0 && size - size % sector < offset - offset % sector
            || size > 0 && size <= sector
        {
            data += sector;
        }
        // Small inline files still get a sector in case they turn regular.
        data = data.max(sector);
        let csums = data / sector * self.sb.csum_type().size() as u64;
        let extents = data / (1 << 20) + 2;
        Ok(Reserve::items(10).bulk(csums + extents * 200).data(data))
    }

    pub(crate) fn fallocate(
        &mut self,
        id: InodeId,
        offset: u64,
        len: u64,
        mode: FallocMode,
        keep_times: bool,
    ) -> Result<()> {
        self.check_subvol_writable(id.subvol)?;
        // Allocating is appending's business; punching and zeroing change data.
        match mode {
            FallocMode::Allocate { .. } => self.check_not_immutable(id)?,
            _ => self.check_may_modify(id)?,
        }
        // Punching zeroes the partial sectors at both ends; allocating fills the holes of
        // the sector-rounded range (two sectors more than `len`), after the sector at the
        // old end of file is rewritten (`prepare_extend`); zeroing does both.
        let sector = u64::from(self.sb.sectorsize);
        let data = match mode {
            FallocMode::PunchHole => 2 * sector,
            FallocMode::Allocate { .. } => len.saturating_add(3 * sector),
            FallocMode::ZeroRange { .. } => len.saturating_add(5 * sector),
        };
        let extents = len / (1 << 20) + 2;
        self.write_op(Reserve::items(10).bulk(extents * 200).data(data), |t| {
            t.fallocate(id, offset, len, mode, keep_times)
        })
    }

    /// Copies up to `len` bytes (stopping at the source's end) and returns how many. Whole
    /// sectors share the source's extents (a reflink); the rest is copied.
    pub(crate) fn copy_file_range(
        &mut self,
        src: InodeId,
        src_off: u64,
        dst: InodeId,
        dst_off: u64,
        len: u64,
        keep_times: bool,
    ) -> Result<u64> {
        self.check_subvol_writable(dst.subvol)?;
        self.check_not_immutable(dst)?;
        let sa = self.getattr(src)?;
        let da = self.getattr(dst)?;
        if sa.kind != FileKind::File || da.kind != FileKind::File {
            return Err(if sa.kind == FileKind::Dir || da.kind == FileKind::Dir {
                Error::IsDir
            } else {
                Error::InvalidArgument("not a regular file".into())
            });
        }
        if src.subvol != dst.subvol {
            return Err(Error::CrossDevice);
        }
        let len = len.min(sa.size.saturating_sub(src_off));
        if len == 0 {
            return Ok(0);
        }
        if src == dst && src_off < dst_off + len && dst_off < src_off + len {
            return Err(Error::InvalidArgument(
                "overlapping copy within one file".into(),
            ));
        }
        let sector = u64::from(self.sb.sectorsize);
        let src_end = src_off + len;
        // A tail that ends at the source's EOF may be cloned whole when it also ends (or
        // lands past) the destination's EOF: the bytes past EOF are never visible.
        let tail_ok = src_end == sa.size && dst_off + len >= da.size;
        let aligned = src_off.is_multiple_of(sector)
            && dst_off.is_multiple_of(sector)
            && (len % sector == 0 || tail_ok);
        let inline = sa.size <= self.max_inline.min(sector - 1);
        // As the kernel's remap: never make the destination partly checksummed (a
        // NODATASUM source, NOCOW's, shares nothing with a checksummed file: it copies).
        let same_sums = (sa.flags ^ da.flags) & INODE_FLAG_NODATASUM == 0;
        if aligned && !inline && src != dst && same_sums {
            let clone_len = len.next_multiple_of(sector);
            let extents = clone_len / (1 << 20) + 2;
            self.write_op(
                Reserve::items(10).bulk(extents * 200).data(2 * sector),
                |t| t.clone_range(src, src_off, dst, dst_off, clone_len, keep_times),
            )?;
            if clone_len != len {
                // The clone covered whole sectors: the size ends where the data ends.
                let want = (dst_off + len).max(da.size);
                self.write_op(Reserve::items(2), |t| {
                    let mut i = t.read_inode(dst)?;
                    i.size = want;
                    t.write_inode(dst, &mut i)
                })?;
            }
            return Ok(len);
        }
        let mut done = 0u64;
        while done < len {
            let n = (len - done).min(8 << 20) as u32;
            let data = self.read(src, src_off + done, n)?;
            if data.is_empty() {
                break;
            }
            self.write(dst, dst_off + done, &data, keep_times)?;
            done += data.len() as u64;
        }
        Ok(done)
    }
}
