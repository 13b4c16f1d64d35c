//! Reading file data in two steps, so data IO holds no filesystem lock:
//! 1. `FsCore::plan_read`, under the shared lock: the file's extent items and the data
//!    checksums of the ranges to read (tree lookups, mostly from memory);
//! 2. `ReadPlan::execute`, with no lock: device reads, checksum checks, decompression.
//!
//! Between the two a writer may free an extent the plan reads. The plan holds a `ReadPin`
//! taken in the transaction it looked in, and space freed from that transaction on is not
//! handed out again while the pin lives (see `commit_pipe::ReadPins`), so the blocks still
//! hold what the plan expects.

use crate::ctree::Cursor;
use crate::data::file::{Mapping, MappingKind};
use crate::error::{Error, Result};
use crate::io::disk_io::DiskIo;
use crate::transaction::commit_pipe::ReadPin;
use crate::transaction::fs::ExtentCache;
use crate::transaction::fs::{FileKind, FsCore, InodeId};
use oleo_format::compression::decompress;
use oleo_format::items::{Compression, INODE_FLAG_NODATASUM};
use oleo_format::key::{item, objectid, Key};
use oleo_format::CsumType;
use std::sync::Arc;

/// A read worked out under the lock; `execute` does the IO.
pub(crate) struct ReadPlan {
    io: Arc<DiskIo>,
    extents: Arc<ExtentCache>,
    sector: u64,
    csum_type: CsumType,
    len: usize,
    pieces: Vec<Piece>,
    _pin: Option<ReadPin>,
    /// Read around the device's page cache (a caller's O_DIRECT read).
    pub(crate) uncached: bool,
}

/// Bytes `[at, at + len)` of the result and where they come from.
struct Piece {
    at: usize,
    len: usize,
    source: Source,
}

enum Source {
    /// Known already (holes, inline data, a cached decompressed extent).
    Ready(Vec<u8>),
    /// Plain bytes on disk.
    Disk(DataRead),
    /// A compressed extent, decoded as a whole, then `from` bytes into it.
    Compressed {
        raw: DataRead,
        compression: Compression,
        ram_bytes: u64,
        from: u64,
    },
}

/// Sectors `[start, end)` at a logical address, with their checksums (None: not checked),
/// of which the bytes from `logical` are wanted.
struct DataRead {
    id: InodeId,
    /// File offset of `logical` (for the error a bad checksum gives).
    file_pos: u64,
    logical: u64,
    start: u64,
    end: u64,
    csums: Vec<Option<Vec<u8>>>,
}

impl FsCore {
    /// The transaction a lookup made now looks in: the running one, or the next.
    pub(crate) fn running_transid(&self) -> u64 {
        self.running
            .as_ref()
            .map_or(self.sb.generation + 1, |t| t.transid)
    }

    /// Reads up to `size` bytes at `offset`; short only at end of file.
    pub(crate) fn read(&self, id: InodeId, offset: u64, size: u32) -> Result<Vec<u8>> {
        self.plan_read(id, offset, size, None)?.execute()
    }

    /// Works out a read of up to `size` bytes at `offset` (see the module doc); `pin` is
    /// kept until the plan is executed.
    pub(crate) fn plan_read(
        &self,
        id: InodeId,
        offset: u64,
        size: u32,
        pin: Option<ReadPin>,
    ) -> Result<ReadPlan> {
        let attr = self.getattr(id)?;
        if attr.kind == FileKind::Dir {
            return Err(Error::IsDir);
        }
        let mut plan = ReadPlan {
            io: Arc::clone(&self.io),
            extents: Arc::clone(&self.extents),
            sector: u64::from(self.sb.sectorsize),
            csum_type: self.sb.csum_type(),
            len: 0,
            pieces: Vec::new(),
            _pin: pin,
            uncached: false,
        };
        let end = offset.saturating_add(size as u64).min(attr.size);
        if offset >= end {
            return Ok(plan);
        }
        plan.len = (end - offset) as usize;
        let verify = attr.flags & INODE_FLAG_NODATASUM == 0;
        for m in self.mappings(id, offset, end)? {
            let (s, e) = (
                m.file_start.max(offset),
                // Saturating: an inline extent's length is its (unchecked) ram_bytes.
                m.file_start.saturating_add(m.file_len).min(end),
            );
            if s >= e {
                continue;
            }
            let source = self.source(id, &m, s, (e - s) as usize, verify)?;
            plan.pieces.push(Piece {
                at: (s - offset) as usize,
                len: (e - s) as usize,
                source,
            });
        }
        Ok(plan)
    }

