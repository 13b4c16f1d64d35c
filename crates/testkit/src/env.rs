//! What the environment offers: root, loop devices, kernel btrfs, FUSE, tools.
//!
//! Tests that need privileges call [`require_root`] / [`require_fuse`] first and return early
//! when they get `false`. Under `CI=true` a missing requirement panics instead: a test that
//! silently skips in CI proves nothing, so CI must provide everything.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// Tools every image build and kernel mount needs.
pub const ROOT_TOOLS: &[&str] = &[
    "mkfs.btrfs",
    "btrfs",
    "losetup",
    "mount",
    "umount",
    "setfacl",
    "cp",
];

/// Where [`mkfs_btrfs_for`] looks for a second, newer mkfs.btrfs when the one on PATH lacks a
/// feature (Debian 12 ships btrfs-progs 6.2, which cannot make `block-group-tree`). Either set
/// `OLEO_EXTRA_MKFS_BTRFS=/path/to/mkfs.btrfs`, or unpack the bookworm-backports package there:
/// `apt-get download btrfs-progs/bookworm-backports && dpkg-deb -x btrfs-progs_*.deb /opt/btrfs-progs-bpo`.
pub const EXTRA_MKFS_ENV: &str = "OLEO_EXTRA_MKFS_BTRFS";
pub const EXTRA_MKFS_DEFAULT: &str = "/opt/btrfs-progs-bpo/sbin/mkfs.btrfs";

/// True when running under CI (`CI=true` or `CI=1`).
pub fn is_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v.eq_ignore_ascii_case("true") || v == "1")
}

/// Reports a skip: prints a `SKIP:` line and returns false, or panics under CI.
pub fn skip(what: &str, why: &str) -> bool {
    if is_ci() {
        panic!("{what}: cannot run under CI=true (a skip in CI is a failure): {why}");
    }
    eprintln!("SKIP: {what}: {why}");
    false
}

/// Finds an executable on PATH (also the sbin directories, which a non-login PATH may lack).
pub fn find_in_path(tool: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin", "/usr/bin", "/bin"].map(PathBuf::from))
        .map(|d| d.join(tool))
        .find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    p.metadata()
        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

fn kernel_has_fs(name: &str) -> bool {
    std::fs::read_to_string("/proc/filesystems")
        .is_ok_and(|s| s.lines().any(|l| l.split_whitespace().last() == Some(name)))
}

/// True if we are root and have loop devices, kernel btrfs and the tools in [`ROOT_TOOLS`];
/// otherwise prints `SKIP: <what> needs ...` and returns false (panics under CI).
pub fn require_root(what: &str) -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return skip(what, "needs root (loop devices, mount, mkfs.btrfs)");
    }
    if !Path::new("/dev/loop-control").exists() {
        return skip(what, "needs loop devices (/dev/loop-control missing)");
    }
    if !kernel_has_fs("btrfs") {
        // The module may simply not be loaded yet.
        let _ = Command::new("modprobe").arg("btrfs").status();
        if !kernel_has_fs("btrfs") {
            return skip(what, "needs kernel btrfs (not in /proc/filesystems)");
        }
    }
    for t in ROOT_TOOLS {
        if find_in_path(t).is_none() {
            return skip(
                what,
                &format!("needs `{t}` (apt-get install btrfs-progs acl)"),
            );
        }
    }
    true
}

/// True if FUSE can be used: `/dev/fuse`, `fusermount3` and kernel fuse support.
/// Otherwise prints `SKIP:` and returns false (panics under CI).
pub fn require_fuse(what: &str) -> bool {
    if !Path::new("/dev/fuse").exists() {
        return skip(what, "needs FUSE (/dev/fuse missing)");
    }
    if find_in_path("fusermount3").is_none() {
        return skip(
            what,
            "needs FUSE (`fusermount3` missing: apt-get install fuse3)",
        );
    }
    if !kernel_has_fs("fuse") {
        let _ = Command::new("modprobe").arg("fuse").status();
        if !kernel_has_fs("fuse") {
            return skip(what, "needs FUSE (kernel fuse not in /proc/filesystems)");
        }
    }
    true
}

