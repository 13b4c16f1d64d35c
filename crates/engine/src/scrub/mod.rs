//! Scrub (the kernel's scrub.c): every copy of every allocated tree block and data extent
//! is read and verified (tree block header and checksum; data against the csum tree), and
//! a copy that fails is rewritten from one that passes. Counters as `btrfs scrub status`
//! keeps them, per device.
//!
//! Layer 7: the steps, on the committed extent tree and through io; the handle
//! (`Filesystem::scrub`) runs them in batches under its lock, so that a mounted
//! filesystem keeps serving writes while it is scrubbed.

use crate::error::{Error, Result};
use crate::io::device::IoBuf;
use crate::transaction::fs::FsCore;
use oleo_format::items::block_group as bg;
use oleo_format::items::ExtentItem;
use oleo_format::key::{item, objectid, Key};
use std::collections::BTreeMap;
use std::ops::ControlFlow;

/// What a scrub counted on one device (the kernel's btrfs_scrub_progress).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScrubProgress {
    /// Data extent pieces verified.
    pub data_extents_scrubbed: u64,
    /// Tree blocks verified.
    pub tree_extents_scrubbed: u64,
    /// Data bytes verified.
    pub data_bytes_scrubbed: u64,
    /// Tree block bytes verified.
    pub tree_bytes_scrubbed: u64,
    /// Sectors the device could not read.
    pub read_errors: u64,
    /// Sectors whose checksum did not match.
    pub csum_errors: u64,
    /// Tree block sectors that failed (checksum or header), as the kernel counts them.
    pub verify_errors: u64,
    /// Data sectors without a checksum (nodatasum files): read, not verifiable.
    pub no_csum: u64,
    /// Checksums without data (unused by oleo; kept for the report's shape).
    pub csum_discards: u64,
    /// Superblock copies that were bad.
    pub super_errors: u64,
    /// Allocation failures (never, in oleo; kept for the report's shape).
    pub malloc_errors: u64,
    /// Bad sectors no good copy could repair.
    pub uncorrectable_errors: u64,
    /// Bad sectors rewritten from a good copy.
    pub corrected_errors: u64,
    /// Errors that went away on a re-read (unused by oleo).
    pub unverified_errors: u64,
    /// The physical end of the last piece scrubbed on the device.
    pub last_physical: u64,
}

impl ScrubProgress {
    /// Adds `o`'s counts to these.
    pub fn add(&mut self, o: &ScrubProgress) {
        self.data_extents_scrubbed += o.data_extents_scrubbed;
        self.tree_extents_scrubbed += o.tree_extents_scrubbed;
        self.data_bytes_scrubbed += o.data_bytes_scrubbed;
        self.tree_bytes_scrubbed += o.tree_bytes_scrubbed;
        self.read_errors += o.read_errors;
        self.csum_errors += o.csum_errors;
        self.verify_errors += o.verify_errors;
        self.no_csum += o.no_csum;
        self.csum_discards += o.csum_discards;
        self.super_errors += o.super_errors;
        self.malloc_errors += o.malloc_errors;
        self.uncorrectable_errors += o.uncorrectable_errors;
        self.corrected_errors += o.corrected_errors;
        self.unverified_errors += o.unverified_errors;
        // Summed, as btrfs-progs sums the devices' counters.
        self.last_physical += o.last_physical;
    }

    /// Whether any error was counted.
    pub fn has_errors(&self) -> bool {
        self.read_errors
            + self.csum_errors
            + self.verify_errors
            + self.super_errors
            + self.uncorrectable_errors
            + self.corrected_errors
            > 0
    }
}

/// How to scrub.
#[derive(Clone, Debug, Default)]
pub struct ScrubOptions {
    /// Report only: nothing is rewritten (`btrfs scrub start -r`).
    pub readonly: bool,
    /// Bytes per second to read at most (summed over devices); None: as fast as it goes.
    pub rate_limit: Option<u64>,
}