    /// A read of the `disk_len` bytes of file `id`'s disk extent at `bytenr` as they are
    /// on disk (compressed data stays compressed), checked against their checksums unless
    /// the file has none. The extent must be one of the file's.
    pub(crate) fn plan_raw_extent(
        &self,
        id: InodeId,
        bytenr: u64,
        disk_len: u64,
        pin: Option<ReadPin>,
    ) -> Result<ReadPlan> {
        let attr = self.getattr(id)?;
        let sector = u64::from(self.sb.sectorsize);
        let Some(x) = self
            .file_extents(id)?
            .into_iter()
            .find(|x| !x.inline && x.disk_bytenr == bytenr && x.disk_num_bytes == disk_len)
        else {
            return Err(Error::InvalidArgument(format!(
                "inode {} has no extent of {disk_len} bytes at {bytenr}",
                id.ino
            )));
        };
        // Raw reads are for compressed extents, at most 128 KiB: more is hostile.
        if disk_len == 0 || disk_len > (1 << 20) || !bytenr.is_multiple_of(sector) {
            return Err(Error::corrupt(
                bytenr,
                format!("a disk extent of {disk_len} bytes in inode {}", id.ino),
            ));
        }
        let verify = attr.flags & INODE_FLAG_NODATASUM == 0;
        let raw = self.data_read(id, x.file_offset, bytenr, disk_len as usize, verify)?;
        Ok(ReadPlan {
            io: Arc::clone(&self.io),
            extents: Arc::clone(&self.extents),
            sector,
            csum_type: self.sb.csum_type(),
            len: disk_len as usize,
            pieces: vec![Piece {
                at: 0,
                len: disk_len as usize,
                source: Source::Disk(raw),
            }],
            _pin: pin,
            uncached: false,
        })
    }

    /// Where the `len` file bytes at `pos`, all within mapping `m`, come from.
    fn source(
        &self,
        id: InodeId,
        m: &Mapping,
        pos: u64,
        len: usize,
        verify: bool,
    ) -> Result<Source> {
        let rel = pos - m.file_start;
        Ok(match &m.kind {
            MappingKind::Zero => Source::Ready(vec![0; len]),
            MappingKind::Inline(data) => {
                let decoded;
                let plain: &[u8] = if m.compression == Compression::None {
                    data
                } else {
                    decoded = match decompress(
                        m.compression,
                        data,
                        m.ram_bytes.min(1 << 20) as usize,
                        self.sb.sectorsize as usize,
                    ) {
                        Ok(d) => d,
                        Err(e) if self.io.rescue().ignore_data_csums => {
                            self.io.skips().note(
                                "ignoredatacsums",
                                id.ino ^ (id.subvol << 48),
                                || {
                                    format!(
                                    "inline extent of inode {} (subvolume {}): {e}; read as zeros",
                                    id.ino, id.subvol
                                )
                                },
                            );
                            Vec::new()
                        }
                        Err(e) => {
                            return Err(Error::corrupt(
                                0,
                                format!("inline extent of inode {}: {e}", id.ino),
                            ))
                        }
                    };
                    &decoded
                };
                Source::Ready(copy_or_zero(plain, rel as usize, len))
            }
            MappingKind::Disk { bytenr, offset, .. } if m.compression == Compression::None => {
                // Checked: disk_bytenr and offset are image fields (sector aligned, any size).
                let logical = bytenr
                    .checked_add(*offset)
                    .and_then(|l| l.checked_add(rel))
                    .ok_or_else(|| {
                        Error::corrupt(
                            *bytenr,
                            format!("extent of inode {} overflows the address space", id.ino),
                        )
                    })?;
                Source::Disk(self.data_read(id, pos, logical, len, verify)?)
            }
            MappingKind::Disk {
                bytenr,
                disk_len,
                offset,
            } => {
                // Saturating: a hostile offset past the decoded extent reads as zeros.
                let from = offset.saturating_add(rel);
                if let Some(plain) = self.extents.get(bytenr) {
                    return Ok(Source::Ready(copy_or_zero(&plain, from as usize, len)));
                }
                // Compressed extents are at most 128 KiB decoded; anything larger is hostile.
                if *disk_len > (1 << 20) || m.ram_bytes > (1 << 20) {
                    return Err(Error::corrupt(
                        *bytenr,
                        format!(
                            "compressed extent of {disk_len} bytes ({} decoded) is too large",
                            m.ram_bytes
                        ),
                    ));
                }
                Source::Compressed {
                    raw: self.data_read(id, pos, *bytenr, *disk_len as usize, verify)?,
                    compression: m.compression,
                    ram_bytes: m.ram_bytes,
                    from,
                }
            }
        })
    }

