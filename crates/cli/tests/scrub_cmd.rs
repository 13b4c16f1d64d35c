//! `oleo scrub` and `oleo device stats`, on an image set and through a mount's server: a
//! RAID1 set the kernel made and filled, one copy of some data sectors damaged on the raw
//! image. The report says what was found and repaired (as `btrfs scrub` prints it), the
//! counters persist (DEV_STATS), `btrfs check --check-data-csum` is clean afterwards, and
//! a mount keeps serving while its server scrubs.
//!
//! Needs root, FUSE, loop devices, kernel btrfs and btrfs-progs (a skip elsewhere, a
//! failure under CI=true).

use oleo_testkit::multi_device as md;
use oleo_testkit::{require_fuse_mount, TempDir};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const OLEO: &str = env!("CARGO_BIN_EXE_oleo");
const MIB: u64 = 1 << 20;

fn oleo(args: &[&str]) -> Output {
    Command::new(OLEO)
        .args(args)
        .env(
            "XDG_STATE_HOME",
            std::env::temp_dir().join("oleo-scrub-cmd-state"),
        )
        .output()
        .unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The line of a scrub report that starts with `field`.
fn line<'a>(report: &'a str, field: &str) -> &'a str {
    report
        .lines()
        .find(|l| l.starts_with(field))
        .unwrap_or_else(|| panic!("no {field:?} in {report}"))
}

/// A kernel-filled RAID1 set with `sectors` data sectors of its largest pattern file
/// damaged in the copy on devid 1, and the "Total to scrub" line btrfs-progs printed for
/// it (a scrub by the kernel, before the damage).
fn damaged_set(dir: &Path, sectors: usize) -> (Vec<PathBuf>, md::Manifest, String) {
    let images = md::mkfs_set(dir, "s", 2, 256 * MIB, "raid1", "raid1").expect("mkfs");
    let k = md::KernelSet::mount(&images, &[], &dir.join("kmnt"), &[]).expect("kernel mount");
    let manifest = md::fill(k.root(), 3).expect("fill");
    let big = md::PATTERN_FILES.iter().max_by_key(|f| f.2).unwrap();
    let ext = md::file_logical_extents(&k.root().join(big.1)).expect("fiemap");
    // The kernel's scrub may allocate a chunk while it marks block groups read-only: the
    // second one reports the set as it stays.
    let mut total = String::new();
    for _ in 0..2 {
        let out = Command::new("btrfs")
            .args(["scrub", "start", "-B"])
            .arg(k.root())
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "btrfs scrub: {said}");
        total = line(&said, "Total to scrub:").to_string();
    }
    k.unmount().unwrap();
    let chunks = md::chunk_map_all(&images).unwrap();
    let (_, phys) = md::copies(&chunks, ext[0].1 + 8192)
        .into_iter()
        .find(|c| c.0 == 1)
        .unwrap();
    md::overwrite(&images[0], phys, sectors * 4096, 0x77).unwrap();
    (images, manifest, total)
}

fn args_with_images<'a>(verb: &[&'a str], images: &'a [String]) -> Vec<&'a str> {
    let mut v: Vec<&str> = verb.to_vec();
    for i in images {
        v.push("--image");
        v.push(i);
    }
    v
}

#[test]
fn scrub_of_an_image_set_repairs_and_reports() {
    if !require_fuse_mount("scrub_of_an_image_set_repairs_and_reports") {
        return;
    }
    let dir = TempDir::new("scrub-cmd-image").unwrap();
    let (images, _, progs_total) = damaged_set(dir.path(), 3);
    let names: Vec<String> = images.iter().map(|p| p.display().to_string()).collect();
    let ro = oleo(&args_with_images(&["scrub", "start", "-r", "-v"], &names));
    let t = text(&ro);
    assert!(ro.status.success(), "{t}");
    assert!(t.contains("Error summary:    csum=3"), "{t}");
    // What a good copy could fix counts as corrected, as with the kernel's `scrub -r`.
    assert!(t.contains("  Corrected:      3"), "{t}");
    // -v: each bad range on the terminal too.
    assert!(t.contains("checksum mismatch"), "{t}");
    let fix = oleo(&args_with_images(&["scrub", "start"], &names));
    let t = text(&fix);
    assert!(fix.status.success(), "{t}");
    assert!(t.contains("scrub done for "), "{t}");
    assert!(
        t.contains("Error summary:    csum=3") && t.contains("  Corrected:      3"),
        "{t}"
    );
    // The summary only, as btrfs-progs prints it: the details are the log's.
    let out = String::from_utf8_lossy(&fix.stdout);
    let fields = [
        "scrub done for ",
        "Scrub started:",
        "Status:",
        "Duration:",
        "Total to scrub:",
        "Rate:",
        "Error summary:",
        "  Corrected:",
        "  Uncorrectable:",
        "  Unverified:",
    ];
    assert_eq!(out.lines().count(), fields.len(), "{out}");
    for (l, f) in out.lines().zip(fields) {
        assert!(l.starts_with(f), "{l:?} where {f:?} belongs:\n{out}");
    }
    assert_eq!(
        String::from_utf8_lossy(&fix.stderr).trim(),
        "WARNING: errors detected during scrubbing, corrected"
    );
    // Every copy counts: the same total as btrfs-progs' for the set.
    assert_eq!(line(&out, "Total to scrub:"), progs_total, "{out}");
    let again = oleo(&args_with_images(&["scrub", "start"], &names));
    assert!(
        text(&again).contains("Error summary:    no errors found"),
        "{}",
        text(&again)
    );
    let status = oleo(&args_with_images(&["scrub", "status"], &names));
    assert!(
        text(&status).contains("Status:           finished"),
        "{}",
        text(&status)
    );
    // The repairing scrub counted the bad copy against devid 1 (the read-only one could not
    // write its counters).
    let stats = oleo(&args_with_images(&["device", "stats", "-c"], &names));
    assert_eq!(stats.status.code(), Some(64), "{}", text(&stats));
    let line = format!("[{}].corruption_errs  3", names[0]);
    assert!(text(&stats).contains(&line), "{}", text(&stats));
    let zero = oleo(&args_with_images(&["device", "stats", "-z"], &names));
    assert!(zero.status.success(), "{}", text(&zero));
    let stats = oleo(&args_with_images(&["device", "stats", "-c"], &names));
    assert_eq!(stats.status.code(), Some(0), "{}", text(&stats));
    let check = md::offline_check(&images).unwrap();
    assert!(check.clean, "{}", check.output);
}

