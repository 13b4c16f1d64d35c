//! Every damaged image of btrfs-progs' fsck test set (../shared/test-images/btrfs-progs-fsck)
//! is opened with the library and, when it opens, walked completely. Each image must be
//! refused with an error or walked (errors allowed); a panic or a walk longer than the time
//! bound fails the test. All images run even when one fails, and each gets a report line.
//!
//! The images are decompressed into a scratch directory; the originals are only ever opened
//! read-only, and never mounted with the kernel.

mod common;

use common::{check_image, check_image_rescue, ImageResult, Outcome};
use oleo_testkit::TempDir;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const PER_IMAGE: Duration = Duration::from_secs(20);

fn files_under(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    let mut v: Vec<PathBuf> = rd.filter_map(|e| e.ok()).map(|e| e.path()).collect();
    v.sort();
    for p in v {
        if p.is_dir() {
            files_under(&p, out);
        } else if p.is_file() {
            out.push(p);
        }
    }
}

/// First bytes of a `btrfs-image` metadata dump (most images of the set): the dump is
/// opened as it is (and refused) and also restored with `btrfs-image -r` into a raw image.
const BTRFS_IMAGE_MAGIC: [u8; 8] = 0xbd5c_25e2_7295_668b_u64.to_le_bytes();

fn run(cmd: &mut Command) -> Result<(), String> {
    let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{cmd:?}: {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn is_btrfs_image_dump(p: &Path) -> bool {
    let mut magic = [0u8; 8];
    std::fs::File::open(p)
        .and_then(|f| std::os::unix::fs::FileExt::read_exact_at(&f, &mut magic, 0))
        .is_ok()
        && magic == BTRFS_IMAGE_MAGIC
}

/// The images an entry of the set stands for, as (label suffix, path): decompressed into
/// `scratch` when needed, and restored from btrfs-image dumps when `btrfs-image` exists.
fn prepare(src: &Path, scratch: &Path, restore: bool) -> Result<Vec<(String, PathBuf)>, String> {
    let name = src.file_name().unwrap().to_string_lossy().into_owned();
    let mut plain: Vec<PathBuf> = Vec::new();
    if name.ends_with(".tar.xz") {
        let dir = scratch.join(name.trim_end_matches(".tar.xz"));
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        run(Command::new("tar").arg("-xJf").arg(src).arg("-C").arg(&dir))?;
        files_under(&dir, &mut plain);
    } else if let Some(stem) = name.strip_suffix(".xz") {
        let dst = scratch.join(stem);
        let f = std::fs::File::create(&dst).map_err(|e| e.to_string())?;
        run(Command::new("xz").arg("-dc").arg(src).stdout(f))?;
        plain.push(dst);
    } else {
        // Raw files are opened in place: oleo opens read-only and never writes.
        plain.push(src.to_path_buf());
    }
    let mut out = Vec::new();
    for (i, p) in plain.into_iter().enumerate() {
        let label = p
            .strip_prefix(scratch)
            .map(|r| format!(":{}", r.display()))
            .unwrap_or_default();
        if restore && is_btrfs_image_dump(&p) {
            let raw = scratch.join(format!("restored-{i}.raw"));
            match run(Command::new("btrfs-image").arg("-r").arg(&p).arg(&raw)) {
                Ok(()) => out.push((format!("{label} (btrfs-image -r)"), raw)),
                Err(e) => println!(
                    "{}{label}: btrfs-image -r failed, dump only: {e}",
                    src.display()
                ),
            }
        }
        out.push((label, p));
    }
    Ok(out)
}

#[test]
fn btrfs_progs_fsck_images_never_panic_or_hang() {
    let dir = oleo_testkit::damage::fsck_image_dir();
    let mut sources = Vec::new();
    files_under(&dir, &mut sources);
    sources.retain(|p| !p.extension().is_some_and(|e| e == "txt" || e == "md"));
    if sources.is_empty() {
        let msg = format!("no images under {}", dir.display());
        if oleo_testkit::is_ci() {
            panic!("{msg} (CI=true: the image set must be present)");
        }
        eprintln!("SKIP: hostile images: {msg}");
        return;
    }
    for tool in ["xz", "tar"] {
        if Command::new(tool).arg("--version").output().is_err() {
            if oleo_testkit::is_ci() {
                panic!("`{tool}` is missing (apt-get install xz-utils tar)");
            }
            eprintln!("SKIP: hostile images: `{tool}` is missing (apt-get install xz-utils)");
            return;
        }
    }
    // Most of the set are btrfs-image dumps; without btrfs-image only their refusal is tested.
    let restore = Command::new("btrfs-image").output().is_ok();
    if !restore {
        if oleo_testkit::is_ci() {
            panic!("`btrfs-image` is missing (apt-get install btrfs-progs)");
        }
        eprintln!("SKIP: restoring btrfs-image dumps: `btrfs-image` is missing (apt-get install btrfs-progs)");
    }
    let scratch = TempDir::new("hostile-images").expect("scratch dir");
    let start = Instant::now();
    let (mut refused, mut walked, mut failures) = (0, 0, Vec::new());
    let mut rescue_walked = 0;
    for (n, src) in sources.iter().enumerate() {
        let rel = src.strip_prefix(&dir).unwrap_or(src).display().to_string();
        let sub = scratch.join(format!("{n}"));
        std::fs::create_dir_all(&sub).unwrap();
        let images = match prepare(src, &sub, restore) {
            Ok(v) => v,
            Err(e) => {
                failures.push(format!("{rel}: cannot decompress: {e}"));
                continue;
            }
        };
        for (suffix, img) in images {
            let label = format!("{rel}{suffix}");
            let t = Instant::now();
            let line = match check_image(&label, &img, PER_IMAGE) {
                Outcome::Done(r) => {
                    match &r {
                        ImageResult::Refused(_) => refused += 1,
                        ImageResult::Walked(_) => walked += 1,
                    }
                    r.describe()
                }
                Outcome::Panicked(p) => {
                    failures.push(format!("{label}: PANIC: {p}"));
                    format!("PANIC: {p}")
                }
                Outcome::Hung(d) => {
                    failures.push(format!("{label}: HANG: still running after {d:?}"));
                    format!("HANG after {d:?}")
                }
            };
            println!("{label}: {line} [{:.0?}]", t.elapsed());
            // The same image opened with every rescue option: never a panic or a hang,
            // and never refused where the plain open walked it.
            let t = Instant::now();
            let line = match check_image_rescue(&label, &img, PER_IMAGE) {
                Outcome::Done(r) => {
                    if let ImageResult::Walked(_) = r {
                        rescue_walked += 1;
                    }
                    r.describe()
                }
                Outcome::Panicked(p) => {
                    failures.push(format!("{label} (rescue): PANIC: {p}"));
                    format!("PANIC: {p}")
                }
                Outcome::Hung(d) => {
                    failures.push(format!("{label} (rescue): HANG: still running after {d:?}"));
                    format!("HANG after {d:?}")
                }
            };
            println!(
                "{label} (rescue=all,usebackuproot): {line} [{:.0?}]",
                t.elapsed()
            );
        }
        // Decompressed copies can be large: drop each once used.
        let _ = std::fs::remove_dir_all(&sub);
    }
    println!(
        "{} sources: {walked} walked, {refused} refused ({rescue_walked} walked with every rescue option), {} failures, in {:.1?}",
        sources.len(),
        failures.len(),
        start.elapsed()
    );
    assert!(
        rescue_walked >= walked,
        "rescue options walked {rescue_walked} images, the plain open {walked}"
    );
    assert!(
        failures.is_empty(),
        "hostile images that panicked or hung:\n{}",
        failures.join("\n")
    );
}