    /// The sectors holding `len` bytes at `logical`, and their checksums if `verify`.
    fn data_read(
        &self,
        id: InodeId,
        file_pos: u64,
        logical: u64,
        len: usize,
        verify: bool,
    ) -> Result<DataRead> {
        let sector = self.sb.sectorsize as u64;
        let start = logical - logical % sector;
        // Checked: `logical` comes from image fields; near the top of the address space the
        // rounded-up end would overflow.
        let end = logical
            .checked_add(len as u64)
            .and_then(|e| e.checked_next_multiple_of(sector))
            .ok_or_else(|| Error::corrupt(logical, "data range overflows the address space"))?;
        let csums = if verify {
            match self.data_csums(start, end) {
                Ok(c) => c,
                Err(e)
                    if self.io.rescue().ignore_data_csums && !matches!(e, Error::NotCached(_)) =>
                {
                    self.io.skips().note("ignoredatacsums", start, || {
                        format!("checksums of data at logical {start} unreadable ({e}); read unverified")
                    });
                    Vec::new()
                }
                Err(e) => return Err(e),
            }
        } else {
            Vec::new()
        };
        Ok(DataRead {
            id,
            file_pos,
            logical,
            start,
            end,
            csums,
        })
    }

    /// Per-sector checksums for `[start, end)`; None where the csum tree has none.
    pub(crate) fn data_csums(&self, start: u64, end: u64) -> Result<Vec<Option<Vec<u8>>>> {
        let sector = self.sb.sectorsize as u64;
        let size = self.sb.csum_type().size();
        let mut out = vec![None; ((end - start) / sector) as usize];
        let Some(tree) = self.csum_root() else {
            return Ok(out);
        };
        let mut cur = Cursor::search(
            self,
            &tree,
            &Key::new(objectid::EXTENT_CSUM, item::EXTENT_CSUM, start),
        )?;
        let exact = matches!(cur.item()?, Some((k, _)) if k.objectid == objectid::EXTENT_CSUM && k.item_type == item::EXTENT_CSUM && k.offset == start);
        if !exact
            && cur.prev()?
            && !matches!(cur.item()?, Some((k, _)) if k.objectid == objectid::EXTENT_CSUM && k.item_type == item::EXTENT_CSUM)
        {
            cur.next()?;
        }
        while let Some((key, body)) = cur.item()? {
            if key.objectid != objectid::EXTENT_CSUM
                || key.item_type != item::EXTENT_CSUM
                || key.offset >= end
            {
                break;
            }
            for (i, c) in body.chunks_exact(size).enumerate() {
                // Saturating: a csum item keyed near u64::MAX must not overflow.
                let at = key.offset.saturating_add(i as u64 * sector);
                if at >= end {
                    break;
                }
                if at >= start {
                    out[((at - start) / sector) as usize] = Some(c.to_vec());
                }
            }
            cur.next()?;
        }
        Ok(out)
    }
}

impl ReadPlan {
    /// Does the reads the plan describes; needs no filesystem lock.
    pub(crate) fn execute(self) -> Result<Vec<u8>> {
        let mut out = vec![0u8; self.len];
        self.execute_into(&mut out)?;
        Ok(out)
    }

