//! How many requests of each opcode the kernel sent one mount, over both transports:
//! every message read from /dev/fuse (INIT, FORGET, BATCH_FORGET, INTERRUPT, NOTIFY_REPLY
//! and malformed ones included) and every request a ring entry brings. A relaxed add per
//! request, nothing else on the path. Beside each count, the time the server spent on
//! those requests: from the request's parse to its reply handed to the transport (staged
//! in the ring entry, or written to /dev/fuse), the kernel's side of the round trip not
//! included. Two clock reads and a relaxed add per request.
//!
//! A root caller reads the counts of a running mount with the ioctl
//! [`subvol_ioctl::FUSE_STATS`](crate::subvol_ioctl::FUSE_STATS) on the mount's root,
//! which the transport answers itself (so any server on it answers: oleo and nullfs alike);
//! `oleo mount-stats MNT` prints them, bench/ reads them around each measured phase. The
//! session logs the totals at unmount.

use std::sync::atomic::{AtomicU64, Ordering};

/// Counter slots: opcode `n` below this counts in slot `n`; slot 0 (no opcode is 0)
/// counts the larger ones (CUSE_INIT, opcodes newer than this table).
pub const SLOTS: usize = 64;

/// The per-opcode request counters of one mount, and the nanoseconds spent serving them.
pub struct RequestCounts {
    count: [AtomicU64; SLOTS],
    nanos: [AtomicU64; SLOTS],
}

impl Default for RequestCounts {
    fn default() -> Self {
        RequestCounts {
            count: std::array::from_fn(|_| AtomicU64::new(0)),
            nanos: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

/// The slot an opcode counts in.
pub(crate) fn slot_of(opcode: u32) -> usize {
    usize::try_from(opcode)
        .ok()
        .filter(|&s| s < SLOTS)
        .unwrap_or(0)
}

/// The opcode of a raw message (`fuse_in_header`: len, then opcode); 0 for one too short.
pub(crate) fn opcode_of(msg: &[u8]) -> u32 {
    msg.get(4..8)
        .map_or(0, |b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
}

impl RequestCounts {
    /// One more request with this opcode.
    pub(crate) fn record(&self, opcode: u32) {
        self.count[slot_of(opcode)].fetch_add(1, Ordering::Relaxed);
    }

    /// One more request, its opcode read from the raw message's header; a message too
    /// short for one counts as "other".
    pub(crate) fn record_message(&self, msg: &[u8]) {
        self.record(opcode_of(msg));
    }

    /// A request with this opcode took the server `d` to answer.
    pub(crate) fn record_time(&self, opcode: u32, d: std::time::Duration) {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.nanos[slot_of(opcode)].fetch_add(ns, Ordering::Relaxed);
    }

    /// The counts now, by slot.
    pub fn snapshot(&self) -> [u64; SLOTS] {
        std::array::from_fn(|i| self.count[i].load(Ordering::Relaxed))
    }

    /// The nanoseconds spent on each slot's requests so far.
    pub fn nanos(&self) -> [u64; SLOTS] {
        std::array::from_fn(|i| self.nanos[i].load(Ordering::Relaxed))
    }
}

/// The ioctls' answer (FUSE_STATS: counts; FUSE_STATS_TIME: nanoseconds): every slot as a
/// little-endian u64 ([`SIZE`] bytes).
pub fn to_bytes(counts: &[u64; SLOTS]) -> Vec<u8> {
    counts.iter().flat_map(|c| c.to_le_bytes()).collect()
}

/// Size of the ioctl's answer.
pub const SIZE: usize = SLOTS * 8;

/// Reads the ioctl's answer (missing slots read as 0).
pub fn parse(b: &[u8]) -> [u64; SLOTS] {
    std::array::from_fn(|i| {
        b.get(i * 8..i * 8 + 8)
            .map_or(0, |s| u64::from_le_bytes(s.try_into().unwrap_or([0; 8])))
    })
}

/// The kernel's name of an opcode (`FUSE_` left off), as fuse.h spells it; slot 0 is
/// "OTHER", an opcode this table does not know "OP`n`" (its number).
pub fn opcode_name(opcode: u32) -> std::borrow::Cow<'static, str> {
    let name = match opcode {
        0 => "OTHER",
        1 => "LOOKUP",
        2 => "FORGET",
        3 => "GETATTR",
        4 => "SETATTR",
        5 => "READLINK",
        6 => "SYMLINK",
        8 => "MKNOD",
        9 => "MKDIR",
        10 => "UNLINK",
        11 => "RMDIR",
        12 => "RENAME",
        13 => "LINK",
        14 => "OPEN",
        15 => "READ",
        16 => "WRITE",
        17 => "STATFS",
        18 => "RELEASE",
        20 => "FSYNC",
        21 => "SETXATTR",
        22 => "GETXATTR",
        23 => "LISTXATTR",
        24 => "REMOVEXATTR",
        25 => "FLUSH",
        26 => "INIT",
        27 => "OPENDIR",
        28 => "READDIR",
        29 => "RELEASEDIR",
        30 => "FSYNCDIR",
        31 => "GETLK",
        32 => "SETLK",
        33 => "SETLKW",
        34 => "ACCESS",
        35 => "CREATE",
        36 => "INTERRUPT",
        37 => "BMAP",
        38 => "DESTROY",
        39 => "IOCTL",
        40 => "POLL",
        41 => "NOTIFY_REPLY",
        42 => "BATCH_FORGET",
        43 => "FALLOCATE",
        44 => "READDIRPLUS",
        45 => "RENAME2",
        46 => "LSEEK",
        47 => "COPY_FILE_RANGE",
        48 => "SETUPMAPPING",
        49 => "REMOVEMAPPING",
        50 => "SYNCFS",
        51 => "TMPFILE",
        52 => "STATX",
        53 => "COPY_FILE_RANGE_64",
        n => return format!("OP{n}").into(),
    };
    name.into()
}

/// The non-zero counts as `NAME count` pairs, largest first, and their total: what the
/// session logs at unmount.
pub fn summary(counts: &[u64; SLOTS]) -> String {
    let mut v: Vec<(u64, usize)> = (0..SLOTS)
        .filter(|&i| counts[i] > 0)
        .map(|i| (counts[i], i))
        .collect();
    v.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    let total: u64 = counts.iter().sum();
    let parts: Vec<String> = v
        .iter()
        .map(|&(n, i)| format!("{} {n}", opcode_name(i as u32)))
        .collect();
    format!("{total} ({})", parts.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_go_by_opcode_and_round_trip() {
        let c = RequestCounts::default();
        c.record(35);
        c.record(35);
        c.record(2);
        c.record(4096); // CUSE_INIT: "other"
        let mut msg = vec![0u8; 40];
        msg[4..8].copy_from_slice(&42u32.to_ne_bytes());
        c.record_message(&msg);
        c.record_message(&[1, 2]);
        let s = c.snapshot();
        assert_eq!((s[35], s[2], s[42], s[0]), (2, 1, 1, 2));
        let b = to_bytes(&s);
        assert_eq!(b.len(), SIZE);
        assert_eq!(parse(&b), s);
        assert_eq!(
            summary(&s),
            "6 (OTHER 2, CREATE 2, FORGET 1, BATCH_FORGET 1)"
        );
        assert_eq!(opcode_name(7), "OP7");
        c.record_time(35, std::time::Duration::from_micros(3));
        c.record_time(35, std::time::Duration::from_nanos(500));
        c.record_time(9999, std::time::Duration::from_nanos(7));
        let t = c.nanos();
        assert_eq!((t[35], t[0], t[2]), (3500, 7, 0));
    }
}
