//! The handle's side of two of the kernel's ioctls (ioctl.c): FITRIM, which discards the
//! free space of the filesystem as extent-tree.c's btrfs_trim_fs does, and the superblock
//! label (FS_IOC_GETFSLABEL, FS_IOC_SETFSLABEL).

use super::Filesystem;
use crate::error::{Error, Result};
use oleo_format::superblock::LABEL_SIZE;

/// The most discarded at once while the filesystem is held alone (unallocated space).
const DEVICE_PIECE: u64 = 1 << 30;

impl Filesystem {
    /// Discards the free space (FITRIM, `fstrim`): every free range of at least `minlen`
    /// bytes inside the block groups' part of `[start, start + len)` of the logical address
    /// space, and all unallocated space of every device (the kernel trims that whatever
    /// the range). An image file gets holes punched there, a block device a discard.
    /// Returns the bytes discarded, each copy counted (DUP and RAID1 twice), as the kernel
    /// reports them. EINVAL for a `len` under a sector, a range past 2^64 or a start of 2^64-1, as the
    /// kernel.
    ///
    /// It commits first, so space freed until now is free. Nothing in use is touched: not
    /// space freed by a commit not yet durable, nor data on its way to the device, nor log
    /// tree blocks, nor the first MiB or a superblock copy. Each block group's ranges are
    /// reserved while they are discarded, so allocations go elsewhere meanwhile (as the
    /// kernel takes them out of the free space cache); unallocated device space is
    /// discarded a piece at a time with the filesystem held, so no chunk is made there.
    pub fn trim(&self, start: u64, len: u64, minlen: u64) -> Result<u64> {
        let sectorsize = u64::from(self.superblock().sectorsize);
        if len < sectorsize {
            return Err(Error::InvalidArgument(format!(
                "trim length {len} is under the sector size {sectorsize}"
            )));
        }
        // A start at the very last byte is refused even with the default length (which
        // otherwise means "to the end"), as kernel btrfs refuses it (checked: fstrim -o
        // 2^64-1 gets EINVAL there; fstests generic/260).
        if start == u64::MAX {
            return Err(Error::InvalidArgument(format!(
                "trim start {start} is past every address"
            )));
        }
        let end = match len {
            u64::MAX => u64::MAX,
            _ => start.checked_add(len).ok_or_else(|| {
                Error::InvalidArgument(format!("trim range {start}+{len} overflows"))
            })?,
        };
        if !self.io.devices().is_writable() {
            return Err(Error::ReadOnly);
        }
        self.sync()?;
        let groups = {
            let mut core = self.core_mut();
            let txn = core.start_transaction()?;
            txn.block_groups.overlapping(start, end)
        };
        let mut trimmed = 0;
        for (group, length) in groups {
            let (lo, hi) = (start.max(group), end.min(group.saturating_add(length)));
            if hi.saturating_sub(lo) < minlen.max(1) {
                continue;
            }
            let ranges = {
                let mut core = self.core_mut();
                let mut txn = core.start_transaction()?;
                txn.block_groups.reserve_trimmable(group, lo, hi, minlen)
            };
            let mut r = Ok(());
            for &(s, l) in &ranges {
                match self.io.discard_logical(s, l) {
                    Ok(n) => trimmed += n,
                    Err(e) => {
                        r = Err(e);
                        break;
                    }
                }
            }
            {
                let mut core = self.core_mut();
                let mut txn = core.start_transaction()?;
                for &(s, _) in &ranges {
                    txn.block_groups.cancel_reserved(s);
                }
            }
            r?;
        }
        let devids: Vec<u64> = self.io.devices().members().map(|(d, _)| d).collect();
        for devid in devids {
            let mut from = 0;
            loop {
                // Held alone across the discard: no chunk can be made in the hole meanwhile.
                let mut core = self.core_mut();
                let mut txn = core.start_transaction()?;
                let next = txn
                    .unallocated_ranges(devid)?
                    .into_iter()
                    .find(|&(s, l)| s + l > from)
                    .map(|(s, l)| (s.max(from), s + l - s.max(from)));
                let Some((s, l)) = next else { break };
                let piece = l.min(DEVICE_PIECE);
                trimmed += self.io.devices().discard(devid, s, piece)?;
                from = s + piece;
            }
        }
        Ok(trimmed)
    }

    /// The filesystem's label (the superblock's, without its NUL; empty if none).
    pub fn label(&self) -> Vec<u8> {
        self.superblock().label
    }

    /// Sets the label, committed before this returns (the kernel's
    /// btrfs_ioctl_set_fslabel). EINVAL for a label of 256 bytes or more, or with a NUL.
    pub fn set_label(&self, label: &[u8]) -> Result<()> {
        if label.len() >= LABEL_SIZE || label.contains(&0) {
            return Err(Error::InvalidArgument(format!(
                "a label is at most {} bytes, without NUL",
                LABEL_SIZE - 1
            )));
        }
        self.with_transaction(|txn| {
            txn.new_label = Some(label.to_vec());
            Ok(())
        })
        .map(drop)
    }
}
