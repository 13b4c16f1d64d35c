//! The devices of one filesystem (the kernel's btrfs_fs_devices, volumes.c): each opened
//! and claimed, matched by fsid and devid, the newest superblock chosen; the ones the chunk
//! tree lists but nobody gave are missing, and reads of them fail cleanly so that another
//! copy or parity answers.

use crate::error::{Error, Result};
use crate::io::device::Device;
use crate::io::write_behind::WriteBehind;
use oleo_format::bytes::uuid_string;
use oleo_format::items::DevItem;
use oleo_format::superblock::{self, Superblock, SUPER_INFO_SIZE};
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// One present device.
pub(crate) struct Member {
    pub path: PathBuf,
    pub device: Arc<Device>,
}

pub(crate) struct DeviceSet {
    /// The devid whose superblock the filesystem was opened from.
    primary: u64,
    members: BTreeMap<u64, Member>,
    /// Devids the chunk tree lists that no path gave.
    missing: BTreeMap<u64, [u8; 16]>,
    /// Each device's DEV_ITEM as the next superblock of that device must embed it.
    dev_items: Mutex<BTreeMap<u64, DevItem>>,
    /// Error counters per device (DEV_STATS items), and whether they changed since the
    /// last commit wrote them.
    stats: Mutex<(BTreeMap<u64, DevStats>, bool)>,
    /// Writes queued for a thread of their own (`OpenOptions::write_behind`): every read,
    /// flush, superblock write and discard waits for them first.
    behind: Option<WriteBehind>,
}

/// Where part of a device read goes: its offset in the caller's whole buffer, and the bytes.
pub(crate) type ReadPart<'a> = (usize, &'a mut [u8]);

/// One read of a batch: the bytes at `physical` of device `devid`, back to back there,
/// going to `parts` in order.
pub(crate) struct DevRead<'a> {
    pub devid: u64,
    pub physical: u64,
    pub parts: Vec<ReadPart<'a>>,
}

impl DevRead<'_> {
    pub(crate) fn len(&self) -> u64 {
        self.parts.iter().map(|(_, p)| p.len() as u64).sum()
    }
}

/// A device's error counters, in the order of the DEV_STATS item (the kernel's
/// btrfs_dev_stat_values): write, read, flush, corruption, generation.
pub type DevStats = [u64; 5];

/// Which counter an error bumps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DevStat {
    Write = 0,
    Read = 1,
    Flush = 2,
    Corruption = 3,
    Generation = 4,
}

impl DeviceSet {
    /// Opens and claims every path (read-write when `writable`), reads their superblocks and
    /// keeps those of one filesystem: the first path's. Returns the set and the newest
    /// superblock among them. `any_copy` lets a device whose primary superblock is not
    /// btrfs's at all be read from a later copy (rescue: the user named the image and
    /// reads only).
    pub(crate) fn open_with(
        paths: &[PathBuf],
        writable: bool,
        any_copy: bool,
    ) -> Result<(DeviceSet, Superblock)> {
        Self::open_copy(paths, writable, any_copy, None)
    }

