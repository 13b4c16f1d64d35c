//! Reading tree blocks and data through the chunk map, with verification and mirror
//! fallback, and the bounded tree-block cache. Shared by every thread and by a commit
//! writing in the background: the blocks of a commit not yet written are served from
//! memory (`inflight`) until they are.

use crate::error::{Error, Result, TreeMiss};
use crate::io::device::Device;
use crate::io::volumes::ChunkMap;
use oleo_format::key::Key;
use oleo_format::validate::{check_tree_block, Expect, FsContext};
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
        io.read_tree_block(self.bytenr, self.level, self.generation, self.first_key)
            .map(drop)
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
    device: Device,
    /// The one device we have open; chunks on others are unreadable (multi-device is refused).
    devid: u64,
    chunks: RwLock<ChunkMap>,
    ctx: RwLock<FsContext>,
    cache: Cache<u64, Block, BlockWeight>,
    /// Blocks of a commit that is writing them out: what a read must see until then.
    inflight: RwLock<HashMap<u64, Block>>,
}

impl DiskIo {
    pub fn new(
        device: Device,
        devid: u64,
        chunks: ChunkMap,
        ctx: FsContext,
        cache_bytes: u64,
    ) -> DiskIo {
        let items = (cache_bytes / ctx.nodesize as u64).max(16) as usize;
        DiskIo {
            device,
            devid,
            chunks: RwLock::new(chunks),
            ctx: RwLock::new(ctx),
            cache: Cache::with_weighter(items, cache_bytes.max(16 * 65536), BlockWeight),
            inflight: RwLock::new(HashMap::new()),
        }
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

    /// The blocks are on disk now: reads go the usual way.
    pub(crate) fn written(&self, bytenrs: impl Iterator<Item = u64>) {
        let mut map = self.inflight.write();
        for b in bytenrs {
            map.remove(&b);
        }
    }

    pub fn device(&self) -> &Device {
        &self.device
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

    /// `read_logical`, around the device's page cache with `uncached` (see `Device`).
    pub fn read_logical_mode(
        &self,
        logical: u64,
        buf: &mut [u8],
        mirror: usize,
        uncached: bool,
    ) -> Result<()> {
        let mut done = 0usize;
        let pieces = self.chunks.read().map(logical, buf.len() as u64, mirror)?;
        for piece in pieces {
            if piece.devid != self.devid {
                return Err(Error::Unsupported(format!(
                    "logical {logical} lives on device {} which is not open",
                    piece.devid
                )));
            }
            let len = piece.len as usize;
            self.device
                .read_exact_at_mode(&mut buf[done..done + len], piece.physical, uncached)?;
            done += len;
        }
        Ok(())
    }

    /// Writes `buf` at `logical` to every copy (all DUP/RAID1 mirrors). The cached block at
    /// `logical`, if any, is dropped: the address may hold a new block now.
    pub fn write_logical(&self, logical: u64, buf: &[u8]) -> Result<()> {
        self.write_logical_mode(logical, buf, false)
    }

    /// `write_logical`, around the device's page cache with `uncached` (see `Device`).
    pub fn write_logical_mode(&self, logical: u64, buf: &[u8], uncached: bool) -> Result<()> {
        let profile = self
            .chunks
            .read()
            .lookup(logical)
            .map(|(_, c)| c.chunk_type & oleo_format::items::block_group::PROFILE_MASK)
            .ok_or_else(|| Error::corrupt(logical, "logical address is not in any chunk"))?;
        use oleo_format::items::block_group as bg;
        if profile & (bg::RAID5 | bg::RAID6) != 0 {
            return Err(Error::Unsupported(
                "writing to RAID5/6 chunks is not supported".into(),
            ));
        }
        self.cache.remove(&logical);
        for mirror in 0..self.num_mirrors(logical).max(1) {
            let mut done = 0usize;
            let pieces = self.chunks.read().map(logical, buf.len() as u64, mirror)?;
            for piece in pieces {
                if piece.devid != self.devid {
                    return Err(Error::Unsupported(format!(
                        "logical {logical} lives on device {} which is not open",
                        piece.devid
                    )));
                }
                let len = piece.len as usize;
                self.device
                    .write_all_at_mode(&buf[done..done + len], piece.physical, uncached)?;
                done += len;
            }
        }
        Ok(())
    }

    /// A cache flush of the device.
    pub fn flush(&self) -> Result<()> {
        self.device.flush()
    }

    /// See `Device::check_claim`.
    pub fn check_claim(&self) -> Result<()> {
        self.device.check_claim()
    }

    pub fn num_mirrors(&self, logical: u64) -> usize {
        self.chunks.read().num_mirrors(logical)
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
            check_expectations(&block, &expect)?;
            return Ok(block);
        }
        if CACHED_ONLY.get() {
            return Err(Error::NotCached(Box::new(TreeMiss {
                bytenr,
                level,
                generation,
                first_key,
            })));
        }
        let mirrors = self.num_mirrors(bytenr).max(1);
        let mut last_err = String::new();
        for mirror in 0..mirrors {
            let mut buf = vec![0u8; self.nodesize() as usize];
            let verdict = self.read_logical(bytenr, &mut buf, mirror).and_then(|_| {
                check_tree_block(&buf, &self.ctx.read(), &expect)
                    .map_err(|e| Error::corrupt(bytenr, e.to_string()))
            });
            match verdict {
                Ok(()) => {
                    if mirror > 0 {
                        log::warn!("tree block {bytenr}: copy {} was bad ({last_err}); read copy {} instead", mirror - 1, mirror);
                    }
                    let block: Block = buf.into();
                    self.cache.insert(bytenr, block.clone());
                    return Ok(block);
                }
                Err(e) => {
                    log::error!("tree block {bytenr} copy {mirror}: {e}");
                    // Only the reason: the error returned below names the block again.
                    last_err = match e {
                        Error::Corrupt { reason, .. } => reason,
                        other => other.to_string(),
                    };
                }
            }
        }
        Err(Error::corrupt(bytenr, last_err))
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
