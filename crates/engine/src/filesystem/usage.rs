//! What `filesystem show`, `df` and `usage` report: the devices and the chunks with their
//! block groups' use, as last committed (the kernel's FS_INFO, DEV_INFO and SPACE_INFO
//! ioctls answer from the same state).

use super::Filesystem;
use crate::error::{Error, Result};
use oleo_format::items::DevItem;
use oleo_format::key::{item, objectid, Key};
use std::ops::ControlFlow;
use std::path::PathBuf;

/// One device of the filesystem, as its DEV_ITEM in the chunk tree says.
#[derive(Clone, Debug)]
pub struct DeviceInfo {
    /// Device id, from 1.
    pub devid: u64,
    /// The device's uuid (DEV_ITEM).
    pub uuid: [u8; 16],
    /// Where it was opened from; None when it is missing (a degraded open).
    pub path: Option<PathBuf>,
    /// Size the filesystem may use on it.
    pub total_bytes: u64,
    /// Bytes its dev extents cover (allocated to chunks).
    pub bytes_used: u64,
}

/// One chunk and the use of its block group.
#[derive(Clone, Debug)]
pub struct ChunkInfo {
    /// Logical start.
    pub logical: u64,
    /// Logical length.
    pub length: u64,
    /// Type and profile bits (`oleo::format::items::block_group`).
    pub flags: u64,
    /// Bytes its block group uses.
    pub used: u64,
    /// Length of each stripe on its device (a dev extent).
    pub stripe_size: u64,
    /// Each stripe's (devid, physical start).
    pub stripes: Vec<(u64, u64)>,
}

impl Filesystem {
    /// The filesystem's devices in devid order, missing ones included.
    pub fn devices(&self) -> Result<Vec<DeviceInfo>> {
        let core = self.core_read();
        let chunk_root = core.tree_root(objectid::CHUNK_TREE)?.expect("always there");
        let mut out = Vec::new();
        let min = Key::new(objectid::DEV_ITEMS, item::DEV_ITEM, 0);
        let max = Key::new(objectid::DEV_ITEMS, item::DEV_ITEM, u64::MAX);
        crate::ctree::for_each_in_range(&*core, &chunk_root, min, max, |key, data| {
            let d = DevItem::parse(data)
                .map_err(|e| Error::corrupt(0, format!("dev item {key:?}: {e}")))?;
            out.push(DeviceInfo {
                devid: d.devid,
                uuid: d.uuid,
                path: None,
                total_bytes: d.total_bytes,
                bytes_used: d.bytes_used,
            });
            Ok(ControlFlow::Continue(()))
        })?;
        for (devid, m) in core.io.devices().members() {
            if let Some(d) = out.iter_mut().find(|d| d.devid == devid) {
                d.path = Some(m.path.clone());
            }
        }
        Ok(out)
    }

    /// Every chunk with its block group's use, in logical order.
    pub fn chunk_usage(&self) -> Result<Vec<ChunkInfo>> {
        let core = self.core_read();
        let used = core.committed_block_groups()?;
        let chunks = core.io.chunks();
        Ok(chunks
            .chunks()
            .map(|(&logical, c)| {
                let profile = c.chunk_type & oleo_format::items::block_group::PROFILE_MASK;
                let n = c.stripes.len() as u64;
                use oleo_format::items::block_group as bg;
                let data_stripes = match profile {
                    bg::RAID0 => n,
                    bg::RAID10 => n / 2,
                    bg::RAID5 => n - 1,
                    bg::RAID6 => n - 2,
                    _ => 1,
                }
                .max(1);
                ChunkInfo {
                    logical,
                    length: c.length,
                    flags: c.chunk_type,
                    used: used.iter().find(|g| g.0 == logical).map_or(0, |g| g.3),
                    stripe_size: c.length / data_stripes,
                    stripes: c.stripes.iter().map(|s| (s.devid, s.offset)).collect(),
                }
            })
            .collect())
    }
}

