//! `btrfs check`, the judge of every image oleo writes.

use std::path::Path;
use std::process::Command;

/// Runs `btrfs check --readonly` (with `--check-data-csum` when asked). Ok when it exits 0
/// and prints no error, warning or mismatch; Err carries its whole output.
pub fn btrfs_check(image: &Path, data_csum: bool) -> Result<(), String> {
    // btrfs-progs calls a file "mounted" when a loop device's backing file has its device
    // and inode number: a loop device of a deleted image (another test's, still being
    // released after umount) can hold an inode number this image reuses. Wait that out.
    let mut r = check_once(image, data_csum);
    for _ in 0..10 {
        match &r {
            Err(text) if text.contains("is currently mounted") => {
                std::thread::sleep(std::time::Duration::from_millis(500));
                r = check_once(image, data_csum);
            }
            _ => break,
        }
    }
    r
}

fn check_once(image: &Path, data_csum: bool) -> Result<(), String> {
    let mut cmd = Command::new("btrfs");
    cmd.args(["check", "--readonly"]);
    if data_csum {
        cmd.arg("--check-data-csum");
    }
    let out = cmd
        .arg(image)
        .output()
        .map_err(|e| format!("cannot run btrfs check: {e}"))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let bad = text.lines().any(|l| {
        let l = l.to_ascii_lowercase();
        (l.contains("error") && !l.contains("no error"))
            || l.contains("warning")
            || l.contains("mismatch")
            || l.contains("wrong")
    });
    if out.status.success() && !bad {
        Ok(())
    } else {
        Err(text)
    }
}

/// Panics with `btrfs check --readonly --check-data-csum`'s output unless it is clean.
pub fn assert_btrfs_check(image: &Path, when: &str) {
    if let Err(text) = btrfs_check(image, true) {
        panic!("btrfs check after {when}:\n{text}");
    }
}

/// compsize's totals for a path on a kernel btrfs mount: (disk bytes, uncompressed bytes)
/// of its data extents, each extent counted once, inline data included.
pub fn compsize(path: &Path) -> (u64, u64) {
    let out = std::process::Command::new("compsize")
        .arg("-b")
        .arg(path)
        .output()
        .expect("compsize (package btrfs-compsize)");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "compsize {}: {text}", path.display());
    let total = text
        .lines()
        .find(|l| l.starts_with("TOTAL"))
        .unwrap_or_else(|| panic!("compsize {}: no TOTAL in {text}", path.display()));
    let n: Vec<u64> = total
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    (n[0], n[1])
}