    /// `execute` into `out` (at least the plan's length); returns the length. Whole
    /// sectors of plain extents are read straight into `out`, the rest staged.
    pub(crate) fn execute_into(self, out: &mut [u8]) -> Result<usize> {
        let out = &mut out[..self.len];
        let mut covered = 0;
        for p in &self.pieces {
            // Bytes no piece covers read as zeros (the caller's buffer may hold anything).
            // Pieces come in file order; a hostile image's may overlap.
            if covered < p.at {
                out[covered..p.at].fill(0);
            }
            covered = covered.max(p.at + p.len);
            let dst = &mut out[p.at..p.at + p.len];
            match &p.source {
                Source::Ready(bytes) => dst.copy_from_slice(bytes),
                Source::Disk(r) if r.logical == r.start && (r.end - r.start) as usize == p.len => {
                    self.read_verified(r, dst)?;
                }
                Source::Disk(r) => {
                    let mut buf = crate::io::device::IoBuf::zeroed((r.end - r.start) as usize);
                    self.read_verified(r, &mut buf)?;
                    let skip = (r.logical - r.start) as usize;
                    dst.copy_from_slice(&buf[skip..skip + p.len]);
                }
                Source::Compressed {
                    raw,
                    compression,
                    ram_bytes,
                    from,
                } => {
                    let plain = self.decoded(raw, *compression, *ram_bytes)?;
                    dst.copy_from_slice(&copy_or_zero(&plain, *from as usize, p.len));
                }
            }
        }
        out[covered..].fill(0);
        Ok(self.len)
    }

    /// A compressed extent decoded, kept in the extent cache.
    fn decoded(&self, raw: &DataRead, compression: Compression, ram: u64) -> Result<Arc<Vec<u8>>> {
        if let Some(d) = self.extents.get(&raw.logical) {
            return Ok(d);
        }
        let mut buf = crate::io::device::IoBuf::zeroed((raw.end - raw.start) as usize);
        self.read_verified(raw, &mut buf)?;
        let plain = match decompress(compression, &buf, ram as usize, self.sector as usize) {
            Ok(p) => p,
            // The user asked for what there is: the extent reads as zeros, said once.
            Err(e) if self.io.rescue().ignore_data_csums => {
                self.io
                    .skips()
                    .note("ignoredatacsums", raw.logical ^ (1 << 63), || {
                        format!(
                            "{} extent at logical {} (inode {}): {e}; read as zeros",
                            compression.name(),
                            raw.logical,
                            raw.id.ino
                        )
                    });
                Vec::new()
            }
            Err(e) => {
                return Err(Error::corrupt(
                    raw.logical,
                    format!("{} extent of inode {}: {e}", compression.name(), raw.id.ino),
                ))
            }
        };
        let plain = Arc::new(plain);
        self.extents.insert(raw.logical, Arc::clone(&plain));
        Ok(plain)
    }