impl Filesystem {
    /// Scrubs the filesystem (see [`crate::ScrubOptions`]): every copy of every tree block
    /// and data extent read and verified, bad copies rewritten from good ones unless
    /// read-only. `progress` sees the per-device counters after each extent.
    ///
    /// Safe beside writers (a mount scrubbing in the background): each batch of extents is
    /// scrubbed holding the filesystem shared, once every closed commit is on disk, so no
    /// commit frees them meanwhile, and only extents the last commit still has are read
    /// (space freed by the running transaction stays pinned until it commits). Writers
    /// wait at most one batch.
    pub fn scrub(
        &self,
        opts: &crate::scrub::ScrubOptions,
        progress: &mut dyn FnMut(&std::collections::BTreeMap<u64, crate::scrub::ScrubProgress>),
    ) -> Result<std::collections::BTreeMap<u64, crate::scrub::ScrubProgress>> {
        const BATCH_BYTES: u64 = 4 << 20;
        self.sync()?;
        let (mut stats, groups, repair) = {
            let core = self.core_read();
            let repair = !opts.readonly && core.io.devices().is_writable();
            (core.scrub_begin(), core.scrub_groups(), repair)
        };
        let started = std::time::Instant::now();
        let mut read_bytes = 0u64;
        let bufs = crate::scrub::ScrubBuffers::default();
        for (start, length, flags) in groups {
            let extents = {
                let core = self.durable_core()?;
                core.allocated_extents(start, length, flags)?
            };
            let mut i = 0;
            while i < extents.len() {
                {
                    // Every closed commit on disk; none closes while this lock is held.
                    let core = self.durable_core()?;
                    let mut bytes = 0;
                    while i < extents.len() && bytes < BATCH_BYTES {
                        let ext = extents[i];
                        i += 1;
                        if core.scrub_still_allocated(ext)? {
                            core.scrub_extent(ext, start, flags, repair, &mut stats, &bufs)?;
                            bytes += ext.1;
                        }
                    }
                    read_bytes += bytes;
                }
                progress(&stats);
                if let Some(rate) = opts.rate_limit.filter(|&r| r > 0) {
                    let due = std::time::Duration::from_secs_f64(read_bytes as f64 / rate as f64);
                    if let Some(wait) = due.checked_sub(started.elapsed()) {
                        std::thread::sleep(wait);
                    }
                }
            }
        }
        self.persist_device_stats()?;
        Ok(stats)
    }

    /// The core held shared once every closed commit is on disk. The wait is done without
    /// the lock (a writer queued behind it would hold readers back for a commit's IO);
    /// if a commit closed meanwhile, again.
    fn durable_core(
        &self,
    ) -> Result<parking_lot::RwLockReadGuard<'_, crate::transaction::fs::FsCore>> {
        loop {
            let (closed, pipe) = {
                let core = self.core_read();
                (
                    core.superblock().generation,
                    std::sync::Arc::clone(&core.pipe),
                )
            };
            pipe.wait_durable(closed)?;
            let core = self.core_read();
            if core.superblock().generation == closed {
                return Ok(core);
            }
        }
    }

    /// Commits the devices' error counters if they changed (a commit writes them; reads
    /// alone start no transaction).
    pub fn persist_device_stats(&self) -> Result<()> {
        let mut core = self.core_mut();
        if !core.io.devices().stats_dirty() || !core.io.devices().is_writable() {
            return Ok(());
        }
        core.write_op(
            crate::transaction::space::reservation::Reserve::items(4),
            |t| t.write_dev_stats(),
        )?;
        drop(core);
        self.sync().map(drop)
    }
}

impl Filesystem {
    /// Each device's error counters (write, read, flush, corruption, generation), as
    /// `btrfs device stats` shows them; missing devices included.
    pub fn device_stats(&self) -> Result<Vec<(DeviceInfo, [u64; 5])>> {
        let stats = self.core_read().io.devices().stats();
        Ok(self
            .devices()?
            .into_iter()
            .map(|d| {
                let v = stats.get(&d.devid).copied().unwrap_or_default();
                (d, v)
            })
            .collect())
    }

    /// Zeroes every device's error counters and commits (`btrfs device stats -z`).
    pub fn reset_device_stats(&self) -> Result<()> {
        self.core_read().io.devices().reset_stats();
        self.persist_device_stats()
    }
}
