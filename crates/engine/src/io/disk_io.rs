//! Reading tree blocks and data through the chunk map, with verification and mirror
//! fallback, and the bounded tree-block cache. Shared by every thread and by a commit
//! writing in the background: the blocks of a commit not yet written are served from
//! memory (`inflight`) until they are.

use crate::error::{Error, Result, TreeMiss};
use crate::io::device::Device;
use crate::io::devices::{DevRead, DevStat, DeviceSet};
use crate::io::rescue::{Rescue, SkipLog};
use crate::io::volumes::{ChunkMap, RowPiece};
use oleo_format::items::block_group as bg;
use oleo_format::key::Key;
use oleo_format::validate::{
    check_tree_block, check_tree_block_but_csum, check_tree_block_identity, Expect, FsContext,
};
use parking_lot::{RwLock, RwLockReadGuard};
use quick_cache::sync::Cache;
use quick_cache::Weighter;
use std::collections::HashMap;
use std::sync::Arc;

/// A verified tree block, shared between readers.
pub type Block = Arc<[u8]>;

std::thread_local! {
    static CACHED_ONLY: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// While alive, a tree-block read on this thread that misses the cache fails with
/// `Error::NotCached` instead of going to the device: its caller holds the filesystem's
/// lock and reads the block after letting go of it (`Filesystem::lookup_op`).
pub(crate) struct CachedOnly(bool);

impl CachedOnly {
    pub(crate) fn new() -> CachedOnly {
        CachedOnly(CACHED_ONLY.replace(true))
    }
}

impl Drop for CachedOnly {
    fn drop(&mut self) {
        CACHED_ONLY.set(self.0);
    }
}

impl TreeMiss {
    /// Reads the block into the cache (verified as a read under the lock would be).
    pub(crate) fn fetch(&self, io: &DiskIo) -> Result<()> {
        let _device = CachedOnly::allow();
        match io.read_tree_block(self.bytenr, self.level, self.generation, self.first_key) {
            Ok(_) => Ok(()),
            // Now known bad: the next try goes around it without reading.
            Err(e) if io.skip_unreadable(self.bytenr, &e) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

impl CachedOnly {
    /// Lets this thread read from the device again for a moment.
    fn allow() -> CachedOnly {
        CachedOnly(CACHED_ONLY.replace(false))
    }
}

#[derive(Clone)]
struct BlockWeight;

impl Weighter<u64, Block> for BlockWeight {
    fn weight(&self, _key: &u64, val: &Block) -> u64 {
        val.len() as u64
    }
}

pub struct DiskIo {
    devices: DeviceSet,
    chunks: RwLock<ChunkMap>,
    ctx: RwLock<FsContext>,
    cache: Cache<u64, Block, BlockWeight>,
    /// Blocks of a commit that is writing them out: what a read must see until then.
    inflight: RwLock<HashMap<u64, Block>>,
    /// Tree blocks read good from one copy after another failed: (bytenr, bad copy, good
    /// bytes), rewritten under the filesystem's exclusive lock (`FsCore::repair_tree_blocks`)
    /// where nothing can free the block meanwhile.
    repairs: parking_lot::Mutex<Vec<(u64, usize, Block)>>,
    /// The rescue options of a read-only open, and what they let it go around.
    rescue: Rescue,
    skips: SkipLog,
    /// Blocks gone around (`ignorebadroots`): failed at once, not read again.
    gone_around: RwLock<std::collections::HashSet<u64>>,
}

impl DiskIo {
    pub(crate) fn new(
        devices: DeviceSet,
        chunks: ChunkMap,
        ctx: FsContext,
        cache_bytes: u64,
    ) -> DiskIo {
        let items = (cache_bytes / ctx.nodesize as u64).max(16) as usize;
        DiskIo {
            devices,
            chunks: RwLock::new(chunks),
            ctx: RwLock::new(ctx),
            cache: Cache::with_weighter(items, cache_bytes.max(16 * 65536), BlockWeight),
            inflight: RwLock::new(HashMap::new()),
            repairs: parking_lot::Mutex::new(Vec::new()),
            rescue: Rescue::default(),
            skips: SkipLog::default(),
            gone_around: RwLock::default(),
        }
    }

    /// Sets the rescue options (before the open shares the handle).
    pub(crate) fn set_rescue(&mut self, rescue: Rescue) {
        self.rescue = rescue;
    }

    /// The rescue options of this open.
    pub fn rescue(&self) -> &Rescue {
        &self.rescue
    }

    /// What a rescue open went around.
    pub fn skips(&self) -> &SkipLog {
        &self.skips
    }

    /// Under `rescue=ignorebadroots`: whether to go around the unreadable tree block
    /// `bytenr` (logged once) instead of failing with `e`. Never for a block that was
    /// only not cached.
    pub(crate) fn skip_unreadable(&self, bytenr: u64, e: &Error) -> bool {
        if !self.rescue.ignore_bad_roots || !matches!(e, Error::Corrupt { .. } | Error::Io(_)) {
            return false;
        }
        self.gone_around.write().insert(bytenr);
        self.skips.note("ignorebadroots", bytenr, || {
            format!("tree block {bytenr} unreadable ({e}); what it holds is left out")
        });
        true
    }

    pub fn chunks(&self) -> RwLockReadGuard<'_, ChunkMap> {
        self.chunks.read()
    }

    pub fn nodesize(&self) -> u32 {
        self.ctx.read().nodesize
    }

    /// Blocks newer than this generation are refused (a commit moves it forward).
    pub(crate) fn set_super_generation(&self, generation: u64) {
        self.ctx.write().super_generation = generation;
    }

    /// Serves `blocks` from memory until `written` is called for them.
    pub(crate) fn add_inflight(&self, blocks: &[(u64, Block)]) {
        let mut map = self.inflight.write();
        for (bytenr, b) in blocks {
            map.insert(*bytenr, b.clone());
        }
    }

    /// Writes a finished tree block (checksummed) to every copy and keeps it cached.
    pub(crate) fn write_tree_block(&self, bytenr: u64, block: &Block) -> Result<()> {
        self.write_logical(bytenr, block)?;
        self.cache.insert(bytenr, block.clone());
        Ok(())
    }

    /// Discards every copy of the logical range `[logical, logical + len)`, which must lie
    /// in one chunk and be free (the kernel's btrfs_discard_extent). Returns the bytes
    /// discarded, summed over the copies as the kernel counts them. RAID5/6 ranges are
    /// left alone: their parity covers more than the range.
    pub(crate) fn discard_logical(&self, logical: u64, len: u64) -> Result<u64> {
        let pieces = {
            let chunks = self.chunks.read();
            if chunks
                .profile(logical)
                .is_none_or(|p| p & (bg::RAID5 | bg::RAID6) != 0)
            {
                return Ok(0);
            }
            let mut all = Vec::new();
            for mirror in 0..chunks.num_mirrors(logical) {
                all.extend(chunks.map(logical, len, mirror)?);
            }
            all
        };
        let mut done = 0;
        for p in pieces {
            done += self.devices.discard(p.devid, p.physical, p.len)?;
        }
        Ok(done)
    }

    /// Drops the host page cache's pages of copy `mirror` of `[logical, logical + len)`
    /// (see `Device::drop_cached`).
    pub(crate) fn drop_cached(&self, logical: u64, len: u64, mirror: usize) {
        let pieces = match self.chunks.read().map(logical, len, mirror) {
            Ok(p) => p,
            Err(_) => return,
        };
        for p in pieces {
            self.devices.drop_cached(p.devid, p.physical, p.len);
        }
    }

    /// The blocks are on disk now: reads go the usual way.
    pub(crate) fn written(&self, bytenrs: impl Iterator<Item = u64>) {
        let mut map = self.inflight.write();
        for b in bytenrs {
            map.remove(&b);
        }
    }

    /// The device the superblock came from (counters and crash recording follow it).
    pub(crate) fn device(&self) -> &Device {
        self.devices.primary()
    }

    pub(crate) fn devices(&self) -> &DeviceSet {
        &self.devices
    }

    /// The set, to match against the chunk tree while nothing else uses it.
    pub(crate) fn devices_mut(&mut self) -> &mut DeviceSet {
        &mut self.devices
    }

    /// Whether copy `mirror` of `logical` can be read at all (its devices are present); a
    /// RAID5/6 rebuild needs all but the lost strips.
    pub fn mirror_present(&self, logical: u64, len: u64, mirror: usize) -> bool {
        let chunks = self.chunks.read();
        if chunks
            .profile(logical)
            .is_some_and(|p| p & (bg::RAID5 | bg::RAID6) != 0)
        {
            return true;
        }
        chunks
            .map(logical, len, mirror)
            .is_ok_and(|v| v.iter().all(|p| !self.devices.is_missing(p.devid)))
    }

    /// The order to try the copies of `logical` in: present ones first, starting from one
    /// picked by address so that large reads spread over the mirrors.
    pub fn mirror_order(&self, logical: u64, len: u64) -> Vec<usize> {
        let n = self.num_mirrors(logical).max(1);
        let spread = self
            .chunks
            .read()
            .profile(logical)
            .is_some_and(|p| p & (bg::RAID1 | bg::RAID1C3 | bg::RAID1C4 | bg::RAID10) != 0);
        let first = if spread {
            ((logical >> 20) as usize) % n
        } else {
            0
        };
        let (mut ok, mut gone): (Vec<usize>, Vec<usize>) = (0..n)
            .map(|i| (first + i) % n)
            .partition(|&m| self.mirror_present(logical, len, m));
        ok.append(&mut gone);
        ok
    }

    pub fn set_chunks(&self, chunks: ChunkMap) {
        *self.chunks.write() = chunks;
    }

    /// Adds a chunk created by a transaction.
    pub(crate) fn add_chunk(
        &self,
        logical: u64,
        chunk: oleo_format::items::ChunkItem,
    ) -> Result<()> {
        self.chunks.write().insert(logical, chunk)
    }

    /// Reads copy `mirror` of `[logical, logical + buf.len())`.
    pub fn read_logical(&self, logical: u64, buf: &mut [u8], mirror: usize) -> Result<()> {
        self.read_logical_mode(logical, buf, mirror, false)
    }

    /// `read_logical`, around the device's page cache with `uncached` (see `Device`). For
    /// RAID5/6, copy 0 is the strip itself (rebuilt when its device is missing) and the
    /// others are rebuilds from parity (see `ChunkMap::num_mirrors`).
    pub fn read_logical_mode(
        &self,
        logical: u64,
        buf: &mut [u8],
        mirror: usize,
        uncached: bool,
    ) -> Result<()> {
        self.read_logical_checked(logical, buf, mirror, uncached, &mut |_, _| {})
    }

    /// `read_logical_mode`, with `check(offset in buf, bytes)` run on each piece as soon as
    /// it is in, while the rest is still being read (checksums overlap the IO, as in the
    /// kernel's end_io). Every byte of `buf` passes through `check` once on success.
    pub fn read_logical_checked(
        &self,
        logical: u64,
        buf: &mut [u8],
        mirror: usize,
        uncached: bool,
        check: &mut dyn FnMut(usize, &[u8]),
    ) -> Result<()> {
        let raid56 = self
            .chunks
            .read()
            .profile(logical)
            .is_some_and(|p| p & (bg::RAID5 | bg::RAID6) != 0);
        if raid56 {
            self.read_raid56(logical, buf, mirror, uncached)?;
            check(0, buf);
            return Ok(());
        }
        let mut reads = Vec::new();
        self.plan_reads(logical, buf, 0, mirror, &mut reads)?;
        self.devices.read_batch(&mut reads, uncached, &mut |parts| {
            parts.iter().for_each(|(at, p)| check(*at, p))
        })
    }

    /// Adds the device reads that fill `buf` (at `base` in the caller's whole buffer) with
    /// copy `mirror` of `logical..` to `out`: a device's strips that lie back to back
    /// (RAID0/10) in one read, so a read spanning strips reads each device at once (the
    /// kernel's bios go out together too), straight into `buf`, in reads of at most
    /// `PIECE` so that the first are checked while the rest come. A stripe on a missing
    /// device comes from another copy of the same stripe (RAID10 with a device of each
    /// pair gone still reads every stripe).
    fn plan_reads<'a>(
        &self,
        logical: u64,
        buf: &'a mut [u8],
        base: usize,
        mirror: usize,
        out: &mut Vec<DevRead<'a>>,
    ) -> Result<()> {
        const PIECE: u64 = 128 << 10;
        let mut pieces = self.chunks.read().map(logical, buf.len() as u64, mirror)?;
        if pieces.iter().any(|p| self.devices.is_missing(p.devid)) {
            self.substitute_missing(logical, &mut pieces, mirror)?;
        }
        let first = out.len();
        let mut rest = buf;
        let mut at = base;
        for p in pieces {
            if p.len > rest.len() as u64 {
                return Err(Error::corrupt(
                    logical,
                    "chunk map covers more than the read",
                ));
            }
            let mut done = 0u64;
            while done < p.len {
                let physical = p.physical + done;
                let run = out[first..].iter_mut().find(|r| {
                    r.devid == p.devid && r.physical + r.len() == physical && r.len() < PIECE
                });
                let room = run.as_ref().map_or(PIECE, |r| PIECE - r.len());
                let take = room.min(p.len - done);
                let (dst, tail) = std::mem::take(&mut rest).split_at_mut(take as usize);
                rest = tail;
                match run {
                    Some(r) => r.parts.push((at, dst)),
                    None => out.push(DevRead {
                        devid: p.devid,
                        physical,
                        parts: vec![(at, dst)],
                    }),
                }
                at += take as usize;
                done += take;
            }
        }
        if !rest.is_empty() {
            return Err(Error::corrupt(
                logical,
                "chunk map covers less than the read",
            ));
        }
        Ok(())
    }

    /// Reads a large range of a mirrored chunk (RAID1, RAID1C3/4, RAID10) from several
    /// copies at once, a part from each present copy, so that one reader gets the devices'
    /// summed speed; `check` as for `read_logical_checked`. Returns which copy each part
    /// came from: (offset in `buf`, length, copy). None: not worth it or not possible
    /// (small, one copy present); the caller reads as usual. Any part that fails to read
    /// fails the whole.
    pub fn read_spread(
        &self,
        logical: u64,
        buf: &mut [u8],
        uncached: bool,
        check: &mut dyn FnMut(usize, &[u8]),
    ) -> Result<Option<Vec<(usize, usize, usize)>>> {
        const MIN: usize = 256 << 10;
        let sector = self.ctx.read().sectorsize as usize;
        if buf.len() < MIN {
            return Ok(None);
        }
        let spread = self
            .chunks
            .read()
            .profile(logical)
            .is_some_and(|p| p & (bg::RAID1 | bg::RAID1C3 | bg::RAID1C4 | bg::RAID10) != 0);
        if !spread {
            return Ok(None);
        }
        let n = self.num_mirrors(logical);
        let present: Vec<usize> = (0..n)
            .filter(|&m| self.mirror_present(logical, buf.len() as u64, m))
            .collect();
        if present.len() < 2 {
            return Ok(None);
        }
        // Parts of whole sectors (aligned for uncached reads), one per copy.
        let part = buf
            .len()
            .div_ceil(present.len())
            .next_multiple_of(sector.max(4096));
        let len = buf.len();
        let parts: Vec<(usize, usize, usize)> = (0..len)
            .step_by(part)
            .zip(present.iter().copied())
            .map(|(at, m)| (at, part.min(len - at), m))
            .collect();
        let mut reads = Vec::new();
        for (dst, &(at, _, m)) in buf.chunks_mut(part).zip(parts.iter()) {
            self.plan_reads(logical + at as u64, dst, at, m, &mut reads)?;
        }
        self.devices
            .read_batch(&mut reads, uncached, &mut |parts| {
                parts.iter().for_each(|(at, p)| check(*at, p))
            })?;
        Ok(Some(parts))
    }

    /// Replaces each piece of copy `mirror` that lies on a missing device with the same
    /// bytes' piece in another copy on a present one, where there is one.
    fn substitute_missing(
        &self,
        logical: u64,
        pieces: &mut [crate::io::volumes::PhysRange],
        mirror: usize,
    ) -> Result<()> {
        let chunks = self.chunks.read();
        let n = chunks.num_mirrors(logical).max(1);
        let mut at = logical;
        for p in pieces.iter_mut() {
            if self.devices.is_missing(p.devid) {
                for m in (0..n).filter(|&m| m != mirror) {
                    if let [alt] = chunks.map(at, p.len, m)?.as_slice() {
                        if !self.devices.is_missing(alt.devid) {
                            *p = *alt;
                            break;
                        }
                    }
                }
            }
            at += p.len;
        }
        Ok(())
    }

    fn read_raid56(
        &self,
        logical: u64,
        buf: &mut [u8],
        mirror: usize,
        uncached: bool,
    ) -> Result<()> {
        let rows = self.chunks.read().map_rows(logical, buf.len() as u64)?;
        let mut done = 0usize;
        for row in rows {
            let len = row.len as usize;
            let dst = &mut buf[done..done + len];
            let (devid, physical) = row.stripes[row.target];
            if mirror == 0 && !self.devices.is_missing(devid) {
                self.devices.read(devid, dst, physical, uncached)?;
            } else {
                self.rebuild_piece(logical, &row, mirror, dst)?;
            }
            done += len;
        }
        Ok(())
    }

    /// Rebuilds one strip piece from the rest of its row. Lost: the target, the strips on
    /// missing devices, and for RAID6 copy k >= 2 one more strip assumed bad (the (k-2)th
    /// of the others, data then P), so that a checksum failure elsewhere in the row can be
    /// got around too.
    fn rebuild_piece(
        &self,
        logical: u64,
        row: &RowPiece,
        mirror: usize,
        dst: &mut [u8],
    ) -> Result<()> {
        let n = row.stripes.len();
        let mut lost: Vec<usize> = vec![row.target];
        for (i, &(devid, _)) in row.stripes.iter().enumerate() {
            if self.devices.is_missing(devid) && !lost.contains(&i) {
                lost.push(i);
            }
        }
        if mirror >= 2 {
            let others: Vec<usize> = (0..n - 1).filter(|&i| i != row.target).collect();
            match others.get(mirror - 2) {
                Some(&o) if !lost.contains(&o) => lost.push(o),
                Some(_) => {}
                None => {
                    return Err(Error::corrupt(
                        logical,
                        format!("no rebuild number {mirror}"),
                    ))
                }
            }
        }
        if lost.len() > row.nparity {
            return Err(Error::Io(std::io::Error::other(format!(
                "logical {logical}: {} strips of its RAID5/6 row are lost, parity covers {}",
                lost.len(),
                row.nparity
            ))));
        }
        let len = row.len as usize;
        let mut strips: Vec<Vec<u8>> = vec![vec![0u8; len]; n];
        for (i, &(devid, physical)) in row.stripes.iter().enumerate() {
            if !lost.contains(&i) {
                self.devices.read(devid, &mut strips[i], physical, false)?;
            }
        }
        let mut refs: Vec<&mut [u8]> = strips.iter_mut().map(|v| v.as_mut_slice()).collect();
        oleo_format::raid56::rebuild(&mut refs, row.nparity, &lost)
            .map_err(|e| Error::corrupt(logical, format!("RAID5/6 rebuild: {e}")))?;
        dst.copy_from_slice(&strips[row.target]);
        Ok(())
    }

    /// Writes `buf` at `logical` to every copy (all DUP/RAID1 mirrors). The cached block at
    /// `logical`, if any, is dropped: the address may hold a new block now.
    pub fn write_logical(&self, logical: u64, buf: &[u8]) -> Result<()> {
        self.write_logical_mode(logical, buf, false)
    }

    /// `write_logical`, around the device's page cache with `uncached` (see `Device`).
    /// Copies on a missing device (a degraded mount) are skipped; the others must succeed.
    pub fn write_logical_mode(&self, logical: u64, buf: &[u8], uncached: bool) -> Result<()> {
        let profile = self
            .chunks
            .read()
            .profile(logical)
            .ok_or_else(|| Error::corrupt(logical, "logical address is not in any chunk"))?;
        if profile & (bg::RAID5 | bg::RAID6) != 0 {
            return Err(Error::Unsupported(
                "writing to RAID5/6 chunks is not supported".into(),
            ));
        }
        self.cache.remove(&logical);
        let mut written = 0;
        for mirror in 0..self.num_mirrors(logical).max(1) {
            let mut done = 0usize;
            let pieces = self.chunks.read().map(logical, buf.len() as u64, mirror)?;
            for piece in pieces {
                let len = piece.len as usize;
                if !self.devices.is_missing(piece.devid) {
                    self.devices.write(
                        piece.devid,
                        &buf[done..done + len],
                        piece.physical,
                        uncached,
                    )?;
                    written += 1;
                }
                done += len;
            }
        }
        if written == 0 {
            return Err(Error::Io(std::io::Error::other(format!(
                "logical {logical}: every copy is on a missing device"
            ))));
        }
        Ok(())
    }

    /// Writes `buf` over copy `mirror` of `logical` only: the repair of a copy that read
    /// bad, from a good one (the kernel's btrfs_repair_io_failure).
    pub(crate) fn repair_copy(&self, logical: u64, buf: &[u8], mirror: usize) -> Result<()> {
        let profile = self.chunks.read().profile(logical);
        if profile.is_none_or(|p| p & (bg::RAID5 | bg::RAID6) != 0) {
            return Err(Error::Unsupported("repairing RAID5/6 strips".into()));
        }
        let pieces = self.chunks.read().map(logical, buf.len() as u64, mirror)?;
        let mut done = 0usize;
        for piece in pieces {
            let len = piece.len as usize;
            self.devices
                .write(piece.devid, &buf[done..done + len], piece.physical, false)?;
            done += len;
        }
        Ok(())
    }

    /// A cache flush of every device.
    pub fn flush(&self) -> Result<()> {
        self.devices.flush()
    }

    /// See `Device::check_claim`.
    pub fn check_claim(&self) -> Result<()> {
        self.devices.check_claim()
    }

    pub fn num_mirrors(&self, logical: u64) -> usize {
        self.chunks.read().num_mirrors(logical)
    }

    /// What every tree block is checked against (rescue's tolerant reads check less).
    pub(crate) fn context(&self) -> FsContext {
        self.ctx.read().clone()
    }

    /// The tree block repairs waiting (see `repairs`).
    pub(crate) fn take_repairs(&self) -> Vec<(u64, usize, Block)> {
        std::mem::take(&mut *self.repairs.lock())
    }

    /// Counts a bad copy (checksum or header) against the device(s) it was read from.
    pub(crate) fn note_bad_copy(&self, logical: u64, len: u64, mirror: usize, stat: DevStat) {
        let chunks = self.chunks.read();
        let devids: Vec<u64> = if chunks
            .profile(logical)
            .is_some_and(|p| p & (bg::RAID5 | bg::RAID6) != 0)
        {
            if mirror > 0 {
                return;
            }
            chunks
                .map_rows(logical, len)
                .map(|rows| rows.iter().map(|r| r.stripes[r.target].0).collect())
                .unwrap_or_default()
        } else {
            chunks
                .map(logical, len, mirror)
                .map(|v| v.iter().map(|p| p.devid).collect())
                .unwrap_or_default()
        };
        drop(chunks);
        let mut seen = Vec::new();
        for d in devids {
            if !seen.contains(&d) && !self.devices.is_missing(d) {
                seen.push(d);
                self.devices.bump(d, stat);
            }
        }
    }

    /// Checks one raw copy of tree block `bytenr` (a scrub's read): why it is bad, if it is
    /// (checksum, bytenr, fsid, generation).
    pub(crate) fn check_tree_copy(&self, buf: &[u8], bytenr: u64, generation: u64) -> Result<()> {
        let expect = Expect {
            bytenr,
            level: None,
            generation: (generation > 0).then_some(generation),
            first_key: None,
        };
        check_tree_block(buf, &self.ctx.read(), &expect)
            .map_err(|e| Error::corrupt(bytenr, e.to_string()))
    }

    /// A verified tree block. Tries every copy; a bad copy is logged with its address and
    /// the next one used, as the kernel does with DUP metadata.
    pub fn read_tree_block(
        &self,
        bytenr: u64,
        level: Option<u8>,
        generation: Option<u64>,
        first_key: Option<Key>,
    ) -> Result<Block> {
        let expect = Expect {
            bytenr,
            level,
            generation,
            first_key,
        };
        if let Some(block) = self.inflight.read().get(&bytenr) {
            check_expectations(block, &expect)?;
            return Ok(block.clone());
        }
        if let Some(block) = self.cache.get(&bytenr) {
            // Cached blocks passed the full check; only the parent's expectations remain.
            // A block read anyway (`read_anyway`) is taken whatever its generation says,
            // here as when it was read.
            match check_expectations(&block, &expect) {
                Err(_) if self.rescue.ignore_meta_csums => {
                    let ctx = self.ctx.read().clone();
                    check_tree_block_identity(&block, &ctx, &expect)
                        .map_err(|e| Error::corrupt(bytenr, e.to_string()))?;
                }
                r => r?,
            }
            return Ok(block);
        }
        if self.rescue.ignore_bad_roots && self.gone_around.read().contains(&bytenr) {
            return Err(Error::corrupt(
                bytenr,
                "unreadable on every copy (gone around)",
            ));
        }
        if CACHED_ONLY.get() {
            return Err(Error::NotCached(Box::new(TreeMiss {
                bytenr,
                level,
                generation,
                first_key,
            })));
        }
        let nodesize = self.nodesize() as usize;
        let mut last_err = String::new();
        let mut bad: Vec<usize> = Vec::new();
        // Copies whose only fault is the checksum (for rescue=ignoremetacsums).
        let mut csum_only: Vec<(usize, Vec<u8>)> = Vec::new();
        for mirror in self.mirror_order(bytenr, nodesize as u64) {
            let mut buf = vec![0u8; nodesize];
            let verdict = self.read_logical(bytenr, &mut buf, mirror).and_then(|_| {
                check_tree_block(&buf, &self.ctx.read(), &expect).map_err(|e| {
                    if self.rescue.ignore_meta_csums
                        && e == oleo_format::FormatError::ChecksumMismatch
                        && check_tree_block_but_csum(&buf, &self.ctx.read(), &expect).is_ok()
                    {
                        csum_only.push((mirror, buf.clone()));
                    }
                    let stat = if e.to_string().contains("parent transid") {
                        DevStat::Generation
                    } else {
                        DevStat::Corruption
                    };
                    self.note_bad_copy(bytenr, nodesize as u64, mirror, stat);
                    Error::corrupt(bytenr, e.to_string())
                })
            });
            match verdict {
                Ok(()) => {
                    let block: Block = buf.into();
                    if !bad.is_empty() {
                        log::warn!("tree block {bytenr}: copy {bad:?} was bad ({last_err}); read copy {mirror} instead");
                        if self.devices.is_writable() {
                            let mut r = self.repairs.lock();
                            for &m in &bad {
                                if r.len() < 1024 && self.mirror_present(bytenr, nodesize as u64, m)
                                {
                                    r.push((bytenr, m, block.clone()));
                                }
                            }
                        }
                    }
                    self.cache.insert(bytenr, block.clone());
                    return Ok(block);
                }
                Err(e) => {
                    log::error!("tree block {bytenr} copy {mirror}: {e}");
                    bad.push(mirror);
                    // Only the reason: the error returned below names the block again.
                    last_err = match e {
                        Error::Corrupt { reason, .. } => reason,
                        other => other.to_string(),
                    };
                }
            }
        }
        if let Some((mirror, buf)) = csum_only.into_iter().next() {
            self.skips.note("ignoremetacsums", bytenr, || {
                format!("tree block {bytenr}: checksum wrong on every copy; used copy {mirror}, which passes every other check")
            });
            let block: Block = buf.into();
            self.cache.insert(bytenr, block.clone());
            return Ok(block);
        }
        if self.rescue.ignore_meta_csums {
            if let Some(block) = self.read_anyway(bytenr, &expect, &last_err) {
                return Ok(block);
            }
        }
        Err(Error::corrupt(bytenr, last_err))
    }
}

impl DiskIo {
    /// Under `ignoremetacsums`, for a block that failed on every copy for more than its
    /// checksum (a parent transid, the item checks): the first copy that still claims its
    /// address, fsid and level, one with a good checksum first. Its items are then read
    /// one by one, each bounds-checked, as `btrfs restore` reads them.
    fn read_anyway(&self, bytenr: u64, expect: &Expect, why: &str) -> Option<Block> {
        let nodesize = self.nodesize() as usize;
        let ctx = self.ctx.read().clone();
        let mut copies = Vec::new();
        for mirror in self.mirror_order(bytenr, nodesize as u64) {
            let mut buf = vec![0u8; nodesize];
            if self.read_logical(bytenr, &mut buf, mirror).is_ok()
                && check_tree_block_identity(&buf, &ctx, expect).is_ok()
            {
                let csum_ok = ctx.csum_type.verify(&buf[32..], &buf[..32]);
                copies.push((!csum_ok, mirror, buf));
            }
        }
        copies.sort_by_key(|c| (c.0, c.1));
        let (_, mirror, buf) = copies.into_iter().next()?;
        self.skips.note("ignoremetacsums", bytenr, || {
            format!("tree block {bytenr} fails its checks on every copy ({why}); read copy {mirror} anyway, item by item")
        });
        let block: Block = buf.into();
        self.cache.insert(bytenr, block.clone());
        Some(block)
    }
}

fn check_expectations(block: &[u8], expect: &Expect) -> Result<()> {
    let tb = oleo_format::TreeBlock::new(block)
        .map_err(|e| Error::corrupt(expect.bytenr, e.to_string()))?;
    if expect.level.is_some_and(|l| l != tb.level())
        || expect.generation.is_some_and(|g| g != tb.generation())
    {
        return Err(Error::corrupt(
            expect.bytenr,
            "level or generation differs from the parent pointer",
        ));
    }
    if let Some(first) = expect.first_key {
        if tb.nritems() > 0 && tb.key_at(0).ok() != Some(first) {
            return Err(Error::corrupt(
                expect.bytenr,
                "first key differs from the parent pointer",
            ));
        }
    }
    Ok(())
}