    /// The sectors of `r`, verified. The first read takes a whole copy (or parts of every
    /// copy at once); each sector that fails its checksum or could not be read is then
    /// asked of the other copies in turn (for RAID5/6: rebuilt from parity, its row's
    /// other strips read as they are), as the kernel's read repair does sector by sector.
    /// Copies found bad are rewritten from the good bytes.
    fn read_verified(&self, r: &DataRead, buf: &mut [u8]) -> Result<()> {
        let sector = self.sector as usize;
        let len = (r.end - r.start) as usize;
        debug_assert_eq!(buf.len(), len);
        let nsec = len / sector;
        let order = self.io.mirror_order(r.start, len as u64);
        // Which copy each sector came from; None: not read yet.
        let mut from: Vec<Option<usize>> = vec![None; nsec];
        let mut io_err = None;
        let sector_ok =
            |bytes: &[u8], i: usize| sector_ok_in(bytes, r.csums.get(i), self.csum_type);
        // Each sector's checksum verdict, taken as its piece arrives (None: not yet).
        let mut verdict: Vec<Option<bool>> = vec![None; nsec];
        let mut check =
            |at: usize, bytes: &[u8]| judge(&mut verdict, at, bytes, sector, &sector_ok);
        match self.io.read_spread(r.start, buf, self.uncached, &mut check) {
            Ok(Some(parts)) => {
                for (at, l, m) in parts {
                    for f in &mut from[at / sector..(at + l) / sector] {
                        *f = Some(m);
                    }
                }
            }
            _ => {
                verdict.iter_mut().for_each(|v| *v = None);
                let mut check =
                    |at: usize, bytes: &[u8]| judge(&mut verdict, at, bytes, sector, &sector_ok);
                match self.io.read_logical_checked(
                    r.start,
                    buf,
                    order[0],
                    self.uncached,
                    &mut check,
                ) {
                    Ok(()) => from.iter_mut().for_each(|f| *f = Some(order[0])),
                    Err(e) => {
                        log::error!("data at logical {} copy {}: {e}", r.start, order[0]);
                        io_err = Some(e);
                    }
                }
            }
        }
        // A sector read through the host page cache that fails its checksum is read again
        // around it (O_DIRECT) before it counts as bad: a buffered read that raced an
        // O_DIRECT write of the same blocks leaves the old bytes cached (fstests
        // generic/418 on a block device). The stale pages are dropped.
        if !self.uncached {
            let stale: Vec<usize> = (0..nsec)
                .filter(|&i| {
                    from[i].is_some()
                        && !verdict[i].unwrap_or_else(|| sector_ok(&buf[i * sector..][..sector], i))
                })
                .collect();
            for (a, b) in runs(&stale) {
                for m in order
                    .iter()
                    .copied()
                    .filter(|&m| from[a..b].contains(&Some(m)))
                {
                    let at = r.start + (a * sector) as u64;
                    let mut tmp = crate::io::device::IoBuf::zeroed((b - a) * sector);
                    if self.io.read_logical_mode(at, &mut tmp, m, true).is_err() {
                        continue;
                    }
                    let mut dropped = false;
                    for i in (a..b).filter(|&i| from[i] == Some(m)) {
                        let t = (i - a) * sector;
                        if sector_ok_in(&tmp[t..t + sector], r.csums.get(i), self.csum_type) {
                            buf[i * sector..(i + 1) * sector].copy_from_slice(&tmp[t..t + sector]);
                            verdict[i] = Some(true);
                            if !dropped {
                                log::warn!(
                                    "data at logical {at} (inode {}, subvolume {}): the host page cache held older bytes than the disk; read again around it",
                                    r.id.ino,
                                    r.id.subvol
                                );
                                self.io.drop_cached(at, ((b - a) * sector) as u64, m);
                                dropped = true;
                            }
                        }
                    }
                }
            }
        }
        // Sectors still wanted, with the copies already tried for each.
        let mut tried: Vec<Vec<usize>> = vec![Vec::new(); nsec];
        let mut bad_copies: Vec<(usize, usize)> = Vec::new(); // (sector, copy)
        let mut want: Vec<usize> = Vec::new();
        for i in 0..nsec {
            let good = || verdict[i].unwrap_or_else(|| sector_ok(&buf[i * sector..][..sector], i));
            match from[i] {
                Some(_) if good() => {}
                Some(m) => {
                    self.note_bad(r, i, m);
                    tried[i].push(m);
                    bad_copies.push((i, m));
                    want.push(i);
                }
                None => want.push(i),
            }
        }
        for &m in &order {
            if want.is_empty() {
                break;
            }
            let todo: Vec<usize> = want
                .iter()
                .copied()
                .filter(|&i| !tried[i].contains(&m))
                .collect();
            for (a, b) in runs(&todo) {
                let at = r.start + (a * sector) as u64;
                let mut tmp = crate::io::device::IoBuf::zeroed((b - a) * sector);
                if let Err(e) = self.io.read_logical_mode(at, &mut tmp, m, self.uncached) {
                    log::error!("data at logical {at} copy {m}: {e}");
                    io_err = Some(e);
                    (a..b).for_each(|i| tried[i].push(m));
                    continue;
                }
                for i in a..b {
                    tried[i].push(m);
                    let t = (i - a) * sector;
                    if sector_ok_in(&tmp[t..t + sector], r.csums.get(i), self.csum_type) {
                        buf[i * sector..(i + 1) * sector].copy_from_slice(&tmp[t..t + sector]);
                        want.retain(|&w| w != i);
                    } else {
                        self.note_bad(r, i, m);
                        bad_copies.push((i, m));
                    }
                }
            }
        }
        if want.is_empty() {
            self.repair(r, buf, &bad_copies);
            return Ok(());
        }
        let first_bad = want[0];
        if bad_copies.iter().all(|&(i, _)| i != first_bad) {
            if let Some(e) = io_err {
                return Err(e);
            }
        }
        let bad = r.start + (first_bad * sector) as u64;
        // Every sector still wanted was read and failed on every copy: the user asked for
        // the bytes anyway (the first copy's, which `buf` holds).
        if self.io.rescue().ignore_data_csums
            && want
                .iter()
                .all(|&i| from[i].is_some() && tried[i].len() >= order.len())
        {
            self.io.skips().note("ignoredatacsums", bad, || {
                format!(
                    "data at logical {bad} (inode {}, subvolume {}): {} sectors fail their checksums on every copy; returned unverified",
                    r.id.ino,
                    r.id.subvol,
                    want.len()
                )
            });
            return Ok(());
        }
        let err = Error::DataChecksum {
            subvol: r.id.subvol,
            ino: r.id.ino,
            offset: r.file_pos - r.file_pos % self.sector + (bad.max(r.logical) - r.logical),
            logical: bad,
        };
        log::error!("{err}");
        Err(err)
    }
}

