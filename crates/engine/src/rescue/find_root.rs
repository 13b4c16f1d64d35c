//! btrfs-find-root: the roots of older generations, found by reading every block of the
//! metadata chunks. Copy-on-write leaves the blocks of earlier commits where they were until
//! their space is used again, so an older root can stand in for one whose blocks are lost.

use crate::io::disk_io::DiskIo;
use oleo_format::items::block_group as bg;
use oleo_format::superblock::Superblock;
use oleo_format::tree_block::{Header, HEADER_SIZE, MAX_LEVEL};
use std::collections::BTreeMap;

/// A block that was the root of its tree in the generation that wrote it: of the verified
/// blocks of one tree and one generation, those of the highest level (several when the
/// root was written out and copied again within the transaction).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RootCandidate {
    /// The tree (the block header's owner).
    pub owner: u64,
    /// Logical address.
    pub bytenr: u64,
    /// The transaction that wrote it.
    pub generation: u64,
    /// Its level.
    pub level: u8,
}

/// Every root candidate of every tree, newest generation first. Blocks are taken only when
/// their header names this filesystem and their address, and their checksum holds on some
/// copy; nothing is written.
pub(crate) fn scan(io: &DiskIo, sb: &Superblock) -> Vec<RootCandidate> {
    // (owner, generation) -> (level, blocks at that level)
    let mut best: BTreeMap<(u64, u64), (u8, Vec<u64>)> = BTreeMap::new();
    each_block(io, sb, &mut |bytenr, h, _| {
        let e = best
            .entry((h.owner, h.generation))
            .or_insert((h.level, Vec::new()));
        if h.level > e.0 {
            *e = (h.level, Vec::new());
        }
        if h.level == e.0 {
            e.1.push(bytenr);
        }
    });
    let mut out: Vec<RootCandidate> = best
        .into_iter()
        .flat_map(|((owner, generation), (level, blocks))| {
            blocks.into_iter().map(move |bytenr| RootCandidate {
                owner,
                bytenr,
                generation,
                level,
            })
        })
        .collect();
    // A leaf written out in the middle of a transaction is copied again when changed after
    // (one generation, several blocks of one level): allocation moves forward, so the
    // highest address is most likely the generation's last state.
    out.sort_by_key(|c| {
        (
            std::cmp::Reverse(c.generation),
            c.owner,
            std::cmp::Reverse(c.bytenr),
        )
    });
    out
}

/// Calls `f` with every block of the metadata (and system) chunks that passes the full tree
/// block check (checksum, address, fsid, structure) on some copy, in address order.
pub(crate) fn each_block(io: &DiskIo, sb: &Superblock, f: &mut dyn FnMut(u64, &Header, &[u8])) {
    let nodesize = u64::from(sb.nodesize);
    let fsid = sb.metadata_fsid();
    let ranges: Vec<(u64, u64)> = io
        .chunks()
        .chunks()
        .filter(|(_, c)| c.chunk_type & (bg::METADATA | bg::SYSTEM) != 0)
        .map(|(&start, c)| (start, c.length))
        .collect();
    let mut head = vec![0u8; HEADER_SIZE];
    // A hostile chunk tree may claim chunks far larger than the device: no more is read
    // than the device holds (four times, for the copies of DUP and RAID1C4).
    let device = io.devices().primary().size();
    let mut budget = device.saturating_mul(4);
    for (start, length) in ranges {
        let length = length.min(device).min(budget);
        budget -= length;
        let end = start.saturating_add(length);
        let mut at = start.next_multiple_of(nodesize.max(1));
        while at.saturating_add(nodesize) <= end {
            let bytenr = at;
            at = at.saturating_add(nodesize);
            // A cheap look at the header first: most of the space is free or foreign.
            let plausible = (0..io.num_mirrors(bytenr)).any(|m| {
                io.read_logical(bytenr, &mut head, m).is_ok()
                    && Header::parse(&head)
                        .is_ok_and(|h| h.bytenr == bytenr && h.fsid == fsid && h.level < MAX_LEVEL)
            });
            if !plausible {
                continue;
            }
            let Ok(block) = io.read_tree_block(bytenr, None, None, None) else {
                continue;
            };
            let Ok(h) = Header::parse(&block) else {
                continue;
            };
            f(bytenr, &h, &block);
        }
    }
}
