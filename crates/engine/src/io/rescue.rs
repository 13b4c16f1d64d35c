//! The kernel's `rescue=` mount options, and the log of what a rescue open went around.
//!
//! Every option makes the open read-only. "Ignore" here means: verify, try every copy,
//! then go on and say so. A good copy is always preferred, and each thing skipped gets
//! one log line (`rescue: <option>: <what>`), once per address, so a hostile image
//! cannot flood the log.

use parking_lot::Mutex;
use std::collections::HashSet;

/// The rescue options of an open (`-o rescue=a:b`, `-o sb=N`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Rescue {
    /// When the root tree (or a tree every mount needs) is unreadable, open from the
    /// superblock's backup roots, newest first.
    pub use_backup_root: bool,
    /// A global tree (extent, csum, device, free space, uuid, quota, ...) that cannot be
    /// read is left out, and so is an unreadable block inside any tree: a listing shows
    /// what the rest of the tree holds.
    pub ignore_bad_roots: bool,
    /// Data whose checksum fails on every copy is returned unverified (the first copy).
    pub ignore_data_csums: bool,
    /// A tree block whose checksum fails on every copy is used if it passes every other
    /// check.
    pub ignore_meta_csums: bool,
    /// Superblock flags oleo does not know are logged, not refused.
    pub ignore_super_flags: bool,
    /// Read this superblock copy (0, 1 or 2) only (oleo's `sb=N`, like `btrfs restore -u`).
    pub super_copy: Option<usize>,
    /// Open from this root tree block instead of the superblock's: an older root, as a
    /// backup slot or a scan of the metadata chunks (`oleo restore --list-roots`) finds.
    pub tree_root: Option<u64>,
}

/// The names `rescue=` takes, and what each sets. `all` is the kernel's set: everything
/// but usebackuproot.
const NAMES: &[(&str, &str)] = &[
    ("usebackuproot", "usebackuproot"),
    ("ignorebadroots", "ignorebadroots"),
    ("ibadroots", "ignorebadroots"),
    ("ignoredatacsums", "ignoredatacsums"),
    ("idatacsums", "ignoredatacsums"),
    ("ignoremetacsums", "ignoremetacsums"),
    ("imetacsums", "ignoremetacsums"),
    ("ignoresuperflags", "ignoresuperflags"),
    ("isuperflags", "ignoresuperflags"),
];

impl Rescue {
    /// True when any option is set: the open must be read-only.
    pub fn any(&self) -> bool {
        *self != Rescue::default()
    }

    /// Adds one `rescue=` value (`a:b:c`). Returns whether `nologreplay` was among them
    /// (the log replay is the open's own option).
    pub fn add(&mut self, value: &str) -> Result<bool, String> {
        let mut nologreplay = false;
        for name in value.split(':').filter(|n| !n.is_empty()) {
            match name {
                "nologreplay" => nologreplay = true,
                "all" => {
                    self.ignore_bad_roots = true;
                    self.ignore_data_csums = true;
                    self.ignore_meta_csums = true;
                    self.ignore_super_flags = true;
                    nologreplay = true;
                }
                _ => match NAMES.iter().find(|(n, _)| *n == name) {
                    Some((_, "usebackuproot")) => self.use_backup_root = true,
                    Some((_, "ignorebadroots")) => self.ignore_bad_roots = true,
                    Some((_, "ignoredatacsums")) => self.ignore_data_csums = true,
                    Some((_, "ignoremetacsums")) => self.ignore_meta_csums = true,
                    Some(_) => self.ignore_super_flags = true,
                    None => {
                        return Err(format!(
                            "rescue={name}: not a rescue option (usebackuproot, nologreplay, \
                             ignorebadroots, ignoredatacsums, ignoremetacsums, \
                             ignoresuperflags, all)"
                        ))
                    }
                },
            }
        }
        Ok(nologreplay)
    }

    /// The options set, as /proc/mounts shows them (`usebackuproot:ignorebadroots`).
    pub fn names(&self) -> Vec<&'static str> {
        [
            (self.use_backup_root, "usebackuproot"),
            (self.ignore_bad_roots, "ignorebadroots"),
            (self.ignore_data_csums, "ignoredatacsums"),
            (self.ignore_meta_csums, "ignoremetacsums"),
            (self.ignore_super_flags, "ignoresuperflags"),
        ]
        .into_iter()
        .filter_map(|(on, n)| on.then_some(n))
        .collect()
    }
}

/// Lines kept before the log only counts.
const MAX_LINES: usize = 10_000;

/// What a rescue open went around: one line per (option, address), then a count.
#[derive(Default)]
pub struct SkipLog {
    seen: Mutex<(HashSet<(&'static str, u64)>, u64)>,
}

impl SkipLog {
    /// Logs `what` for `option` at `at`, unless already logged.
    pub fn note(&self, option: &'static str, at: u64, what: impl FnOnce() -> String) {
        let mut g = self.seen.lock();
        g.1 += 1;
        if g.0.len() < MAX_LINES && g.0.insert((option, at)) {
            log::warn!("rescue: {option}: {}", what());
        }
    }

    /// How many things were skipped (every time, not only the first).
    pub fn count(&self) -> u64 {
        self.seen.lock().1
    }

    /// The distinct places skipped, up to the cap.
    pub fn places(&self) -> usize {
        self.seen.lock().0.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_is_the_kernels_set_without_usebackuproot() {
        let mut r = Rescue::default();
        assert!(r.add("all").unwrap());
        assert!(!r.use_backup_root);
        assert!(r.ignore_bad_roots && r.ignore_data_csums && r.ignore_meta_csums);
        let mut s = Rescue::default();
        assert!(!s.add("usebackuproot:ibadroots").unwrap());
        assert_eq!(s.names(), ["usebackuproot", "ignorebadroots"]);
        assert!(Rescue::default().add("bogus").is_err());
    }

    #[test]
    fn a_place_is_logged_once_and_counted_always() {
        let log = SkipLog::default();
        for _ in 0..3 {
            log.note("ignorebadroots", 4096, || "x".into());
        }
        log.note("ignorebadroots", 8192, || "y".into());
        assert_eq!((log.count(), log.places()), (4, 2));
    }
}