/// Records the verdict of `ok` on each whole sector of `bytes`, which sit at `at` of the
/// read (a sector cut at either end is judged after the read, from the whole buffer).
fn judge(
    verdict: &mut [Option<bool>],
    at: usize,
    bytes: &[u8],
    sector: usize,
    ok: &dyn Fn(&[u8], usize) -> bool,
) {
    let (first, end) = (at.div_ceil(sector), (at + bytes.len()) / sector);
    for (i, v) in verdict.iter_mut().enumerate().take(end).skip(first) {
        let o = i * sector - at;
        *v = Some(ok(&bytes[o..o + sector], i));
    }
}

/// Whether a sector matches its checksum (None: it has none, nothing to check).
fn sector_ok_in(s: &[u8], c: Option<&Option<Vec<u8>>>, t: oleo_format::csum::CsumType) -> bool {
    c.and_then(|c| c.as_ref()).is_none_or(|c| t.verify(s, c))
}

/// Sorted sector indexes as half-open runs of consecutive ones.
fn runs(sorted: &[usize]) -> Vec<(usize, usize)> {
    let mut out: Vec<(usize, usize)> = Vec::new();
    for &i in sorted {
        match out.last_mut() {
            Some((_, e)) if *e == i => *e += 1,
            _ => out.push((i, i + 1)),
        }
    }
    out
}

impl ReadPlan {
    /// Logs a sector of `r` that failed its checksum in copy `m` and counts it against
    /// the device.
    fn note_bad(&self, r: &DataRead, i: usize, m: usize) {
        let at = r.start + i as u64 * self.sector;
        log::error!(
            "data checksum mismatch at logical {at} (inode {}, subvolume {}) in copy {m}",
            r.id.ino,
            r.id.subvol
        );
        self.io
            .note_bad_copy(at, self.sector, m, crate::io::devices::DevStat::Corruption);
    }

    /// Rewrites the copies of `r` that failed their checksums with `good` (verified), as
    /// the kernel's read repair does; the plan's read pin keeps the extent from being
    /// handed out meanwhile. Nothing on a read-only open.
    fn repair(&self, r: &DataRead, good: &[u8], bad: &[(usize, usize)]) {
        if bad.is_empty() || !self.io.devices().is_writable() {
            return;
        }
        let sector = self.sector as usize;
        let mut copies: Vec<usize> = bad.iter().map(|&(_, m)| m).collect();
        copies.sort_unstable();
        copies.dedup();
        for m in copies {
            let mut sectors: Vec<usize> = bad.iter().filter(|b| b.1 == m).map(|b| b.0).collect();
            sectors.sort_unstable();
            sectors.dedup();
            for (a, b) in runs(&sectors) {
                let at = r.start + (a * sector) as u64;
                match self.io.repair_copy(at, &good[a * sector..b * sector], m) {
                    Ok(()) => log::warn!(
                        "repaired data at logical {at} ({} bytes) copy {m} from a good copy",
                        (b - a) * sector
                    ),
                    Err(e) => log::error!("could not repair data at logical {at} copy {m}: {e}"),
                }
            }
        }
    }
}