/// The result of one copy of a range.
enum Verdict {
    Good,
    /// Unreadable (IO error, missing device).
    Unreadable,
    /// Read, but these sectors (indexes) failed.
    Bad {
        sectors: Vec<usize>,
    },
}

/// Per device counters as a scrub goes.
pub(crate) type PerDevice = BTreeMap<u64, ScrubProgress>;

/// An allocated extent of a block group: start, length, whether a tree block, its
/// generation (tree blocks).
pub(crate) type Extent = (u64, u64, bool, u64);

/// Read buffers of one scrub, reused from piece to piece and extent to extent (a fresh
/// 4 MiB one each time would be faulted in and cleared by the kernel each time).
#[derive(Default)]
pub(crate) struct ScrubBuffers(parking_lot::Mutex<Vec<IoBuf>>);

/// The size of a scrub read (per copy): large enough to keep a device busy, small enough
/// to keep memory flat for 128 MiB extents.
const PIECE: u64 = 4 << 20;

impl ScrubBuffers {
    fn take(&self) -> IoBuf {
        self.0
            .lock()
            .pop()
            .unwrap_or_else(|| IoBuf::huge(PIECE as usize))
    }

    fn give(&self, bufs: Vec<IoBuf>) {
        let whole = bufs.into_iter().filter(|b| b.len() == PIECE as usize);
        self.0.lock().extend(whole);
    }
}

/// One copy of a piece, read: its bytes and its bad sectors (None: unreadable).
type Checked = (IoBuf, Option<Vec<usize>>);

impl FsCore {
    /// Fresh counters for every present device, with its superblocks checked.
    pub(crate) fn scrub_begin(&self) -> PerDevice {
        let mut stats: PerDevice = self
            .io
            .devices()
            .members()
            .map(|(d, _)| (d, ScrubProgress::default()))
            .collect();
        self.scrub_supers(&mut stats);
        stats
    }

    /// Every block group: (start, length, flags).
    pub(crate) fn scrub_groups(&self) -> Vec<(u64, u64, u64)> {
        self.io
            .chunks()
            .chunks()
            .map(|(&s, c)| (s, c.length, c.chunk_type))
            .collect()
    }

    /// Scrubs one extent of block group (`start`, `flags`).
    pub(crate) fn scrub_extent(
        &self,
        (bytenr, len, tree, generation): Extent,
        start: u64,
        flags: u64,
        repair: bool,
        stats: &mut PerDevice,
        bufs: &ScrubBuffers,
    ) -> Result<()> {
        if tree {
            self.scrub_tree_block(bytenr, len, generation, repair, stats);
            return Ok(());
        }
        self.scrub_data(bytenr, len, repair, stats, bufs)?;
        // The kernel scrubs in 64 KiB stripes and counts an extent once in each stripe it
        // touches, for each copy.
        const STRIPE: u64 = 64 * 1024;
        let first = (bytenr - start) / STRIPE;
        let last = (bytenr + len - 1 - start) / STRIPE;
        let copies = self.io.num_mirrors(bytenr).max(1);
        let raid56 = flags & (bg::RAID5 | bg::RAID6) != 0;
        for m in 0..if raid56 { 1 } else { copies } {
            for s in first..=last {
                let at = (start + s * STRIPE).max(bytenr);
                self.count(stats, at, 1, m, |p, _| p.data_extents_scrubbed += 1);
            }
        }
        Ok(())
    }

