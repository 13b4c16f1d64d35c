//! Running external tools (mkfs.btrfs, losetup, mount, btrfs, setfacl, ...).
//!
//! Every failure becomes an `io::Error` whose message carries the full command line and its
//! stderr, because a bare "exit status 1" from deep inside an image build is useless.

use std::ffi::OsStr;
use std::io;
use std::process::{Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

/// A printable form of a command line, for error messages.
pub fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&shell_quote(a));
    }
    s
}

fn shell_quote(a: &OsStr) -> String {
    let t = a.to_string_lossy();
    if !t.is_empty()
        && t.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=,:+@%".contains(c))
    {
        t.into_owned()
    } else {
        format!("'{}'", t.replace('\'', "'\\''"))
    }
}

/// Runs `cmd` to completion, capturing its output; a non-zero exit is an error.
pub fn run(cmd: &mut Command) -> io::Result<Output> {
    cmd.stdin(Stdio::null());
    let out = cmd
        .output()
        .map_err(|e| io::Error::new(e.kind(), format!("{}: cannot start: {e}", describe(cmd))))?;
    if out.status.success() {
        Ok(out)
    } else {
        Err(io::Error::other(format!(
            "{} failed ({}): {}{}",
            describe(cmd),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim_end(),
            if out.stdout.is_empty() {
                String::new()
            } else {
                format!(
                    " [stdout: {}]",
                    String::from_utf8_lossy(&out.stdout).trim_end()
                )
            }
        )))
    }
}

/// Like [`run`] but returns stdout as a (lossy) string.
pub fn run_stdout(cmd: &mut Command) -> io::Result<String> {
    Ok(String::from_utf8_lossy(&run(cmd)?.stdout).into_owned())
}

/// Runs `cmd` with output discarded, killing it after `timeout`. Used on cleanup paths
/// (unmount, loop detach) that must never hang a test run: a stuck FUSE daemon can make
/// `fusermount3 -u` block.
pub fn run_with_timeout(cmd: &mut Command, timeout: Duration) -> io::Result<ExitStatus> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut child = cmd.spawn()?;
    let start = Instant::now();
    loop {
        if let Some(st) = child.try_wait()? {
            return Ok(st);
        }
        if start.elapsed() >= timeout {
            let _ = child.kill();
            let _ = child.wait();
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("{} timed out after {timeout:?}", describe(cmd)),
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Shorthand for `Command::new(program).args(args)`.
pub fn command<S: AsRef<OsStr>>(program: &str, args: &[S]) -> Command {
    let mut c = Command::new(program);
    c.args(args);
    c
}

/// Runs `script` with sh in `dir`: whether it succeeded and its trimmed stdout.
pub fn sh(dir: &std::path::Path, script: &str) -> (bool, String) {
    let out = Command::new("sh")
        .arg("-c")
        .arg(script)
        .current_dir(dir)
        .output()
        .expect("sh");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).trim().to_string(),
    )
}

/// Runs `script` with sh in `dir`; panics with its stderr when it fails.
pub fn sh_ok(dir: &std::path::Path, script: &str) {
    let out = Command::new("sh")
        .arg("-c")
        .arg(script)
        .current_dir(dir)
        .output()
        .expect("sh");
    assert!(
        out.status.success(),
        "script failed in {}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `btrfs ARGS` run in `at`; its stdout, or a panic with its output when it fails.
pub fn btrfs_in(args: &[&str], at: &std::path::Path) -> String {
    let out = run(Command::new("btrfs").args(args).current_dir(at))
        .unwrap_or_else(|e| panic!("btrfs {args:?}: {e}"));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A field of `btrfs subvolume show SUBVOL` run in `mount`, e.g. "Received UUID" ("-" for
/// none).
pub fn subvolume_show_field(mount: &std::path::Path, subvol: &str, field: &str) -> String {
    let text = btrfs_in(&["subvolume", "show", subvol], mount);
    text.lines()
        .find_map(|l| l.trim().strip_prefix(&format!("{field}:")))
        .unwrap_or_else(|| panic!("no {field} in `btrfs subvolume show {subvol}`:\n{text}"))
        .trim()
        .to_string()
}

/// For a test that needs root and `tools` (named with the packages that have them in
/// `packages`): false, after a skip message (a failure under CI=true), when one is missing.
pub fn require_tools(what: &str, tools: &[&str], packages: &str) -> bool {
    if !crate::env::require_root(what) {
        return false;
    }
    for t in tools {
        if crate::env::find_in_path(t).is_none() {
            return crate::env::skip(what, &format!("needs `{t}` (apt-get install {packages})"));
        }
    }
    true
}
