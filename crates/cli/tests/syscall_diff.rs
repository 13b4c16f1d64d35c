//! A differential test at the system-call level through the mount. Seeded random sequences
//! of the calls a program makes (testkit's `syscalls`: open with O_TRUNC, O_APPEND,
//! O_CREAT|O_EXCL, O_DIRECT (4 KiB aligned), O_SYNC/O_DSYNC, O_TMPFILE and linkat; write,
//! pwrite(v), pwritev2 flags, truncate/ftruncate, every fallocate mode, copy_file_range, mmap
//! writes with msync, fsync/fdatasync; renames with each flag, link, unlink, mkdir, rmdir,
//! symlink, mknod; xattrs and POSIX ACLs, chmod, chown, utimensat, as root and, on a thread
//! with its own credentials, as an unprivileged user) run over a table of open descriptors
//! on an oleo mount and on a kernel btrfs mount of an image made with the same mkfs options
//! and mount options: every call must give the same result or errno. Then the trees are
//! compared (contents, stat fields, every xattr, links) while mounted, after closing every
//! descriptor, after unmounting (`btrfs check --check-data-csum`) and mounting with oleo
//! again, and by the kernel; oleo's own view while mounted and after the remount (and the
//! kernel's view of the same image) must agree on every stat field that lives on disk, inode
//! numbers, mtime and ctime included, which a kernel cache cannot hide.
//!
//! Crash states: after some fsyncs a copy of oleo's image is taken (the state of a crash
//! right then, nothing lost); `btrfs check` must pass on it before and after the kernel
//! replays its log tree, and the fsynced file must have the reference's contents after
//! oleo's replay and after the kernel's.
//!
//! One difference is FUSE's, not oleo's (`fuse_stamped`): tolerated (made equal) and
//! counted in the summary.
//!
//! `OLEO_TEST_SEEDS=N` runs N seeds per configuration, `OLEO_TEST_SEED=S` replays one,
//! `OLEO_SYSCALL_STEPS=N` sets the steps per seed (1500), `OLEO_SYSCALL_TRACE=1` prints every
//! step and its result, `OLEO_KEEP_CRASH=FILE` keeps a copy of each crash state (the last
//! one checked is the one that failed) for `btrfs inspect-internal dump-tree`.

use oleo_testkit::ops::{copy_xattr, seeds};
use oleo_testkit::syscalls::{
    as_user, capture, diff_same_fs, diff_trees_except, Call, Gen, Node, Side, Step, NOT_MADE,
};
use oleo_testkit::*;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

const OLEO: &str = env!("CARGO_BIN_EXE_oleo");

fn show(r: &Result<u64, i32>) -> String {
    match r {
        Ok(v) => format!("Ok({v:#x})"),
        Err(NOT_MADE) => "not made (a device node, fifo or socket)".to_string(),
        Err(e) => format!("Err({e}: {})", std::io::Error::from_raw_os_error(*e)),
    }
}

fn assert_none(diffs: Vec<String>, context: &str) {
    oleo_testkit::ops::assert_no_differences(&diffs, context);
}

/// Not a bug: kernel btrfs returns ENOSPC for a large xattr value when the leaf that holds
/// the inode's items has no room left, which depends on each filesystem's tree layout.
const XATTR_LEAF_FULL: &str =
    "setxattr of a large value: ENOSPC on kernel btrfs only (its leaf was full)";

/// Not oleo's: FUSE's fallocate calls file_modified() in the kernel before it asks us,
/// even for a hole punched where there is only a hole, where kernel btrfs changes nothing:
/// it stamps mtime and ctime, and asks us to drop setuid/setgid for a caller without
/// CAP_FSETID. The reference's explicit mtime and its mode are put back on oleo's file.
fn fuse_stamped(
    step: &Step,
    want: &Result<u64, i32>,
    reference: &Side,
    oleo: &Side,
) -> Option<&'static str> {
    if want.is_err() {
        return None;
    }
    let Call::Fallocate { slot, mode, .. } = &step.call else {
        return None;
    };
    let (r, o) = (reference.fstat(*slot)?, oleo.fstat(*slot)?);
    if mode & libc::FALLOC_FL_PUNCH_HOLE != 0
        && r.st_mtime_nsec == 7
        && (o.st_mtime, o.st_mtime_nsec) != (r.st_mtime, r.st_mtime_nsec)
    {
        oleo.futimens(*slot, (r.st_mtime, r.st_mtime_nsec))
            .expect("futimens on oleo");
        return Some("a hole punched in a hole: FUSE stamps mtime (kernel btrfs: unchanged)");
    }
    // FUSE's fallocate calls file_modified() first, always; btrfs_punch_hole skips it when
    // the range is already a hole, and keeps setuid/setgid then.
    let setid = libc::S_ISUID | libc::S_ISGID;
    if mode & libc::FALLOC_FL_PUNCH_HOLE != 0
        && step.as_user
        && r.st_mode != o.st_mode
        && (r.st_mode | setid) == (o.st_mode | setid)
        && o.st_mode & setid & !r.st_mode == 0
    {
        oleo.fchmod(*slot, r.st_mode & 0o7777)
            .expect("fchmod on oleo");
        return Some(
            "a hole punched in a hole by a user: FUSE drops setuid/setgid (kernel btrfs: kept)",
        );
    }
    None
}