    /// The extent tree as last committed (not the running transaction's).
    fn committed_extent_root(&self) -> Result<crate::ctree::TreeRoot> {
        let mut found = None;
        crate::ctree::for_each_in_range(
            &*self.io,
            &self.root_tree,
            Key::new(objectid::EXTENT_TREE, item::ROOT_ITEM, 0),
            Key::new(objectid::EXTENT_TREE, item::ROOT_ITEM, u64::MAX),
            |k, v| {
                let ri = oleo_format::items::RootItem::parse(v)
                    .map_err(|e| Error::corrupt(0, format!("root item {k:?}: {e}")))?;
                found = Some(crate::ctree::TreeRoot {
                    id: objectid::EXTENT_TREE,
                    bytenr: ri.bytenr,
                    level: ri.level,
                    generation: ri.generation,
                });
                Ok(ControlFlow::Continue(()))
            },
        )?;
        found.ok_or_else(|| Error::Unusable("the extent tree is missing".into()))
    }

    /// Whether extent `ext` is still allocated as of the last commit (a scrub of a mounted
    /// filesystem checks before reading it: freed since, its space may hold new data).
    pub(crate) fn scrub_still_allocated(&self, ext: Extent) -> Result<bool> {
        let root = self.committed_extent_root()?;
        let mut found = false;
        crate::ctree::for_each_in_range(
            &*self.io,
            &root,
            Key::new(ext.0, item::EXTENT_ITEM, 0),
            Key::new(ext.0, item::METADATA_ITEM, u64::MAX),
            |_, _| {
                found = true;
                Ok(ControlFlow::Break(()))
            },
        )?;
        Ok(found)
    }

    /// Every superblock copy on every device: parsed, checksummed, of this filesystem.
    fn scrub_supers(&self, stats: &mut PerDevice) {
        use oleo_format::superblock::{mirror_offset, Superblock, SUPER_INFO_SIZE};
        for (devid, m) in self.io.devices().members() {
            for mirror in 0..3 {
                let off = mirror_offset(mirror);
                if off + SUPER_INFO_SIZE as u64 > m.device.size() {
                    break;
                }
                let mut buf = vec![0u8; SUPER_INFO_SIZE];
                let ok = m.device.read_exact_at(&mut buf, off).is_ok()
                    && Superblock::parse(&buf)
                        .is_ok_and(|sb| sb.bytenr == off && sb.fsid == self.sb.fsid);
                if !ok {
                    log::error!("scrub: superblock copy {mirror} of device {devid} is bad");
                    stats.entry(devid).or_default().super_errors += 1;
                }
            }
        }
    }

    /// The extents the committed extent tree has in block group `[start, start+length)`.
    pub(crate) fn allocated_extents(
        &self,
        start: u64,
        length: u64,
        flags: u64,
    ) -> Result<Vec<Extent>> {
        let root = self.committed_extent_root()?;
        let nodesize = u64::from(self.sb.nodesize);
        let mut out = Vec::new();
        let end = start + length;
        crate::ctree::for_each_in_range(
            &*self.io,
            &root,
            Key::new(start, 0, 0),
            Key::new(end - 1, u8::MAX, u64::MAX),
            |k, v| {
                let tree = match k.item_type {
                    item::METADATA_ITEM => true,
                    item::EXTENT_ITEM => {
                        flags & bg::DATA == 0 || {
                            ExtentItem::parse(v, false).is_ok_and(|e| {
                                e.flags & oleo_format::items::EXTENT_FLAG_TREE_BLOCK != 0
                            })
                        }
                    }
                    _ => return Ok(ControlFlow::Continue(())),
                };
                let len = if k.item_type == item::METADATA_ITEM {
                    nodesize
                } else {
                    k.offset
                };
                let skinny = k.item_type == item::METADATA_ITEM;
                let generation = ExtentItem::parse(v, skinny).map_or(0, |e| e.generation);
                if k.objectid >= start && k.objectid.saturating_add(len) <= end {
                    out.push((k.objectid, len, tree, generation));
                }
                Ok(ControlFlow::Continue(()))
            },
        )?;
        Ok(out)
    }

