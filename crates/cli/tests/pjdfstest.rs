//! pjdfstest, the POSIX filesystem conformance suite (crates.io `pjdfstest`, installed by
//! scripts/setup.sh), on a read-write oleo mount of a fresh 1 GiB `mkfs.btrfs` image, run
//! with `pjdfstest.toml` beside this file.
//!
//! The set of failing cases must be exactly the one listed, each with its reason, in
//! `pjdfstest-expected-failures.txt`: a new failure fails this test, and so does a listed
//! case that passes (or no longer runs), so that the list stays true. Afterwards the image
//! must unmount cleanly and pass `btrfs check`.
//!
//! Needs root (pjdfstest switches users; mkfs, mount), FUSE, pjdfstest and its dummy users;
//! without them it prints `SKIP: ...` (a failure under CI=true). `OLEO_PJDFSTEST` names the
//! pjdfstest binary when it is not on PATH or in ~/.cargo/bin.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use oleo_testkit::env::{find_in_path, skip};
use oleo_testkit::*;

const OLEO: &str = env!("CARGO_BIN_EXE_oleo");
const CONFIG: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/pjdfstest.toml");
const EXPECTED: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/pjdfstest-expected-failures.txt"
);
/// A whole run takes seconds; this only stops a hung one.
const LIMIT: Duration = Duration::from_secs(600);
/// pjdfstest 0.2 has about 400 cases; far fewer results means it did not really run.
const MIN_CASES: usize = 300;

fn pjdfstest_bin() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("OLEO_PJDFSTEST") {
        return Some(PathBuf::from(p)).filter(|p| p.is_file());
    }
    find_in_path("pjdfstest").or_else(|| {
        let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/root"), PathBuf::from);
        Some(home.join(".cargo/bin/pjdfstest")).filter(|p| p.is_file())
    })
}

fn getent(db: &str, name: &str) -> bool {
    Command::new("getent")
        .args([db, name])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The pjdfstest binary, or None after reporting a skip.
fn ready(what: &str) -> Option<PathBuf> {
    if !(require_root(what) && require_fuse(what)) {
        return None;
    }
    let Some(bin) = pjdfstest_bin() else {
        skip(
            what,
            "needs pjdfstest (`cargo install pjdfstest`, done by scripts/setup.sh)",
        );
        return None;
    };
    // The users and groups pjdfstest.toml names.
    for (db, name) in [
        ("passwd", "nobody"),
        ("group", "nogroup"),
        ("passwd", "tests"),
        ("group", "tests"),
    ] {
        if !getent(db, name) {
            skip(what, &format!("needs the {db} entry `{name}` for pjdfstest's user switches (scripts/setup.sh creates tests:tests)"));
            return None;
        }
    }
    Some(bin)
}

/// `name -> reason` from the expected-failures file (blank lines and `#` comments skipped).
fn parse_expected(text: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (name, reason) = line.split_once(char::is_whitespace).unwrap_or((line, ""));
        let reason = reason.trim();
        assert!(
            !reason.is_empty(),
            "{EXPECTED}:{}: `{name}` has no reason",
            n + 1
        );
        let dup = out.insert(name.to_string(), reason.to_string());
        assert!(
            dup.is_none(),
            "{EXPECTED}:{}: `{name}` is listed twice",
            n + 1
        );
    }
    out
}

#[derive(Debug, Default)]
struct Results {
    passed: BTreeSet<String>,
    skipped: BTreeSet<String>,
    /// Failed case -> what it printed (the assertion), for the report.
    failed: BTreeMap<String, String>,
}

fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            // CSI: ESC [ parameters final-byte
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Reads pjdfstest's report: one `NAME   STATUS` line per case, a failed case's message on
/// the lines after it (up to its backtrace, if one was captured).
fn parse_results(output: &str) -> Results {
    let mut r = Results::default();
    let mut current_failure: Option<String> = None;
    for line in strip_ansi(output).lines() {
        let case = (!line.starts_with(char::is_whitespace))
            .then(|| line.split_once(char::is_whitespace))
            .flatten()
            .filter(|(name, _)| name.contains("::"))
            .map(|(name, status)| (name.to_string(), status.trim()));
        if let Some((name, status)) = case {
            current_failure = None;
            match status {
                "ok" | "PASSED UNEXPECTEDLY" => {
                    r.passed.insert(name);
                }
                "skipped" => {
                    r.skipped.insert(name);
                }
                "FAILED" | "failed as expected" => {
                    r.failed.insert(name.clone(), String::new());
                    current_failure = Some(name);
                }
                _ => {}
            }
            continue;
        }
        if line.starts_with("Backtrace:") || line.starts_with("Summary:") {
            current_failure = None;
        }
        if let Some(msg) = current_failure.as_ref().and_then(|n| r.failed.get_mut(n)) {
            if !line.trim().is_empty() {
                if !msg.is_empty() {
                    msg.push_str(" / ");
                }
                msg.push_str(line.trim());
            }
        }
    }
    r
}

/// /sbin/mount.fuse.oleo pointing at this build while it lives: mount(8) runs it for the
/// EROFS cases' `mount -o remount,ro|rw`.
struct MountHelper(bool);

impl MountHelper {
    fn install() -> MountHelper {
        let helper = Path::new("/sbin/mount.fuse.oleo");
        let ours = std::fs::symlink_metadata(helper).is_err();
        if ours {
            std::os::unix::fs::symlink(OLEO, helper).expect("install /sbin/mount.fuse.oleo");
        }
        MountHelper(ours)
    }
}

impl Drop for MountHelper {
    fn drop(&mut self) {
        if self.0 {
            let _ = std::fs::remove_file("/sbin/mount.fuse.oleo");
        }
    }
}

fn make_image(path: &Path) {
    std::fs::File::create(path)
        .and_then(|f| f.set_len(1 << 30))
        .expect("create the image file");
    let mkfs = find_in_path("mkfs.btrfs").expect("mkfs.btrfs");
    cmd::run(Command::new(mkfs).args(["-q", "-f"]).arg(path)).expect("mkfs.btrfs");
}

/// Runs pjdfstest to its end (or kills it after `LIMIT`); returns its exit status and output.
fn run_pjdfstest(
    bin: &Path,
    dir: &TempDir,
    mountpoint: &Path,
    secondary: &Path,
) -> (Option<std::process::ExitStatus>, String) {
    let log = dir.join("pjdfstest.log");
    let out = std::fs::File::create(&log).unwrap();
    let mut cmd = Command::new(bin);
    cmd.arg("-c")
        .arg(CONFIG)
        .arg("-p")
        .arg(mountpoint)
        .arg("-s")
        .arg(secondary)
        // Outside the mount, which the EROFS cases remount.
        .current_dir(dir.path())
        .env("NO_COLOR", "1")
        .env("RUST_BACKTRACE", "0")
        .env("RUST_LIB_BACKTRACE", "0")
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out);
    eprintln!("pjdfstest: {}", cmd::describe(&cmd));
    let mut child = cmd.spawn().expect("start pjdfstest");
    let start = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break Some(st);
        }
        if start.elapsed() > LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    eprintln!("pjdfstest: ran for {:.1?}", start.elapsed());
    (status, std::fs::read_to_string(&log).unwrap_or_default())
}