/// Features (as `mkfs.btrfs -O` names) that `mkfs` at this path can create.
fn mkfs_features(mkfs: &Path) -> Vec<String> {
    let Ok(out) = Command::new(mkfs).args(["-O", "list-all"]).output() else {
        return Vec::new();
    };
    // progs prints the list on stderr (older) or stdout (newer); take both.
    let text =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    text.lines()
        .filter_map(|l| {
            let (name, rest) = l.split_once(char::is_whitespace)?;
            rest.trim_start().starts_with('-').then(|| name.to_string())
        })
        .collect()
}

/// The candidate mkfs.btrfs binaries, in order of preference, with their feature lists.
fn mkfs_candidates() -> &'static [(PathBuf, Vec<String>)] {
    static C: OnceLock<Vec<(PathBuf, Vec<String>)>> = OnceLock::new();
    C.get_or_init(|| {
        let mut v: Vec<PathBuf> = Vec::new();
        // The distribution's mkfs comes first: it is the baseline the format notes describe.
        v.extend(find_in_path("mkfs.btrfs"));
        if let Some(p) = std::env::var_os(EXTRA_MKFS_ENV) {
            v.push(PathBuf::from(p));
        }
        v.push(PathBuf::from(EXTRA_MKFS_DEFAULT));
        v.dedup();
        v.into_iter()
            .filter(|p| is_executable(p))
            .map(|p| {
                let f = mkfs_features(&p);
                (p, f)
            })
            .collect()
    })
}

/// The first mkfs.btrfs that can create every feature in `features` (names as in `-O`,
/// a leading `^` is ignored since turning a feature off needs only that it is known).
pub fn mkfs_btrfs_for(features: &[&str]) -> Option<PathBuf> {
    mkfs_candidates()
        .iter()
        .find(|(_, have)| {
            features.iter().all(|f| {
                let f = f.trim_start_matches('^');
                have.iter().any(|h| h == f)
            })
        })
        .map(|(p, _)| p.clone())
}

/// Like [`mkfs_btrfs_for`], but reports a skip (panic under CI) when no mkfs.btrfs has them.
pub fn require_mkfs_features(what: &str, features: &[&str]) -> bool {
    mkfs_btrfs_for(features).is_some()
        || skip(
            what,
            &format!(
                "no mkfs.btrfs here supports {features:?}; set {EXTRA_MKFS_ENV} to a newer one \
                 or unpack btrfs-progs from bookworm-backports into /opt/btrfs-progs-bpo"
            ),
        )
}

/// The `-O` features named in a mkfs argument list (`-O a,b`, `-Oa`, `--features a`).
pub fn features_in_args(args: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let list = if a == "-O" || a == "--features" {
            it.next().cloned()
        } else {
            a.strip_prefix("--features=")
                .or_else(|| a.strip_prefix("-O"))
                .map(str::to_string)
        };
        if let Some(l) = list {
            out.extend(l.split(',').filter(|s| !s.is_empty()).map(str::to_string));
        }
    }
    out
}

/// A seed for a test: `OLEO_TEST_SEED` if set (to replay or explore), else `default`.
pub fn seed(default: u64) -> u64 {
    match std::env::var("OLEO_TEST_SEED") {
        Ok(s) => {
            let s = s.trim();
            let parsed = match s.strip_prefix("0x") {
                Some(hex) => u64::from_str_radix(hex, 16),
                None => s.parse(),
            };
            parsed.unwrap_or_else(|_| panic!("OLEO_TEST_SEED={s:?} is not a number"))
        }
        Err(_) => default,
    }
}

/// Whether a test that mounts through FUSE can run: root and /dev/fuse (see
/// [`require_root`], [`require_fuse`]).
pub fn require_fuse_mount(what: &str) -> bool {
    require_root(what) && require_fuse(what)
}

/// How many descriptors of this process are open on `path` (as /proc/self/fd names them:
/// pass a canonical path). Tests that a file is let go of: a claim, a thread's copy.
pub fn open_descriptors(path: &Path) -> usize {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| {
            d.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
                .filter(|t| t == path)
                .count()
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn features_are_found_in_all_spellings() {
        let args: Vec<String> = [
            "--csum",
            "xxhash",
            "-O",
            "^no-holes,block-group-tree",
            "-Oextref",
            "--features=squota",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert_eq!(
            features_in_args(&args),
            ["^no-holes", "block-group-tree", "extref", "squota"]
        );
    }
}