    /// `open_with`, where `copy` names the one superblock copy to read on each device
    /// (the `sb=N` option).
    pub(crate) fn open_copy(
        paths: &[PathBuf],
        writable: bool,
        any_copy: bool,
        copy: Option<usize>,
    ) -> Result<(DeviceSet, Superblock)> {
        let first = paths
            .first()
            .ok_or_else(|| Error::InvalidArgument("no device given".into()))?;
        let mut seen: Vec<(u64, u64, &Path)> = Vec::new();
        let mut members: BTreeMap<u64, (Member, Superblock)> = BTreeMap::new();
        let mut fsid = None;
        let recording: crate::io::device::Recording = Arc::default();
        for path in paths {
            let meta = std::fs::metadata(path).map_err(|e| {
                Error::Io(std::io::Error::new(
                    e.kind(),
                    format!("{}: {e}", path.display()),
                ))
            })?;
            use std::os::unix::fs::MetadataExt;
            let id = if meta.rdev() != 0 {
                (meta.rdev(), 0)
            } else {
                (meta.dev(), meta.ino())
            };
            if let Some((_, _, p)) = seen.iter().find(|(a, b, _)| (*a, *b) == id) {
                return Err(Error::InvalidArgument(format!(
                    "{} is given twice (as {})",
                    path.display(),
                    p.display()
                )));
            }
            seen.push((id.0, id.1, path));
            let device = if writable {
                Device::open_rw(path)?
            } else {
                Device::open(path)?
            };
            let sb = match copy {
                Some(n) => read_superblock_copy(&device, n),
                None => read_superblock(&device, any_copy, writable),
            }
            .map_err(|e| named(path, e))?;
            let want = *fsid.get_or_insert(sb.fsid);
            if sb.fsid != want {
                return Err(Error::Unusable(format!(
                    "{}: belongs to filesystem {}, not to {} (the filesystem of {})",
                    path.display(),
                    uuid_string(&sb.fsid),
                    uuid_string(&want),
                    first.display()
                )));
            }
            let devid = sb.dev_item.devid;
            let mut device = device;
            device.share_recording(devid, Arc::clone(&recording));
            if let Some((other, osb)) = members.get(&devid) {
                if osb.dev_item.uuid == sb.dev_item.uuid {
                    return Err(Error::InvalidArgument(format!(
                        "{} and {} are the same device of the filesystem (devid {devid}): give one",
                        other.path.display(),
                        path.display()
                    )));
                }
                return Err(Error::Unusable(format!(
                    "{} and {} both claim devid {devid} with different device uuids",
                    other.path.display(),
                    path.display()
                )));
            }
            let m = Member {
                path: path.clone(),
                device: Arc::new(device),
            };
            members.insert(devid, (m, sb));
        }
        // The newest superblock speaks for the set (a member that missed commits is stale).
        let (&primary, _) = members
            .iter()
            .max_by_key(|(devid, (_, sb))| (sb.generation, std::cmp::Reverse(**devid)))
            .expect("at least one path");
        let sb = members[&primary].1.clone();
        for (devid, (m, msb)) in &members {
            if msb.generation != sb.generation {
                log::warn!(
                    "{} (devid {devid}) is at generation {}, the filesystem at {}: its copies may be stale",
                    m.path.display(),
                    msb.generation,
                    sb.generation
                );
            }
        }
        let dev_items = members
            .iter()
            .map(|(&d, (_, s))| (d, s.dev_item.clone()))
            .collect();
        let set = DeviceSet {
            primary,
            members: members.into_iter().map(|(d, (m, _))| (d, m)).collect(),
            missing: BTreeMap::new(),
            dev_items: Mutex::new(dev_items),
            stats: Mutex::new((BTreeMap::new(), false)),
            behind: None,
        };
        Ok((set, sb))
    }

    /// Checks the set against the chunk tree's DEV_ITEMs: each member must be listed with
    /// its uuid; the listed ones nobody gave are recorded as missing and returned.
    pub(crate) fn match_dev_items(&mut self, items: &[DevItem]) -> Result<Vec<(u64, [u8; 16])>> {
        for (devid, m) in &self.members {
            match items.iter().find(|d| d.devid == *devid) {
                None => {
                    return Err(Error::Unusable(format!(
                        "{}: devid {devid} is not a device of this filesystem any more",
                        m.path.display()
                    )))
                }
                Some(d) => {
                    let mine = self.dev_items.lock().get(devid).map(|i| i.uuid);
                    if mine != Some(d.uuid) {
                        return Err(Error::Unusable(format!(
                            "{}: its device uuid does not match devid {devid} of the filesystem",
                            m.path.display()
                        )));
                    }
                }
            }
        }
        let mut dev_items = self.dev_items.lock();
        for d in items {
            dev_items.insert(d.devid, d.clone());
            if !self.members.contains_key(&d.devid) {
                self.missing.insert(d.devid, d.uuid);
            }
        }
        Ok(self.missing.iter().map(|(&d, &u)| (d, u)).collect())
    }

    /// The device the superblock came from (crash tests record and fail its IO).
    pub(crate) fn primary(&self) -> &Device {
        &self.members[&self.primary].device
    }

    pub(crate) fn get(&self, devid: u64) -> Option<&Device> {
        self.members.get(&devid).map(|m| &*m.device)
    }

