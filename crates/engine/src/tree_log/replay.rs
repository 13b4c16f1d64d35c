//! Replaying a pending log at mount (the kernel's btrfs_recover_log_trees), in one
//! transaction whose commit writes `log_root` 0. Per subvolume (highest id first), in the
//! kernel's passes:
//! 1. inodes: each logged inode's xattrs become the logged set, a logged directory loses
//!    the entries its DIR_LOG_INDEX ranges cover but the log does not list, the inode item
//!    is copied (or created; generation 0 means "exists only": the subvolume's item stands,
//!    a regular file takes a logged non-zero size), extents past the size go;
//! 2. logged DIR_INDEX entries no logged back reference adds;
//! 3. back references (each logged parent's names become the logged ones), file extent
//!    items over their ranges with data references and checksums, nbytes recounted;
//!
//! Then link counts and directory sizes are recounted from the names left, and an inode
//! with none becomes an orphan. A log holding what this does not cover (entries of
//! subvolumes, the DIR_ITEM-keyed logs of kernels before 5.17) gives `Error::Unsupported`;
//! like any failure it drops the transaction unwritten, and the filesystem stays at its
//! last commit, read-only.

use super::replay_names::{names_in_ref, Name, Touched};
use super::{Log, SubvolLog};
use crate::error::{Error, Result};
use crate::transaction::fs::{FsCore, InodeId};
use crate::transaction::space::delayed_ref::DataRef;
use crate::transaction::Transaction;
use oleo_format::items::{
    Compression, DirEntryIter, FileExtent, FileExtentBody, InodeItem, INODE_FLAG_NODATASUM,
};
use oleo_format::key::{item, objectid, Key};
use oleo_format::superblock::incompat;
use std::collections::BTreeSet;
use std::ops::ControlFlow;

/// What a directory's log says about its entries.
#[derive(Default)]
pub(super) struct Names {
    /// Logged DIR_INDEX entries: (index, name, target key).
    pub dir_index: Vec<(u64, Vec<u8>, Key)>,
    /// DIR_LOG_INDEX ranges [first, last] the log is authoritative for.
    pub log_ranges: Vec<(u64, u64)>,
}

/// One logged inode's items.
struct InodeLog<'a> {
    ino: u64,
    inode: InodeItem,
    /// Every name its logged back references list.
    refs: Vec<Name>,
    xattrs: Vec<(Key, &'a [u8])>,
    /// (key, parsed, raw body).
    extents: Vec<(Key, FileExtent<'a>, &'a [u8])>,
    names: Names,
}

/// A subvolume's log sorted into inodes and checksum items.
struct Sorted<'a> {
    inodes: Vec<InodeLog<'a>>,
    /// (logical address of the first sector, one checksum per sector).
    csums: Vec<(u64, &'a [u8])>,
}