#[test]
fn scrub_through_a_mount() {
    if !require_fuse_mount("scrub_through_a_mount") {
        return;
    }
    let dir = TempDir::new("scrub-cmd-mount").unwrap();
    let (images, manifest, progs_total) = damaged_set(dir.path(), 2);
    let mnt = dir.join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let mut args = vec!["mount".to_string()];
    args.extend(images.iter().map(|p| p.display().to_string()));
    args.push(mnt.display().to_string());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let m = oleo(&args);
    assert!(m.status.success(), "{}", text(&m));
    let mp = mnt.display().to_string();
    let r = std::panic::catch_unwind(|| {
        let s = oleo(&["scrub", "start", "-B", &mp]);
        let t = text(&s);
        assert!(s.status.success(), "{t}");
        assert!(
            t.contains("Error summary:    csum=2") && t.contains("  Corrected:      2"),
            "{t}"
        );
        assert_eq!(line(&t, "Total to scrub:"), progs_total, "{t}");
        let st = oleo(&["scrub", "status", "-d", &mp]);
        let t = text(&st);
        assert!(
            t.contains("Status:           finished") && t.contains("(id 2)"),
            "{t}"
        );
        let stats = oleo(&["device", "stats", &mp]);
        assert!(
            text(&stats).contains("corruption_errs  2"),
            "{}",
            text(&stats)
        );
        // The mount serves while scrubbing in the background.
        let bg = oleo(&["scrub", "start", &mp]);
        assert!(bg.status.success(), "{}", text(&bg));
        manifest
            .check_dir(&mnt)
            .expect("contents through the mount");
        let w = mnt.join("written-during-scrub");
        std::fs::write(&w, b"still serving").unwrap();
        assert_eq!(std::fs::read(&w).unwrap(), b"still serving");
        for _ in 0..200 {
            if text(&oleo(&["scrub", "status", &mp])).contains("Status:           finished") {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        panic!("the background scrub did not finish");
    });
    let u = Command::new("umount").arg(&mnt).status().unwrap();
    assert!(u.success());
    if let Err(e) = r {
        std::panic::resume_unwind(e);
    }
    let check = md::offline_check(&images).unwrap();
    assert!(check.clean, "{}", check.output);
}

/// Both copies of some sectors bad: the report counts them uncorrectable and the exit
/// status is 3, as btrfs scrub's, with its error line.
#[test]
fn uncorrectable_errors_exit_3() {
    if !require_fuse_mount("uncorrectable_errors_exit_3") {
        return;
    }
    let dir = TempDir::new("scrub-cmd-uncorrectable").unwrap();
    let images = md::mkfs_set(dir.path(), "u", 2, 256 * MIB, "raid1", "raid1").expect("mkfs");
    let k = md::KernelSet::mount(&images, &[], &dir.join("kmnt"), &[]).expect("kernel mount");
    md::fill(k.root(), 5).expect("fill");
    let big = md::PATTERN_FILES.iter().max_by_key(|f| f.2).unwrap();
    let ext = md::file_logical_extents(&k.root().join(big.1)).expect("fiemap");
    k.unmount().unwrap();
    let chunks = md::chunk_map_all(&images).unwrap();
    for (devid, phys) in md::copies(&chunks, ext[0].1 + 8192) {
        md::overwrite(&images[devid as usize - 1], phys, 2 * 4096, 0x55).unwrap();
    }
    let names: Vec<String> = images.iter().map(|p| p.display().to_string()).collect();
    let out = oleo(&args_with_images(&["scrub", "start"], &names));
    let t = text(&out);
    assert_eq!(out.status.code(), Some(3), "{t}");
    assert!(t.contains("  Uncorrectable:  4"), "{t}");
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .trim()
            .starts_with("ERROR: there are uncorrectable errors"),
        "{t}"
    );
}