    /// The devices copy `mirror` of `[logical, logical+len)` lives on, with the bytes on
    /// each and the physical end of the last piece there.
    fn copy_devices(&self, logical: u64, len: u64, mirror: usize) -> Vec<(u64, u64, u64)> {
        let chunks = self.io.chunks();
        if chunks
            .profile(logical)
            .is_some_and(|p| p & (bg::RAID5 | bg::RAID6) != 0)
        {
            // A RAID5/6 "copy" past the first is a rebuild: it belongs to no one device.
            if mirror > 0 {
                return Vec::new();
            }
            return chunks
                .map_rows(logical, len)
                .map(|rows| {
                    rows.iter()
                        .map(|r| {
                            let (d, p) = r.stripes[r.target];
                            (d, r.len, p + r.len)
                        })
                        .collect()
                })
                .unwrap_or_default();
        }
        chunks
            .map(logical, len, mirror)
            .map(|v| {
                v.iter()
                    .map(|p| (p.devid, p.len, p.physical + p.len))
                    .collect()
            })
            .unwrap_or_default()
    }

    fn count(
        &self,
        stats: &mut PerDevice,
        logical: u64,
        len: u64,
        mirror: usize,
        f: impl Fn(&mut ScrubProgress, u64),
    ) {
        for (devid, bytes, phys_end) in self.copy_devices(logical, len, mirror) {
            let s = stats.entry(devid).or_default();
            f(s, bytes);
            s.last_physical = s.last_physical.max(phys_end);
        }
    }

    fn scrub_tree_block(
        &self,
        bytenr: u64,
        len: u64,
        generation: u64,
        repair: bool,
        stats: &mut PerDevice,
    ) {
        let sector = u64::from(self.sb.sectorsize);
        let sectors = (len / sector) as usize;
        let copies = self.io.num_mirrors(bytenr).max(1);
        let mut verdicts = Vec::new();
        let mut good: Option<Vec<u8>> = None;
        for m in 0..copies {
            let mut buf = vec![0u8; len as usize];
            let v = match self.io.read_logical(bytenr, &mut buf, m) {
                Err(e) => {
                    log::error!("scrub: tree block {bytenr} copy {m}: {e}");
                    Verdict::Unreadable
                }
                Ok(()) => match self.io.check_tree_copy(&buf, bytenr, generation) {
                    Ok(()) => {
                        good.get_or_insert(buf);
                        Verdict::Good
                    }
                    Err(why) => {
                        log::error!("scrub: tree block {bytenr} copy {m}: {why}");
                        // The kernel's scrub counts bad tree blocks in its report
                        // only, not in the device's error counters.
                        Verdict::Bad {
                            sectors: (0..sectors).collect(),
                        }
                    }
                },
            };
            verdicts.push(v);
        }
        for (m, v) in verdicts.iter().enumerate() {
            self.count(stats, bytenr, len, m, |s, bytes| {
                s.tree_extents_scrubbed += 1;
                s.tree_bytes_scrubbed += bytes;
            });
            let bad = match v {
                Verdict::Good => continue,
                Verdict::Unreadable => {
                    self.count(stats, bytenr, len, m, |s, b| s.read_errors += b / sector);
                    sectors as u64
                }
                Verdict::Bad { sectors: s, .. } => {
                    // The kernel counts every bad tree block (checksum or header) as
                    // verify errors, one per sector.
                    let n = s.len() as u64;
                    self.count(stats, bytenr, len, m, |st, b| {
                        st.verify_errors += n.min(b / sector)
                    });
                    n
                }
            };
            self.settle(stats, bytenr, len, m, bad, good.as_deref(), repair);
        }
    }