const DIR_SEEK_END: &str =
    "lseek(SEEK_END) on a directory: FUSE uses the size it cached (kernel btrfs: the current one)";

fn steps() -> usize {
    std::env::var("OLEO_SYSCALL_STEPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1500)
}

/// Runs `steps` calls on both sides, as `step.as_user` says.
fn both(
    step: &Step,
    reference: &mut Side,
    oleo: &mut Side,
) -> (Result<u64, i32>, Result<u64, i32>) {
    if step.as_user {
        as_user(|| (reference.exec(&step.call), oleo.exec(&step.call)))
    } else {
        (reference.exec(&step.call), oleo.exec(&step.call))
    }
}

/// Crash states checked per seed at most, and the chance an fsync gets one.
const MAX_CRASH_STATES: usize = 4;
const CRASH_STATE_PERCENT: u64 = 40;

/// The crash state right after an fsync of `slot` returned, with nothing lost: a copy of
/// oleo's image taken then. `btrfs check` must pass on it before and after the kernel
/// replays its log tree, and the fsynced file (found by inode number, if it has a name)
/// must have exactly the contents the reference has.
fn fsynced_state(
    image: &Path,
    dir: &TempDir,
    reference: &Side,
    oleo: &Side,
    slot: usize,
    what: &str,
) -> bool {
    use std::os::unix::fs::MetadataExt;
    let (Some(st), Some(fd)) = (oleo.fstat(slot), reference.raw_fd(slot)) else {
        return false;
    };
    let copy = dir.join("crash-state");
    let out = std::process::Command::new("cp")
        .arg("--sparse=always")
        .arg(image)
        .arg(&copy)
        .output()
        .unwrap();
    assert!(out.status.success(), "cp: {out:?}");
    let want = if st.st_mode & libc::S_IFMT == libc::S_IFREG && st.st_nlink > 0 {
        Some(std::fs::read(format!("/proc/self/fd/{fd}")).expect("read the reference file"))
    } else {
        None
    };
    if let Err(text) = btrfs_check(&copy, true) {
        panic!("{what}: btrfs check of the crash state, before log replay:\n{text}");
    }
    if let Some(keep) = std::env::var_os("OLEO_KEEP_CRASH") {
        std::fs::copy(&copy, keep).unwrap();
    }
    let kmnt = dir.join("crash-mnt");
    // oleo's own replay (read-only, in memory), then the kernel's.
    let find = |root: &Path| {
        oleo_testkit::ops::walk(root).1.into_iter().find_map(|rel| {
            let p = root.join(std::ffi::OsStr::from_bytes(&rel));
            std::fs::symlink_metadata(&p)
                .is_ok_and(|m| m.ino() == st.st_ino)
                .then(|| (rel, std::fs::read(&p).unwrap()))
        })
    };
    let m = OleoMount::mount(Path::new(OLEO), &copy, &kmnt, &[])
        .expect("oleo mount of the crash state");
    let by_oleo = want.as_ref().and_then(|_| find(&kmnt));
    m.unmount().unwrap();
    let k = KernelMount::mount(&copy, &kmnt, &["rw", "nodev"])
        .expect("kernel mount of the crash state");
    let found = want.as_ref().and_then(|_| find(&kmnt));
    k.unmount().unwrap();
    if let (Some(want), Some((rel, got))) = (&want, &by_oleo) {
        assert!(
            got == want,
            "{what}: the fsynced file {:?} after oleo's log replay: {} bytes, the reference has {}",
            String::from_utf8_lossy(rel),
            got.len(),
            want.len(),
        );
    }
    let checked = want.is_some();
    if let Some(want) = want {
        let Some((rel, got)) = found else {
            let names: Vec<String> = oleo_testkit::ops::walk(&oleo.root)
                .1
                .into_iter()
                .filter(|rel| {
                    std::fs::symlink_metadata(oleo.root.join(std::ffi::OsStr::from_bytes(rel)))
                        .is_ok_and(|m| m.ino() == st.st_ino)
                })
                .map(|rel| String::from_utf8_lossy(&rel).into_owned())
                .collect();
            panic!(
                "{what}: the fsynced file (inode {}, named {names:?} on the mount) has no name after the kernel's log replay (after oleo's: {:?})",
                st.st_ino,
                by_oleo.map(|(rel, _)| String::from_utf8_lossy(&rel).into_owned())
            );
        };
        assert!(
            got == want,
            "{what}: the fsynced file {:?} after the kernel's log replay: {} bytes, the reference has {}, first difference at {:?}",
            String::from_utf8_lossy(&rel),
            got.len(),
            want.len(),
            got.iter().zip(&want).position(|(a, b)| a != b)
        );
    }
    if let Err(text) = btrfs_check(&copy, true) {
        panic!("{what}: btrfs check of the crash state after the kernel's log replay:\n{text}");
    }
    std::fs::remove_file(&copy).unwrap();
    checked
}

fn run(name: &str, mkfs: &[&str], opts: &[&str]) {
    if !(require_root(name) && require_fuse(name)) {
        return;
    }
    for seed in seeds(name, 3) {
        run_seed(name, mkfs, opts, seed);
    }
}

fn run_seed(name: &str, mkfs: &[&str], opts: &[&str], seed: u64) {
    let started = std::time::Instant::now();
    let replay = format!(
        "{name} seed {seed} (replay: OLEO_TEST_SEED={seed} cargo test -p oleo-cli --test syscall_diff)"
    );
    eprintln!("{replay}");
    let dir = TempDir::new(&format!("syscall-diff-{name}")).unwrap();
    let (image, ref_image) = (dir.join("image"), dir.join("ref-image"));
    let (mnt, refmnt, kmnt) = (
        dir.subdir("mnt").unwrap(),
        dir.subdir("ref").unwrap(),
        dir.subdir("kmnt").unwrap(),
    );
    image::empty_image(&image, 1024, mkfs).expect("mkfs.btrfs");
    image::empty_image(&ref_image, 1024, mkfs).expect("mkfs.btrfs (reference)");
    let mut kopts = vec!["rw", "nodev"];
    kopts.extend_from_slice(opts);
    let reference_mount = KernelMount::mount(&ref_image, &refmnt, &kopts).expect("kernel mount");
    let m = OleoMount::mount_rw(Path::new(OLEO), &image, &mnt, opts).expect("oleo mount rw");
    let dog = m.watchdog(std::time::Duration::from_secs(600));
    // SAFETY: umask has no preconditions (the same for every test of this process).
    unsafe { libc::umask(0o022) };

    let mut reference = Side::new(&refmnt);
    let mut oleo = Side::new(&mnt);
    let mut gen = Gen::new(seed);
    let mut history: Vec<String> = Vec::new();
    let n = steps();
    let trace = std::env::var_os("OLEO_SYSCALL_TRACE").is_some();
    let (mut ok, mut refused) = (0, 0);
    let mut tolerated: std::collections::BTreeMap<&str, usize> = Default::default();
    let mut crash_rng = oleo_testkit::ops::Rng::new(seed ^ 0xc4a5_4000);
    let (mut crash_states, mut fsynced_files) = (0, 0);
    // Every stat field that lives on disk is compared: nothing is excepted.
    let none = |_: &Node| false;
    for i in 0..n {
        let step = gen.next(&refmnt);
        let (want, got) = both(&step, &mut reference, &mut oleo);
        history.push(format!("{i}: {step} -> {}", show(&want)));
        if trace {
            eprintln!("{}", history.last().unwrap());
        }
        if let (Call::SetXattr { path, name, .. }, Err(libc::ENOSPC), Ok(_)) =
            (&step.call, &want, &got)
        {
            // Kernel btrfs refuses to grow an xattr in place when its leaf is full (the
            // layout is each filesystem's own): oleo's is put back as the reference has it.
            copy_xattr(&refmnt, &mnt, path, name).expect("undo the xattr in oleo");
            *tolerated.entry(XATTR_LEAF_FULL).or_insert(0) += 1;
            gen.record(&step, &want);
            continue;
        }
        if let (
            Call::Lseek {
                slot,
                whence: libc::SEEK_END,
                ..
            },
            Ok(_),
            Ok(_),
        ) = (&step.call, &want, &got)
        {
            // FUSE answers lseek(SEEK_END) on a directory from the size it cached (the VFS's
            // generic_file_llseek; no GETATTR first, unlike a regular file), which may
            // predate the last entry added or removed: not oleo's to fix.
            let is_dir = oleo
                .fstat(*slot)
                .is_some_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFDIR);
            if got != want && is_dir {
                // Both descriptors go on from the reference's position.
                let to = Call::Lseek {
                    slot: *slot,
                    off: *want.as_ref().unwrap() as i64,
                    whence: libc::SEEK_SET,
                };
                assert_eq!(oleo.exec(&to), want, "lseek back on oleo");
                *tolerated.entry(DIR_SEEK_END).or_insert(0) += 1;
                gen.record(&step, &want);
                continue;
            }
        }
        if got != want {
            let recent = history[history.len().saturating_sub(12)..].join("\n  ");
            panic!(
                "{replay}: step {i}: {step}\n  oleo: {} ({})\n  kernel btrfs: {} ({})\nthe steps before:\n  {recent}\noleo's log:\n{}",
                show(&got),
                oleo.describe(&step.call),
                show(&want),
                reference.describe(&step.call),
                m.log_text()
            );
        }
        if let Some(why) = fuse_stamped(&step, &want, &reference, &oleo) {
            *tolerated.entry(why).or_insert(0) += 1;
            history.push(format!("   (tolerated: {why})"));
        }
        gen.record(&step, &want);
        if want.is_ok() {
            ok += 1;
        } else {
            refused += 1;
        }
        if let (Call::Fsync { slot, .. }, Ok(_)) = (&step.call, &want) {
            if crash_states < MAX_CRASH_STATES && crash_rng.chance(CRASH_STATE_PERCENT) {
                crash_states += 1;
                let what = format!("{replay}: after step {i} ({step})");
                if fsynced_state(&image, &dir, &reference, &oleo, *slot, &what) {
                    fsynced_files += 1;
                }
            }
        }
        if i % 100 == 99 {
            assert_none(
                diff_trees_except(&capture(&refmnt), &capture(&mnt), "oleo", &none),
                &format!("{replay}: after step {i}, mounted"),
            );
        }
    }
    assert_none(
        diff_trees_except(&capture(&refmnt), &capture(&mnt), "oleo", &none),
        &format!("{replay}: after the last step, mounted"),
    );
    let closed = (reference.close_all(), oleo.close_all());
    assert_eq!(closed.1, closed.0, "{replay}: the last closes");
    let want = capture(&refmnt);
    let live = capture(&mnt);
    assert_none(
        diff_trees_except(&want, &live, "oleo", &none),
        &format!("{replay}: descriptors closed, mounted"),
    );
    drop(dog);
    m.unmount().expect("unmount oleo");
    assert_btrfs_check(&image, &replay);

    let m = OleoMount::mount(Path::new(OLEO), &image, &mnt, &[]).expect("oleo mount again");
    let again = capture(&mnt);
    m.unmount().expect("unmount oleo");
    assert_none(
        diff_trees_except(&want, &again, "oleo after a remount", &none),
        &format!("{replay}: mounted again"),
    );
    let (diffs, _) = diff_same_fs(&live, &again, "remounted", &none);
    assert_none(
        diffs,
        &format!("{replay}: oleo while mounted vs oleo mounted again"),
    );

    let k =
        KernelMount::mount(&image, &kmnt, &["ro", "nodev"]).expect("kernel mount of oleo's image");
    let kernel = capture(&kmnt);
    k.unmount().unwrap();
    assert_none(
        diff_trees_except(&want, &kernel, "kernel", &none),
        &format!("{replay}: the kernel's mount of oleo's image"),
    );
    let (diffs, _) = diff_same_fs(&live, &kernel, "kernel", &none);
    assert_none(
        diffs,
        &format!("{replay}: oleo while mounted vs the kernel's mount of oleo's image"),
    );
    reference_mount.unmount().unwrap();
    eprintln!(
        "{name} seed {seed}: {n} steps, {ok} done and {refused} refused alike, {} paths, {crash_states} crash states ({fsynced_files} fsynced files checked); {:.1?}; known differences tolerated: {tolerated:?}",
        want.len(),
        started.elapsed()
    );
}

#[test]
fn syscall_diff_default_mkfs() {
    run("default", &[], &[]);
}

#[test]
fn syscall_diff_xxhash() {
    run("xxhash", &["--csum", "xxhash"], &[]);
}

#[test]
fn syscall_diff_no_holes_off() {
    run("no-holes-off", &["-O", "^no-holes"], &[]);
}

#[test]
fn syscall_diff_compress_zstd() {
    run("zstd", &[], &["compress=zstd"]);
}