fn sort(log: &SubvolLog) -> Result<Sorted<'_>> {
    let mut inodes: Vec<InodeLog<'_>> = Vec::new();
    let mut csums = Vec::new();
    let bad = |key: &Key, e: oleo_format::FormatError| {
        Error::corrupt(
            0,
            format!("log item {key:?} of subvolume {}: {e}", log.subvol),
        )
    };
    for (key, body) in &log.items {
        let body = body.as_slice();
        if key.objectid == objectid::EXTENT_CSUM && key.item_type == item::EXTENT_CSUM {
            csums.push((key.offset, body));
            continue;
        }
        match key.item_type {
            item::INODE_ITEM => {
                let inode = InodeItem::parse(body).map_err(|e| bad(key, e))?;
                inodes.push(InodeLog {
                    ino: key.objectid,
                    inode,
                    refs: Vec::new(),
                    xattrs: Vec::new(),
                    extents: Vec::new(),
                    names: Names::default(),
                });
                continue;
            }
            item::DIR_ITEM | item::DIR_LOG_ITEM => {
                return Err(Error::Unsupported(format!(
                    "the log holds DIR_ITEM-keyed entries (subvolume {}, directory {}), which \
                     only kernels before 5.17 write",
                    log.subvol, key.objectid
                )))
            }
            item::INODE_REF
            | item::INODE_EXTREF
            | item::XATTR_ITEM
            | item::EXTENT_DATA
            | item::DIR_INDEX
            | item::DIR_LOG_INDEX => {}
            t => {
                return Err(Error::Unsupported(format!(
                    "the log holds item type {t} (key {key:?}), which oleo does not replay"
                )))
            }
        }
        let Some(cur) = inodes.last_mut().filter(|i| i.ino == key.objectid) else {
            return Err(Error::Unsupported(format!(
                "the log holds items of inode {} without its inode item",
                key.objectid
            )));
        };
        match key.item_type {
            item::INODE_REF | item::INODE_EXTREF => cur.refs.extend(names_in_ref(key, body)?),
            item::XATTR_ITEM => cur.xattrs.push((*key, body)),
            item::DIR_INDEX => {
                let e = DirEntryIter::new(body)
                    .next()
                    .ok_or_else(|| Error::corrupt(0, format!("empty log item {key:?}")))?
                    .map_err(|e| bad(key, e))?;
                cur.names
                    .dir_index
                    .push((key.offset, e.name.to_vec(), e.location));
            }
            item::DIR_LOG_INDEX => {
                let last = body
                    .get(..8)
                    .and_then(|b| b.try_into().ok())
                    .map(u64::from_le_bytes)
                    .ok_or_else(|| Error::corrupt(0, format!("short log item {key:?}")))?;
                cur.names.log_ranges.push((key.offset, last));
            }
            _ => {
                let fe = FileExtent::parse(body).map_err(|e| bad(key, e))?;
                cur.extents.push((*key, fe, body));
            }
        }
    }
    // An inode logged with no links was unlinked while open (or is an O_TMPFILE): the
    // kernel skips it, and so do we.
    inodes.retain(|i| i.inode.nlink != 0);
    Ok(Sorted { inodes, csums })
}

/// Where a logged file extent item ends in the file (inline: its sector).
fn extent_end(key: &Key, fe: &FileExtent<'_>, sector: u64) -> Option<u64> {
    match fe.body {
        FileExtentBody::Inline { .. } => key
            .offset
            .checked_add(fe.ram_bytes)?
            .checked_next_multiple_of(sector),
        FileExtentBody::Extent { num_bytes, .. } => key.offset.checked_add(num_bytes),
    }
    .filter(|&end| end > key.offset)
}

impl FsCore {
    /// Replays the pending log and commits (`commit`), or leaves the replay in a running
    /// transaction nothing else may join or commit (a read-only open: reads see it, the
    /// device is not written). Returns how many inodes it replayed. On any error nothing
    /// is written and the log stays pending.
    pub(crate) fn replay_log(&mut self, commit: bool) -> Result<usize> {
        let log = super::read(self)?;
        let saved = (self.sb.log_root, self.sb.log_root_level);
        // The replay's commit writes a superblock without the log.
        self.sb.log_root = 0;
        self.sb.log_root_level = 0;
        self.log_in_memory = !commit;
        let r = (|| {
            let mut txn = self.start_transaction()?;
            let n = txn.replay(&log)?;
            if commit {
                txn.commit()?;
            }
            Ok(n)
        })();
        if r.is_err() {
            self.log_in_memory = false;
            self.drop_running();
        }
        if r.is_err() || !commit {
            // Read-only, the superblock still says what is on disk.
            (self.sb.log_root, self.sb.log_root_level) = saved;
        }
        r
    }
}

