//! Where log lines go: stderr in the foreground; once a mount runs in the background, syslog
//! where there is one, else a file named on the terminal at mount time (nobody reads a
//! daemon's stderr, and in a container without /dev/log syslog reaches nobody either; a bad
//! block or an aborted commit must still be reported somewhere).

use log::{Level, LevelFilter, Log, Metadata, Record};
use std::ffi::CString;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Mutex, OnceLock};

/// Installs the logger once at start-up: stderr until `switch_to`.
pub fn init() {
    let stderr =
        env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).build();
    let level = stderr.filter();
    if log::set_boxed_logger(Box::new(Switch {
        stderr,
        syslog: Syslog { level },
    }))
    .is_ok()
    {
        log::set_max_level(level);
    }
}

struct Syslog {
    level: LevelFilter,
}

impl Log for Syslog {
    fn enabled(&self, m: &Metadata) -> bool {
        m.level() <= self.level.max(log::max_level())
    }

    fn log(&self, r: &Record) {
        if !self.enabled(r.metadata()) {
            return;
        }
        let prio = match r.level() {
            Level::Error => libc::LOG_ERR,
            Level::Warn => libc::LOG_WARNING,
            Level::Info => libc::LOG_INFO,
            _ => libc::LOG_DEBUG,
        };
        if let Ok(msg) = CString::new(format!("{}", r.args()).replace('\0', " ")) {
            // SAFETY: both strings are NUL-terminated and "%s" consumes exactly one.
            unsafe { libc::syslog(prio, c"%s".as_ptr(), msg.as_ptr()) };
        }
    }

    fn flush(&self) {}
}

/// Where a background mount's log goes.
#[derive(Clone, Debug)]
pub enum Target {
    Syslog,
    File(PathBuf),
}

/// Chooses the background log: `explicit` (-o log=PATH), else syslog if something listens
/// on its socket, else a file per image under the user's state directory (root: /var/log).
/// The file is created now, so a mount that cannot log fails on the terminal.
pub fn background_target(explicit: Option<&Path>, image: &Path) -> Result<Target, String> {
    let path = match explicit {
        Some(p) => p.to_path_buf(),
        None if syslog_listening() => return Ok(Target::Syslog),
        None => default_log_file(image)?,
    };
    open_log(&path).map_err(|e| format!("log file {}: {e}", path.display()))?;
    Ok(Target::File(path))
}

fn syslog_listening() -> bool {
    // Tests point this elsewhere to play a container without syslog.
    let socket = std::env::var_os("OLEO_SYSLOG_SOCKET").unwrap_or_else(|| "/dev/log".into());
    std::os::unix::net::UnixDatagram::unbound().is_ok_and(|s| s.connect(&socket).is_ok())
}

fn default_log_file(image: &Path) -> Result<PathBuf, String> {
    // SAFETY: geteuid cannot fail.
    let dir = if unsafe { libc::geteuid() } == 0 {
        PathBuf::from("/var/log/oleo")
    } else if let Some(state) = std::env::var_os("XDG_STATE_HOME").filter(|s| !s.is_empty()) {
        PathBuf::from(state).join("oleo")
    } else if let Some(home) = std::env::var_os("HOME").filter(|s| !s.is_empty()) {
        PathBuf::from(home).join(".local/state/oleo")
    } else {
        std::env::temp_dir().join(format!("oleo-{}", unsafe { libc::getuid() }))
    };
    let dir = match std::fs::create_dir_all(&dir) {
        Ok(()) => dir,
        Err(e) => {
            // SAFETY: getuid cannot fail.
            let tmp = std::env::temp_dir().join(format!("oleo-{}", unsafe { libc::getuid() }));
            std::fs::create_dir_all(&tmp).map_err(|e2| {
                format!(
                    "log directory {}: {e}; {}: {e2}",
                    dir.display(),
                    tmp.display()
                )
            })?;
            tmp
        }
    };
    let name = image
        .file_name()
        .map_or("oleo".into(), |n| n.to_string_lossy().into_owned());
    Ok(dir.join(format!("{name}.log")))
}

fn open_log(path: &Path) -> std::io::Result<File> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
}

/// Sends further log lines to `target`, from level info up (or what RUST_LOG asks for):
/// a log someone reads later should say what the mount did.
pub fn switch_to(target: &Target) {
    if log::max_level() < LevelFilter::Info {
        log::set_max_level(LevelFilter::Info);
    }
    match target {
        Target::Syslog => {
            // SAFETY: the ident is a static C string; openlog keeps the pointer.
            unsafe { libc::openlog(c"oleo".as_ptr(), libc::LOG_PID, libc::LOG_DAEMON) };
            SINK.store(TO_SYSLOG, Ordering::SeqCst);
        }
        Target::File(path) => match open_log(path) {
            Ok(f) => {
                let _ = LOG_FILE.set(Mutex::new(f));
                SINK.store(TO_FILE, Ordering::SeqCst);
            }
            Err(e) => log::error!("log file {}: {e}", path.display()),
        },
    }
}

/// Log lines whose target starts with this stay off the terminal (see `details_off_terminal`).
static OFF_TERMINAL: OnceLock<(&'static str, bool)> = OnceLock::new();

/// Keeps the per-block lines of `target` (a module path, e.g. `oleo::scrub`) off the
/// terminal, as btrfs-progs leaves such details to the kernel log: they go to syslog where
/// something listens, else nowhere. The command prints its summary instead.
pub fn details_off_terminal(target: &'static str) {
    let _ = OFF_TERMINAL.set((target, syslog_listening()));
}

const TO_STDERR: u8 = 0;
const TO_SYSLOG: u8 = 1;
const TO_FILE: u8 = 2;
static SINK: AtomicU8 = AtomicU8::new(TO_STDERR);
static LOG_FILE: OnceLock<Mutex<File>> = OnceLock::new();

/// Forwards to env_logger, syslog or the log file depending on `SINK`.
pub struct Switch {
    stderr: env_logger::Logger,
    syslog: Syslog,
}

impl Log for Switch {
    fn enabled(&self, m: &Metadata) -> bool {
        self.stderr.enabled(m)
    }

    fn log(&self, r: &Record) {
        match SINK.load(Ordering::Relaxed) {
            TO_SYSLOG => self.syslog.log(r),
            TO_FILE if r.level() <= log::max_level() => {
                if let Some(f) = LOG_FILE.get() {
                    let line = format!(
                        "{} {} oleo[{}]: {}\n",
                        utc_now(),
                        r.level(),
                        std::process::id(),
                        r.args()
                    );
                    // One write per line: lines of several threads never interleave.
                    let _ = f
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .write_all(line.as_bytes());
                }
            }
            TO_FILE => {}
            _ => match OFF_TERMINAL.get() {
                Some((target, syslog)) if r.target().starts_with(target) => {
                    if *syslog {
                        self.syslog.log(r)
                    }
                }
                _ => self.stderr.log(r),
            },
        }
    }

    fn flush(&self) {
        self.stderr.flush()
    }
}

/// `2026-11-24T15:55:06Z`, from the system clock.
fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    format!(
        "{}Z",
        crate::dump_tree::utc_date(secs).replacen(' ', "T", 1)
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn timestamps_are_utc_iso_dates() {
        let t = super::utc_now();
        assert_eq!(t.len(), 20, "{t}");
        assert!(
            t.starts_with("20") && t.ends_with('Z') && &t[10..11] == "T",
            "{t}"
        );
    }
}