    pub(crate) fn is_missing(&self, devid: u64) -> bool {
        !self.members.contains_key(&devid)
    }

    pub(crate) fn members(&self) -> impl Iterator<Item = (u64, &Member)> {
        self.members.iter().map(|(&d, m)| (d, m))
    }

    /// Whether every member is open for writing.
    pub(crate) fn is_writable(&self) -> bool {
        self.members.values().all(|m| m.device.is_writable())
    }

    /// Reads `buf` at `physical` of device `devid`.
    pub(crate) fn read(
        &self,
        devid: u64,
        buf: &mut [u8],
        physical: u64,
        uncached: bool,
    ) -> Result<()> {
        self.drain()?;
        let dev = self.get(devid).ok_or_else(|| missing_err(devid))?;
        let r = dev.read_exact_at_mode(buf, physical, uncached);
        if let Err(Error::Io(e)) = &r {
            log::error!("device {devid}: read error at physical {physical}: {e}");
            self.bump(devid, DevStat::Read);
        }
        r
    }

    /// Runs `reads` all at once (see `DiskIo::plan_reads`), `done` seeing each read's
    /// parts as soon as they are in; the first error is returned after every read has
    /// ended, each one logged and counted.
    pub(crate) fn read_batch(
        &self,
        reads: &mut [DevRead<'_>],
        uncached: bool,
        done: &mut dyn FnMut(&[ReadPart<'_>]),
    ) -> Result<()> {
        self.drain()?;
        let mut plan = Vec::with_capacity(reads.len());
        for r in reads.iter_mut() {
            let dev = self.get(r.devid).ok_or_else(|| missing_err(r.devid))?;
            let fd = dev.read_fd(
                r.parts.iter().map(|(_, p)| p.len()),
                r.parts.iter().map(|(_, p)| p.as_ptr() as u64),
                r.physical,
                uncached,
            )?;
            let iov = r
                .parts
                .iter_mut()
                .map(|(_, p)| libc::iovec {
                    iov_base: p.as_mut_ptr().cast(),
                    iov_len: p.len(),
                })
                .collect();
            plan.push(crate::io::device_uring::VecRead {
                fd,
                offset: r.physical,
                iov,
            });
        }
        // SAFETY: the iovecs point into `reads`' slices, borrowed mutably until we return;
        // a read's slices are looked at only once it has ended.
        let results =
            unsafe { crate::io::device_uring::read_batch(&plan, &mut |i| done(&reads[i].parts)) };
        let mut first = Ok(());
        for (r, res) in reads.iter().zip(results) {
            if let Err(e) = res {
                log::error!(
                    "device {}: read error at physical {}: {e}",
                    r.devid,
                    r.physical
                );
                self.bump(r.devid, DevStat::Read);
                if first.is_ok() {
                    first = Err(Error::Io(e));
                }
            }
        }
        first
    }

    /// Writes `buf` at `physical` of device `devid`.
    pub(crate) fn write(
        &self,
        devid: u64,
        buf: &[u8],
        physical: u64,
        uncached: bool,
    ) -> Result<()> {
        let dev = self.get(devid).ok_or_else(|| missing_err(devid))?;
        if let Some(behind) = &self.behind {
            // What the write itself would refuse at once is refused here, at once.
            dev.check_write(buf.len(), physical)?;
            behind.write(devid, buf, physical, uncached);
            return Ok(());
        }
        let r = dev.write_all_at_mode(buf, physical, uncached);
        if let Err(Error::Io(e)) = &r {
            log::error!("device {devid}: write error at physical {physical}: {e}");
            self.bump(devid, DevStat::Write);
        }
        r
    }

    /// From now on writes are queued for a thread of their own (`io::write_behind`).
    pub(crate) fn start_write_behind(&mut self) -> Result<()> {
        if self.behind.is_none() {
            let devices = self
                .members
                .iter()
                .map(|(&d, m)| (d, Arc::clone(&m.device)))
                .collect();
            self.behind = Some(WriteBehind::start(devices)?);
        }
        Ok(())
    }

    /// Waits for every queued write; the first queued write that ever failed is the error,
    /// every time (each failure counted against its device once).
    pub(crate) fn drain(&self) -> Result<()> {
        let Some(behind) = &self.behind else {
            return Ok(());
        };
        let (r, failed) = behind.drain();
        for devid in failed {
            self.bump(devid, DevStat::Write);
        }
        r
    }

    /// Counts an error of device `devid` (persisted by the next commit).
    pub(crate) fn bump(&self, devid: u64, stat: DevStat) {
        let mut st = self.stats.lock();
        st.0.entry(devid).or_default()[stat as usize] += 1;
        st.1 = true;
    }

    /// The counters as the DEV_STATS items say at open.
    pub(crate) fn load_stats(&self, devid: u64, values: DevStats) {
        self.stats.lock().0.insert(devid, values);
    }

    /// Every device's counters.
    pub(crate) fn stats(&self) -> BTreeMap<u64, DevStats> {
        self.stats.lock().0.clone()
    }

    /// Zeroes the counters (`device stats -z`); the next commit writes them.
    pub(crate) fn reset_stats(&self) {
        let mut st = self.stats.lock();
        for v in st.0.values_mut() {
            *v = [0; 5];
        }
        st.1 = true;
    }

    /// Whether the counters changed since a commit last wrote them.
    pub(crate) fn stats_dirty(&self) -> bool {
        self.stats.lock().1
    }

    /// The counters to write, if they changed since the last call.
    pub(crate) fn take_dirty_stats(&self) -> Option<BTreeMap<u64, DevStats>> {
        let mut st = self.stats.lock();
        std::mem::take(&mut st.1).then(|| st.0.clone())
    }

    /// A cache flush of every present device, in parallel: a commit waits for the slowest.
    pub(crate) fn flush(&self) -> Result<()> {
        self.drain()?;
        if self.members.len() == 1 {
            let r = self.primary().flush();
            if r.is_err() {
                self.bump(self.primary, DevStat::Flush);
            }
            return r;
        }
        std::thread::scope(|s| {
            let handles: Vec<_> = self
                .members
                .values()
                .map(|m| s.spawn(move || m.device.flush()))
                .collect();
            let mut out = Ok(());
            for (h, devid) in handles.into_iter().zip(self.members.keys()) {
                let r = h.join().unwrap_or_else(|_| {
                    Err(Error::Io(std::io::Error::other("a device flush panicked")))
                });
                if r.is_err() {
                    self.bump(*devid, DevStat::Flush);
                }
                if out.is_ok() {
                    out = r;
                }
            }
            out
        })
    }

    /// Re-checks every member's claim (see `Device::check_claim`).
    pub(crate) fn check_claim(&self) -> Result<()> {
        for m in self.members.values() {
            m.device.check_claim()?;
        }
        Ok(())
    }

    /// Device `devid`'s DEV_ITEM as its next superblock embeds it.
    pub(crate) fn dev_item(&self, devid: u64) -> Option<DevItem> {
        self.dev_items.lock().get(&devid).cloned()
    }

    /// The DEV_ITEM device `devid`'s superblock embeds from now on (bytes_used grew).
    pub(crate) fn set_dev_item(&self, item: DevItem) {
        self.dev_items.lock().insert(item.devid, item);
    }

    /// Discards `[physical, physical + len)` of device `devid` (`Device::discard`), never
    /// the first MiB nor a superblock copy's 64 KiB stripe, whatever the caller asks (the
    /// kernel's btrfs_issue_discard leaves the superblock copies out the same way). A
    /// missing device discards nothing. Returns the bytes discarded.
    /// `Device::drop_cached` on device `devid`.
    pub(crate) fn drop_cached(&self, devid: u64, physical: u64, len: u64) {
        // A write still queued would put the range back into the cache.
        let _ = self.drain();
        if let Some(m) = self.members.get(&devid) {
            m.device.drop_cached(physical, len);
        }
    }

    pub(crate) fn discard(&self, devid: u64, physical: u64, len: u64) -> Result<u64> {
        self.drain()?;
        let Some(m) = self.members.get(&devid) else {
            return Ok(0);
        };
        let end = physical.saturating_add(len);
        let mut keep: Vec<(u64, u64)> = vec![(0, DISCARD_RESERVED)];
        keep.extend(
            (0..3)
                .map(superblock::mirror_offset)
                .map(|off| (off, off + SUPER_STRIPE)),
        );
        let mut done = 0;
        let mut cur = physical;
        while cur < end {
            // The next kept range at or after `cur` ends the piece; one covering `cur` skips it.
            if let Some(&(_, e)) = keep.iter().find(|&&(s, e)| s <= cur && cur < e) {
                cur = e;
                continue;
            }
            let stop = keep
                .iter()
                .map(|&(s, _)| s)
                .filter(|&s| s > cur)
                .min()
                .unwrap_or(u64::MAX)
                .min(end);
            done += m.device.discard(cur, stop - cur)?;
            cur = stop;
        }
        Ok(done)
    }

    /// Writes superblock `sb` to every present device, each with its own DEV_ITEM, at copy
    /// 0 only (`primary_only`, a log sync) or at every copy that fits the device.
    pub(crate) fn write_superblocks(&self, sb: &Superblock, primary_only: bool) -> Result<()> {
        self.drain()?;
        let items = self.dev_items.lock().clone();
        for (devid, m) in &self.members {
            let mut copy = sb.clone();
            if let Some(item) = items.get(devid) {
                copy.dev_item = item.clone();
            }
            let size = m.device.size();
            for mirror in 0..if primary_only { 1 } else { 3 } {
                let off = superblock::mirror_offset(mirror);
                if off + SUPER_INFO_SIZE as u64 > size {
                    break;
                }
                copy.bytenr = off;
                let bytes = copy
                    .to_bytes()
                    .map_err(|e| Error::corrupt(off, format!("superblock: {e}")))?;
                m.device.write_all_at(&bytes, off)?;
            }
        }
        Ok(())
    }
}

fn missing_err(devid: u64) -> Error {
    Error::Io(std::io::Error::new(
        std::io::ErrorKind::NotFound,
        format!("device {devid} is missing"),
    ))
}

fn named(path: &Path, e: Error) -> Error {
    match e {
        Error::Unusable(m) => Error::Unusable(format!("{}: {m}", path.display())),
        other => other,
    }
}

/// Bytes at the start of every device that no chunk uses and nothing discards.
const DISCARD_RESERVED: u64 = 1 << 20;
/// The stripe around each superblock copy that no chunk hands out.
const SUPER_STRIPE: u64 = 64 << 10;

/// Where the magic lies in a superblock (after the checksum, fsid, bytenr and flags).
const MAGIC_AT: usize = 0x40;

/// Superblock copy `n` (0, 1 or 2) and no other: the user chose it (`sb=N`).
pub(crate) fn read_superblock_copy(device: &Device, n: usize) -> Result<Superblock> {
    if n > 2 {
        return Err(Error::InvalidArgument(format!(
            "sb={n}: btrfs keeps superblock copies 0, 1 and 2"
        )));
    }
    let off = superblock::mirror_offset(n);
    if off + SUPER_INFO_SIZE as u64 > device.size() {
        return Err(Error::Unusable(format!(
            "superblock copy {n} (at {off}) lies past the end of the device"
        )));
    }
    let mut buf = vec![0u8; SUPER_INFO_SIZE];
    device.read_exact_at(&mut buf, off)?;
    // sb= opens read-only: a field that fails its check is mended from the rest.
    let sb = Superblock::parse_unchecked(&buf)
        .map_err(|e| Error::Unusable(format!("superblock copy {n} (at {off}): {e}")))
        .and_then(|sb| mended(sb, n, off))?;
    if sb.bytenr != off {
        return Err(Error::Unusable(format!(
            "superblock copy {n} (at {off}) claims to be at {}",
            sb.bytenr
        )));
    }
    log::warn!(
        "rescue: sb={n}: using superblock copy {n} (at {off}), generation {}",
        sb.generation
    );
    Ok(sb)
}

/// The primary superblock, or a later copy where the primary is damaged (the kernel
/// would refuse; for recovery work a good copy is worth using, loudly). A copy whose
/// checksum is good but a field of which fails its sanity check (a wrong value written,
/// not a torn write) is not believed over the others: a read-only open uses a copy that
/// passes, or else the copy mended from the rest of itself (its backup roots); a
/// writable open is refused, naming the field, since oleo would write from a superblock
/// that disagrees with itself.
pub(crate) fn read_superblock(
    device: &Device,
    any_copy: bool,
    writable: bool,
) -> Result<Superblock> {
    let mut first_err: Option<String> = None;
    // Copies whose checksum is good but a field is not: (mirror, offset, superblock).
    let mut insane = Vec::new();
    for mirror in 0..3 {
        let off = superblock::mirror_offset(mirror);
        if off + SUPER_INFO_SIZE as u64 > device.size() {
            break;
        }
        let mut buf = vec![0u8; SUPER_INFO_SIZE];
        let read = device
            .read_exact_at(&mut buf, off)
            .map_err(|e| e.to_string());
        let read_ok = read.is_ok();
        let parsed =
            read.and_then(|_| Superblock::parse_unchecked(&buf).map_err(|e| e.to_string()));
        // A primary without btrfs's magic is no damaged btrfs superblock: the device was
        // most likely made into something else, and its old copies further in must not
        // bring a stale btrfs back over it (the kernel never reads them either).
        if mirror == 0
            && !any_copy
            && read_ok
            && buf[MAGIC_AT..MAGIC_AT + 8] != superblock::MAGIC.to_le_bytes()
        {
            return Err(Error::Unusable(
                "no btrfs superblock at 64 KiB (not a btrfs filesystem, or its primary \
                 superblock was overwritten: copies further in are not used on their own; \
                 `-o sb=1` mounts from the first, `oleo restore --mirror 1` copies files out)"
                    .into(),
            ));
        }
        match parsed {
            Ok(sb) if sb.bytenr == off => {
                let problems = sb.problems();
                if !problems.is_empty() {
                    let why = format!(
                        "superblock copy {mirror} (at {off}): {}",
                        problems.join("; ")
                    );
                    log::warn!("{why}");
                    if writable && mirror == 0 {
                        return Err(Error::Unusable(format!(
                            "{why}: refusing to write from a superblock that fails its checks \
                             (a read-only mount falls back to another copy, or mends the field \
                             from the superblock's backup roots; `btrfs rescue super-recover` \
                             rewrites it from a good copy)"
                        )));
                    }
                    first_err.get_or_insert(why);
                    insane.push((mirror, off, sb));
                    continue;
                }
                if mirror > 0 {
                    log::warn!(
                        "primary superblock unusable ({}); using the copy at {off}",
                        first_err.as_deref().unwrap_or("?")
                    );
                }
                return Ok(sb);
            }
            Ok(sb) => {
                first_err.get_or_insert(format!("copy at {off} claims to be at {}", sb.bytenr))
            }
            Err(e) => first_err.get_or_insert(e),
        };
    }
    // No copy passes every check: read-only, the newest that its backup roots mend.
    let mut best: Option<Superblock> = None;
    if !writable {
        for (mirror, off, sb) in insane {
            if let Ok(sb) = mended(sb, mirror, off) {
                if best.as_ref().is_none_or(|b| sb.generation > b.generation) {
                    best = Some(sb);
                }
            }
        }
    }
    best.ok_or_else(|| {
        Error::Unusable(format!(
            "no valid btrfs superblock: {}",
            first_err.unwrap_or_else(|| "device too small".into())
        ))
    })
}

/// Copy `mirror` (at `off`) with the fields that fail their checks mended from its backup
/// roots, logged field by field; an error naming the fields that cannot be.
fn mended(mut sb: Superblock, mirror: usize, off: u64) -> Result<Superblock> {
    let problems = sb.problems();
    if problems.is_empty() {
        return Ok(sb);
    }
    match sb.mend_from_backups() {
        Ok(fixed) => {
            log::warn!(
                "superblock copy {mirror} (at {off}): {}; read as {} (read-only)",
                problems.join("; "),
                fixed.join("; ")
            );
            Ok(sb)
        }
        Err(left) => Err(Error::Unusable(format!(
            "superblock copy {mirror} (at {off}): {}",
            left.join("; ")
        ))),
    }
}