#[test]
fn pjdfstest_failures_are_the_documented_ones() {
    let what = "pjdfstest_failures_are_the_documented_ones";
    let Some(bin) = ready(what) else { return };
    let expected = parse_expected(
        &std::fs::read_to_string(EXPECTED).expect("read the expected-failures list"),
    );

    let dir = TempDir::new("pjdfstest").unwrap();
    let image = dir.join("pjd.img");
    make_image(&image);
    let mp = dir.subdir("mnt").unwrap();
    let secondary = dir.subdir("other-fs").unwrap();
    let _helper = MountHelper::install();
    let m = OleoMount::mount(Path::new(OLEO), &image, &mp, &["rw"]).expect("mount oleo read-write");
    let info = mount::mount_at(&mp).expect("the oleo mount");
    assert!(
        info.super_options.split(',').any(|o| o == "rw"),
        "not read-write: {info:?}"
    );

    let (status, output) = {
        let _dog = m.watchdog(LIMIT + Duration::from_secs(60));
        run_pjdfstest(&bin, &dir, &mp, &secondary)
    };
    let tail = |s: &str| {
        s.lines()
            .rev()
            .take(40)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect::<Vec<_>>()
            .join("\n")
    };
    let Some(status) = status else {
        panic!(
            "pjdfstest did not finish within {LIMIT:?}; its last output:\n{}",
            tail(&output)
        );
    };
    let results = parse_results(&output);
    let ran = results.passed.len() + results.failed.len();
    assert!(
        ran >= MIN_CASES,
        "pjdfstest ran only {ran} cases ({status}); its output:\n{}",
        tail(&output)
    );
    let summary = output
        .lines()
        .rev()
        .find(|l| l.contains("Summary"))
        .unwrap_or("(no summary line)");
    eprintln!("pjdfstest: {}", strip_ansi(summary).trim());
    for (name, msg) in &results.failed {
        let why = expected.get(name).map_or("NOT EXPECTED", String::as_str);
        eprintln!("  failed: {name}: {msg}\n          expected because: {why}");
    }

    let mut problems = Vec::new();
    for (name, msg) in &results.failed {
        if !expected.contains_key(name) {
            problems.push(format!("new failure: {name}: {msg}"));
        }
    }
    for name in expected.keys() {
        if results.failed.contains_key(name) {
            continue;
        }
        let now = if results.passed.contains(name) {
            "passes now"
        } else if results.skipped.contains(name) {
            "was skipped"
        } else {
            "did not run (renamed or gone?)"
        };
        problems.push(format!(
            "listed as failing but {now}: {name} (remove it from the list)"
        ));
    }

    // The filesystem pjdfstest leaves behind must unmount and be consistent.
    m.unmount().expect("unmount after pjdfstest");
    let check = Command::new(find_in_path("btrfs").expect("btrfs"))
        .args(["check", "--readonly"])
        .arg(&image)
        .output()
        .expect("run btrfs check");
    if !check.status.success() {
        problems.push(format!(
            "btrfs check --readonly after pjdfstest failed:\n{}{}",
            String::from_utf8_lossy(&check.stdout),
            String::from_utf8_lossy(&check.stderr)
        ));
    }
    assert!(
        problems.is_empty(),
        "pjdfstest on oleo differs from {EXPECTED}:\n{}",
        problems.join("\n")
    );
}

#[test]
fn pjdfstest_report_is_parsed() {
    let out = "\x1b[34mchmod::a::dir\x1b[0m                     \x1b[32mok\x1b[0m\n\
               rename::b                          FAILED\n\
               \tassertion `left == right` failed\n  left: 1\n right: 3\n\
               Backtrace:\n   0: frame\n\
               link::c                            skipped\n\
               \tRemounts are not allowed\n\
               open::d                            failed as expected\n\
               \tboom\n\
               \n\
               Summary: 2 failed, 1 skipped, 1 passed, 0 expected failures, 4 total\n";
    let r = parse_results(out);
    assert_eq!(r.passed, BTreeSet::from(["chmod::a::dir".to_string()]));
    assert_eq!(r.skipped, BTreeSet::from(["link::c".to_string()]));
    assert_eq!(
        r.failed,
        BTreeMap::from([
            (
                "rename::b".to_string(),
                "assertion `left == right` failed / left: 1 / right: 3".to_string()
            ),
            ("open::d".to_string(), "boom".to_string()),
        ])
    );
    let e = parse_expected("# c\n\nrename::b   why it fails\nopen::d\tbecause\n");
    assert_eq!(e.len(), 2);
    assert_eq!(e["rename::b"], "why it fails");
}

#[test]
fn expected_failures_file_is_well_formed() {
    let e = parse_expected(&std::fs::read_to_string(EXPECTED).unwrap());
    assert!(e.keys().all(|k| k.contains("::")), "{e:?}");
}