impl Transaction<'_> {
    fn replay(&mut self, log: &Log) -> Result<usize> {
        // The replay reads back the items it writes.
        self.delayed.bypass = true;
        let nodesize = u64::from(self.filesystem().sb.nodesize);
        let mut plans = Vec::new();
        for sub in &log.subvols {
            // A log of a subvolume deleted since is skipped, as the kernel does.
            match self.root(sub.subvol) {
                Ok(_) => {}
                Err(Error::NotFound) => continue,
                Err(e) => return Err(e),
            }
            plans.push((sub.subvol, sort(sub)?));
        }
        // Nothing allocated in this transaction may land on the log (still the only copy
        // of what it holds until the commit is durable) or on data only the log refers to.
        for &b in &log.blocks {
            self.block_groups.pin(b, nodesize)?;
        }
        let mut claimed = BTreeSet::new();
        for (_, sorted) in &plans {
            for i in &sorted.inodes {
                for (_, fe, _) in &i.extents {
                    if let FileExtentBody::Extent {
                        disk_bytenr,
                        disk_num_bytes,
                        ..
                    } = fe.body
                    {
                        if disk_bytenr != 0 && claimed.insert((disk_bytenr, disk_num_bytes)) {
                            self.claim_logged_extent(disk_bytenr, disk_num_bytes)?;
                        }
                    }
                }
            }
        }
        let mut n = 0;
        for (subvol, sorted) in &plans {
            self.replay_subvolume(*subvol, sorted)?;
            n += sorted.inodes.len();
        }
        // Cached "next free" numbers may predate what the log added.
        self.filesystem().next_ino.lock().clear();
        self.filesystem().next_index.lock().clear();
        Ok(n)
    }

    fn replay_subvolume(&mut self, subvol: u64, sorted: &Sorted<'_>) -> Result<()> {
        let mut touched = Touched::default();
        for i in &sorted.inodes {
            self.replay_inode_item(subvol, i, &mut touched)?;
        }
        let ref_named: BTreeSet<(u64, Vec<u8>)> = sorted
            .inodes
            .iter()
            .flat_map(|i| i.refs.iter().map(|(p, n, _)| (*p, n.clone())))
            .collect();
        for i in &sorted.inodes {
            self.replay_dir_index(subvol, i.ino, &i.names, &ref_named, &mut touched)?;
        }
        for i in &sorted.inodes {
            if !i.refs.is_empty() {
                self.replay_refs(subvol, i.ino, &i.refs, &mut touched)?;
            }
            self.replay_extents(subvol, i, &sorted.csums)?;
        }
        self.fix_counts(subvol, &touched)
    }

    /// A data extent the log refers to: if no extent item has it, its space (free in the
    /// last commit) becomes used now, before anything else is allocated.
    fn claim_logged_extent(&mut self, bytenr: u64, len: u64) -> Result<()> {
        let key = Key::new(bytenr, item::EXTENT_ITEM, len);
        if self.lookup(objectid::EXTENT_TREE, &key)?.is_some() {
            return Ok(());
        }
        self.block_groups.claim(bytenr, len).map_err(|e| {
            Error::corrupt(
                bytenr,
                format!("the log refers to data [{bytenr}, +{len}) that is not free: {e}"),
            )
        })
    }

    /// Pass 1 for one inode: xattrs, entries the log declares gone, the inode item, and
    /// extents past its size.
    fn replay_inode_item(
        &mut self,
        subvol: u64,
        log: &InodeLog<'_>,
        touched: &mut Touched,
    ) -> Result<()> {
        let id = InodeId {
            subvol,
            ino: log.ino,
        };
        let sector = u64::from(self.filesystem().sb.sectorsize);
        // The logged xattrs are all the inode has (replay_xattr_deletes).
        self.delete_items_in_range(
            subvol,
            Key::new(log.ino, item::XATTR_ITEM, 0),
            Key::new(log.ino, item::XATTR_ITEM, u64::MAX),
        )?;
        for (k, b) in &log.xattrs {
            self.insert_item(subvol, *k, b)?;
        }
        let logged_dir = log.inode.mode & 0o170000 == 0o040000;
        let is_reg = log.inode.mode & 0o170000 == 0o100000;
        let old = self.find_inode(id)?;
        if logged_dir && old.is_some() {
            self.replay_dir_deletes(subvol, log.ino, &log.names, touched)?;
        }
        let mut inode = match (&old, log.inode.generation) {
            // Logged only so that it exists: the subvolume's item stands, but a regular
            // file takes a logged non-zero size.
            (Some(old), 0) => {
                let mut i = old.clone();
                if is_reg && log.inode.size != 0 {
                    i.size = log.inode.size;
                }
                i
            }
            (Some(old), _) => {
                let mut i = log.inode.clone();
                // Recounted at the end: nbytes from the extents, a directory's size from
                // its entries.
                i.nbytes = old.nbytes;
                i
            }
            (None, generation) => {
                let mut i = log.inode.clone();
                if generation == 0 {
                    i.generation = self.transid;
                }
                i.nbytes = 0;
                if logged_dir {
                    i.size = 0;
                }
                i.transid = self.transid;
                self.insert_inode(id, &i)?;
                i
            }
        };
        if old.is_some() {
            self.write_inode(id, &mut inode)?;
        }
        if is_reg {
            // Extents past the logged size go first (prealloc beyond EOF included).
            let eof = inode.size.checked_next_multiple_of(sector).ok_or_else(|| {
                Error::corrupt(
                    0,
                    format!("logged inode {} has size {}", log.ino, inode.size),
                )
            })?;
            self.drop_extents(id, eof, u64::MAX)?;
        }
        touched.inodes.insert(log.ino);
        if logged_dir {
            touched.dirs.insert(log.ino);
        }
        Ok(())
    }

    /// Pass 3 for one inode's data: the logged extent items, then nbytes recounted.
    fn replay_extents(
        &mut self,
        subvol: u64,
        log: &InodeLog<'_>,
        csums: &[(u64, &[u8])],
    ) -> Result<()> {
        let id = InodeId {
            subvol,
            ino: log.ino,
        };
        let mut inode = self.read_inode(id)?;
        // Pass 1 may have dropped extents past the size even when none are logged. A
        // symlink's target is its inline extent.
        if !matches!(inode.mode & 0o170000, 0o100000 | 0o120000) {
            return Ok(());
        }
        for (key, fe, raw) in &log.extents {
            self.replay_extent(id, key, fe, raw, inode.flags, csums)?;
        }
        inode.nbytes = self.count_nbytes(id)?;
        self.write_inode(id, &mut inode)
    }

    fn replay_extent(
        &mut self,
        id: InodeId,
        key: &Key,
        fe: &FileExtent<'_>,
        raw: &[u8],
        flags: u64,
        csums: &[(u64, &[u8])],
    ) -> Result<()> {
        let sector = u64::from(self.filesystem().sb.sectorsize);
        if !key.offset.is_multiple_of(sector) {
            return Err(Error::corrupt(
                0,
                format!("logged file extent {key:?} is not sector-aligned"),
            ));
        }
        let extent = match fe.body {
            FileExtentBody::Extent {
                prealloc,
                disk_bytenr,
                disk_num_bytes,
                offset,
                num_bytes,
            } => Some((prealloc, disk_bytenr, disk_num_bytes, offset, num_bytes)),
            FileExtentBody::Inline { .. } => None,
        };
        if extent.is_some() && self.lookup(id.subvol, key)?.as_deref() == Some(raw) {
            return Ok(());
        }
        let end = extent_end(key, fe, sector).ok_or_else(|| {
            Error::corrupt(0, format!("logged file extent {key:?} has no extent"))
        })?;
        self.drop_extents(id, key.offset, end)?;
        let Some((prealloc, disk_bytenr, disk_num_bytes, offset, num_bytes)) = extent else {
            return self.insert_item(id.subvol, *key, raw);
        };
        if disk_bytenr == 0 {
            // A hole: with no-holes, dropping what was there is all.
            if self.filesystem().sb.has_incompat(incompat::NO_HOLES) {
                return Ok(());
            }
            return self.insert_item(id.subvol, *key, raw);
        }
        self.insert_item(id.subvol, *key, raw)?;
        self.add_data_ref(
            disk_bytenr,
            disk_num_bytes,
            DataRef {
                root: id.subvol,
                objectid: id.ino,
                offset: key.offset.wrapping_sub(offset),
            },
        )?;
        if prealloc || flags & INODE_FLAG_NODATASUM != 0 {
            return Ok(());
        }
        // Logged checksums over the range this item uses (all of a compressed extent)
        // replace the csum tree's there. An older extent a full sync copied has none in
        // the log, and keeps its own.
        let (from, len) = if fe.compression == Compression::None {
            (disk_bytenr.saturating_add(offset), num_bytes)
        } else {
            (disk_bytenr, disk_num_bytes)
        };
        let csize = self.filesystem().sb.csum_type().size() as u64;
        let to = from.saturating_add(len);
        for &(start, sums) in csums {
            let sectors = sums.len() as u64 / csize;
            let stop = start.saturating_add(sectors * sector);
            let (a, b) = (start.max(from), stop.min(to));
            if a >= b {
                continue;
            }
            let first = ((a - start) / sector * csize) as usize;
            let last = (b - start).div_ceil(sector) * csize;
            self.delete_csums(a, b - a)?;
            self.insert_csum_bytes(a, &sums[first..last as usize])?;
        }
        Ok(())
    }

    /// Bytes the file's extent items use (nbytes): holes count nothing, inline extents
    /// their length.
    fn count_nbytes(&mut self, id: InodeId) -> Result<u64> {
        let mut total = 0u64;
        self.for_each_in_range(
            id.subvol,
            Key::new(id.ino, item::EXTENT_DATA, 0),
            Key::new(id.ino, item::EXTENT_DATA, u64::MAX),
            |k, b| {
                let fe = FileExtent::parse(b)
                    .map_err(|e| Error::corrupt(0, format!("file extent {k:?}: {e}")))?;
                total = total.saturating_add(match fe.body {
                    FileExtentBody::Inline { .. } => fe.ram_bytes,
                    FileExtentBody::Extent { disk_bytenr: 0, .. } => 0,
                    FileExtentBody::Extent { num_bytes, .. } => num_bytes,
                });
                Ok(ControlFlow::Continue(()))
            },
        )?;
        Ok(total)
    }
}