    /// Repairs copy `m` of a range from `good` (if any and allowed) and counts the sectors.
    #[allow(clippy::too_many_arguments)]
    fn settle(
        &self,
        stats: &mut PerDevice,
        logical: u64,
        len: u64,
        m: usize,
        bad: u64,
        good: Option<&[u8]>,
        repair: bool,
    ) {
        let fixed = match good {
            Some(g) if repair => match self.io.repair_copy(logical, g, m) {
                Ok(()) => {
                    log::warn!("scrub: repaired logical {logical} ({len} bytes) copy {m}");
                    true
                }
                Err(e) => {
                    log::error!("scrub: could not repair logical {logical} copy {m}: {e}");
                    false
                }
            },
            // Read-only: a sector a good copy could fix counts as corrected, as the
            // kernel's `scrub -r` counts it.
            Some(_) => true,
            None => false,
        };
        let sector = u64::from(self.sb.sectorsize);
        self.count(stats, logical, len, m, |s, b| {
            let k = bad.min(b / sector).max(1);
            if fixed {
                s.corrected_errors += k;
            } else {
                s.uncorrectable_errors += k;
            }
        });
    }

    fn scrub_data(
        &self,
        bytenr: u64,
        len: u64,
        repair: bool,
        stats: &mut PerDevice,
        pool: &ScrubBuffers,
    ) -> Result<()> {
        // Pieces of at most PIECE; the next pieces are
        // read while this one is settled, and the copies of a piece are read at once (the
        // kernel scrubs each device in a thread of its own), around the page cache, each
        // checked as it comes.
        let pieces: Vec<(u64, u64)> = (bytenr..bytenr + len)
            .step_by(PIECE as usize)
            .map(|at| (at, PIECE.min(bytenr + len - at)))
            .collect();
        std::thread::scope(|s| -> Result<()> {
            let start = |(at, n): (u64, u64)| -> Result<_> {
                let sums = self.data_csums(at, at + n)?;
                Ok(s.spawn(move || {
                    let copies = self.scrub_copies(at);
                    let read = |m: usize| self.read_copy(at, n, m, &sums, pool.take());
                    let results: Vec<Checked> = if copies == 1 {
                        vec![read(0)]
                    } else {
                        std::thread::scope(|t| {
                            let h: Vec<_> = (1..copies).map(|m| t.spawn(move || read(m))).collect();
                            let mut out = vec![read(0)];
                            out.extend(
                                h.into_iter()
                                    .map(|h| h.join().unwrap_or_else(|_| (IoBuf::zeroed(0), None))),
                            );
                            out
                        })
                    };
                    (results, sums)
                }))
            };
            // Two pieces in flight while one is settled, so a device's queue never drains.
            const AHEAD: usize = 2;
            let mut pending = std::collections::VecDeque::new();
            for &p in pieces.iter().take(AHEAD) {
                pending.push_back(start(p)?);
            }
            for (k, &(at, n)) in pieces.iter().enumerate() {
                let (results, sums) = pending
                    .pop_front()
                    .expect("a read per piece")
                    .join()
                    .map_err(|_| Error::Io(std::io::Error::other("a scrub read panicked")))?;
                if let Some(&next) = pieces.get(k + AHEAD) {
                    pending.push_back(start(next)?);
                }
                let bufs = self.settle_piece(at, n, results, &sums, repair, stats);
                pool.give(bufs);
            }
            Ok(())
        })
    }

    /// How many copies of the data at `at` a scrub reads: a RAID5/6 row has one (its
    /// rebuilds are not copies to scrub).
    fn scrub_copies(&self, at: u64) -> usize {
        if self.is_raid56(at) {
            1
        } else {
            self.io.num_mirrors(at).max(1)
        }
    }

    fn is_raid56(&self, at: u64) -> bool {
        self.io
            .chunks()
            .profile(at)
            .is_some_and(|p| p & (bg::RAID5 | bg::RAID6) != 0)
    }