/// `len` bytes of `src` from `from`, zero-filled where `src` ends (a decoded extent
/// shorter than its item claims reads as zeros, as in the kernel).
fn copy_or_zero(src: &[u8], from: usize, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    let avail = src.len().saturating_sub(from).min(len);
    let from = from.min(src.len());
    out[..avail].copy_from_slice(&src[from..from + avail]);
    out
}

#[cfg(test)]
mod tests {
    use crate::{Filesystem, InodeId, NewInode, OpenOptions};

    fn pattern(seed: u8, len: usize) -> Vec<u8> {
        (0..len).map(|i| (i as u8).wrapping_mul(7) ^ seed).collect()
    }

    /// Plans a read of `a`, then frees its extent (an overwrite, committed twice so the
    /// freeing commit is durable) and writes new files until the freed space would be
    /// handed out again. Returns whether a new file landed on the old extent and what the
    /// plan read.
    fn read_across_reuse(name: &str, pinned: bool) -> (bool, crate::Result<Vec<u8>>) {
        const LEN: usize = 1 << 20;
        let dir = std::env::temp_dir().join(format!("oleo-read-pin-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let img = dir.join("pin.img");
        let opts = crate::mkfs::MkfsOptions {
            size: Some(512 << 20),
            ..Default::default()
        };
        crate::mkfs::mkfs(&img, &opts).unwrap();
        let rw = OpenOptions {
            read_only: false,
            ..Default::default()
        };
        let fs = Filesystem::open_rw(&img, rw).unwrap();
        let root = fs.root();
        let a = fs.mknod(root, b"a", &NewInode::file(0o644)).unwrap().id;
        fs.write(a, 0, &pattern(1, LEN)).unwrap();
        fs.sync().unwrap();
        let old: Vec<(u64, u64)> = extents(&fs, a);
        let plan = {
            let core = fs.core_read();
            let pin = pinned.then(|| core.pipe.pin_read(core.running_transid()));
            core.plan_read(a, 0, LEN as u32, pin).unwrap()
        };
        fs.write(a, 0, &pattern(2, LEN)).unwrap();
        fs.sync().unwrap();
        fs.sync().unwrap();
        let mut reused = false;
        for i in 0..8u8 {
            let name = [b'n', b'0' + i];
            let n = fs.mknod(root, &name, &NewInode::file(0o644)).unwrap().id;
            fs.write(n, 0, &pattern(3 + i, LEN)).unwrap();
            fs.sync().unwrap();
            reused |= extents(&fs, n)
                .iter()
                .any(|&(s, l)| old.iter().any(|&(os, ol)| s < os + ol && os < s + l));
        }
        let got = plan.execute();
        drop(fs);
        std::fs::remove_dir_all(&dir).unwrap();
        (reused, got)
    }

    fn extents(fs: &Filesystem, id: InodeId) -> Vec<(u64, u64)> {
        fs.file_extents(id)
            .unwrap()
            .iter()
            .map(|e| (e.logical.unwrap(), e.len))
            .collect()
    }

    /// Space a planned read still reads is not handed out again before the read ends;
    /// without the pin it is, and the read returns another file's data.
    #[test]
    fn a_planned_read_keeps_its_blocks() {
        let (reused, got) = read_across_reuse("pinned", true);
        assert!(!reused, "freed space a read still needs was reused");
        assert!(
            got.is_ok_and(|got| got == pattern(1, 1 << 20)),
            "the planned read saw other data"
        );
        // Without the pin another file's data is there: the checksums catch it.
        let (reused, got) = read_across_reuse("unpinned", false);
        assert!(reused, "control: without a pin the freed extent is reused");
        assert!(
            matches!(got, Err(crate::Error::DataChecksum { .. })),
            "control: without a pin the read is stale: {:?}",
            got.map(|g| g.len())
        );
    }
}