impl FsCore {
    /// Replays the log at open, as the kernel does at mount. Writable, the replay is
    /// committed; read-only, it stays in memory (the image is not written) and any error
    /// leaves the last committed state. A log oleo cannot replay leaves the filesystem at
    /// its last commit (read-only, and says why); a damaged one refuses a writable open.
    pub(crate) fn replay_pending_log(&mut self, allowed: bool, writable: bool) -> Result<()> {
        if !allowed {
            self.log_not_replayed = Some("log replay was turned off (nologreplay)".into());
            return Ok(());
        }
        match self.replay_log(writable) {
            Ok(n) if writable => {
                log::info!(
                    "replayed the log tree: {n} inodes, now at generation {}",
                    self.sb.generation
                );
                self.pending_log = false;
                Ok(())
            }
            Ok(n) => {
                log::info!(
                    "replayed the log tree in memory ({n} inodes): showing what was fsynced; \
                     the image is not written"
                );
                self.pending_log = false;
                Ok(())
            }
            Err(Error::Unsupported(why)) => {
                self.log_not_replayed = Some(why);
                Ok(())
            }
            Err(e) if !writable => {
                self.log_not_replayed = Some(format!("replaying it failed: {e}"));
                Ok(())
            }
            Err(e) => Err(Error::Unusable(format!(
                "replaying the log tree failed: {e}; mount with -o ro,rescue=nologreplay to \
                 read the last committed state"
            ))),
        }
    }
}
