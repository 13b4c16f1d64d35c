//! Where log lines go: stderr in the foreground, syslog once a mount runs in the background
//! (nobody reads a daemon's stderr, but a bad block must still be reported somewhere).

use log::{Level, LevelFilter, Log, Metadata, Record};
use std::ffi::CString;

/// Installs the logger once at start-up: stderr until `switch_to_syslog`.
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
        m.level() <= self.level
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

/// Sends further log lines to syslog as "oleo[pid]".
pub fn switch_to_syslog() {
    // SAFETY: the ident is a static C string; openlog keeps the pointer.
    unsafe { libc::openlog(c"oleo".as_ptr(), libc::LOG_PID, libc::LOG_DAEMON) };
    SINK.store(true, std::sync::atomic::Ordering::SeqCst);
}

static SINK: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Forwards to env_logger or syslog depending on `SINK`.
pub struct Switch {
    stderr: env_logger::Logger,
    syslog: Syslog,
}

impl Log for Switch {
    fn enabled(&self, m: &Metadata) -> bool {
        self.stderr.enabled(m)
    }

    fn log(&self, r: &Record) {
        if SINK.load(std::sync::atomic::Ordering::Relaxed) {
            self.syslog.log(r)
        } else {
            self.stderr.log(r)
        }
    }

    fn flush(&self) {
        self.stderr.flush()
    }
}