    /// Copy `m` of `[at, at+n)` read into the start of `buf` and checked against `sums`
    /// (each piece of the read as it comes): the buffer and the bad sectors (None:
    /// unreadable).
    fn read_copy(
        &self,
        at: u64,
        n: u64,
        m: usize,
        sums: &[Option<Vec<u8>>],
        mut buf: IoBuf,
    ) -> Checked {
        let sector = self.sb.sectorsize as usize;
        let csum_type = self.sb.csum_type();
        let mut bad = Vec::new();
        let mut check = |off: usize, bytes: &[u8]| {
            for (k, s) in bytes.chunks_exact(sector).enumerate() {
                let i = off / sector + k;
                if let Some(Some(c)) = sums.get(i) {
                    if !csum_type.verify(s, c) {
                        bad.push(i);
                    }
                }
            }
        };
        let r = self
            .io
            .read_logical_checked(at, &mut buf[..n as usize], m, true, &mut check);
        if let Err(e) = r {
            log::error!("scrub: data at logical {at} copy {m}: {e}");
            return (buf, None);
        }
        bad.sort_unstable();
        (buf, Some(bad))
    }

    /// Counts a piece's copies and repairs the bad ones from the good sectors of others;
    /// gives the copies' buffers back.
    fn settle_piece(
        &self,
        at: u64,
        n: u64,
        results: Vec<Checked>,
        sums: &[Option<Vec<u8>>],
        repair: bool,
        stats: &mut PerDevice,
    ) -> Vec<IoBuf> {
        let sector = u64::from(self.sb.sectorsize);
        let raid56 = self.is_raid56(at);
        let mut bufs = Vec::with_capacity(results.len());
        let mut bad: Vec<Option<Vec<usize>>> = Vec::with_capacity(results.len());
        for (m, (buf, b)) in results.into_iter().enumerate() {
            if let Some(b) = &b {
                for &i in b {
                    self.io.note_bad_copy(
                        at + i as u64 * sector,
                        sector,
                        m,
                        crate::io::devices::DevStat::Corruption,
                    );
                }
                if !b.is_empty() {
                    log::error!(
                        "scrub: data checksum mismatch at logical {} copy {m} ({} sectors)",
                        at + b[0] as u64 * sector,
                        b.len()
                    );
                }
            }
            bufs.push(buf);
            bad.push(b);
        }
        let no_csum = sums.iter().filter(|c| c.is_none()).count() as u64;
        let nsec = (n / sector) as usize;
        let clean = bad.iter().all(|b| b.as_ref().is_some_and(|b| b.is_empty()));
        // The good bytes, sector by sector, from any copy that has them (only needed
        // when some copy is bad).
        let mut good = Vec::new();
        let mut covered = vec![!clean; nsec];
        if !clean {
            good = vec![0u8; n as usize];
            covered.fill(false);
            for (m, b) in bad.iter().enumerate() {
                let Some(b) = b else { continue };
                for (i, c) in covered.iter_mut().enumerate() {
                    if !*c && !b.contains(&i) {
                        let r = i * sector as usize..(i + 1) * sector as usize;
                        good[r.clone()].copy_from_slice(&bufs[m][r]);
                        *c = true;
                    }
                }
            }
        }
        for (m, b) in bad.iter().enumerate() {
            self.count(stats, at, n, m, |s, bytes| {
                s.data_bytes_scrubbed += bytes;
                s.no_csum += no_csum.min(bytes / sector);
            });
            let bad_sectors: Vec<usize> = match b {
                None => {
                    self.count(stats, at, n, m, |s, b| s.read_errors += b / sector);
                    (0..nsec).collect()
                }
                Some(b) if b.is_empty() => continue,
                Some(b) => {
                    let k = b.len() as u64;
                    self.count(stats, at, n, m, |s, bytes| {
                        s.csum_errors += k.min(bytes / sector)
                    });
                    b.clone()
                }
            };
            let all_good = bad_sectors.iter().all(|&i| covered[i]);
            let good = all_good.then_some(good.as_slice());
            self.settle(
                stats,
                at,
                n,
                m,
                bad_sectors.len() as u64,
                good,
                repair && !raid56,
            );
        }
        bufs
    }
}
