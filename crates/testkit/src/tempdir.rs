//! Private scratch directories under /tmp that clean up after themselves.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::cmd::{command, run_with_timeout};
use crate::mount::mounts_under;

/// A directory `/tmp/oleo-<label>-<pid>-<n>` removed (with everything in it) on drop.
///
/// Drop first detaches anything still mounted below it (lazily), and refuses to delete
/// while a mount remains: `remove_dir_all` would otherwise walk into a mounted filesystem.
pub struct TempDir {
    path: PathBuf,
    keep: bool,
}

impl TempDir {
    /// Creates a fresh directory. The base is `$OLEO_TEST_TMP` if set, else the system temp dir.
    pub fn new(label: &str) -> io::Result<TempDir> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let base = std::env::var_os("OLEO_TEST_TMP")
            .map(PathBuf::from)
            .unwrap_or_else(std::env::temp_dir);
        let label: String = label
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        loop {
            let n = COUNTER.fetch_add(1, Ordering::Relaxed);
            let path = base.join(format!("oleo-{label}-{}-{n}", std::process::id()));
            match std::fs::create_dir(&path) {
                Ok(()) => return Ok(TempDir { path, keep: false }),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e),
            }
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `self.path().join(p)`.
    pub fn join(&self, p: impl AsRef<Path>) -> PathBuf {
        self.path.join(p)
    }

    /// Creates (if needed) and returns a subdirectory, e.g. a mount point.
    pub fn subdir(&self, name: &str) -> io::Result<PathBuf> {
        let p = self.path.join(name);
        std::fs::create_dir_all(&p)?;
        Ok(p)
    }

    /// Keep the directory after drop (for post-mortem inspection); prints where it is.
    pub fn keep(&mut self) {
        self.keep = true;
    }
}

/// Lets any user reach `dir`: adds search permission (0o711) to it and every directory above
/// it inside the system's temporary directory, for tests that run a step as another user.
pub fn open_to_others(dir: &Path) {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let tmp = std::env::temp_dir();
    let mut p = Some(dir);
    while let Some(d) = p.filter(|d| d.starts_with(&tmp) && *d != tmp) {
        let mode = std::fs::metadata(d).unwrap().mode() | 0o711;
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(mode)).unwrap();
        p = d.parent();
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if self.keep || std::env::var_os("OLEO_KEEP_TMP").is_some() {
            eprintln!("oleo-testkit: keeping {}", self.path.display());
            return;
        }
        // Deepest mounts first, so parents become unmountable.
        let mut leftovers = mounts_under(&self.path);
        leftovers.sort_by_key(|p| std::cmp::Reverse(p.as_os_str().len()));
        for m in &leftovers {
            eprintln!(
                "oleo-testkit: {} still mounted at cleanup; detaching lazily",
                m.display()
            );
            let _ = run_with_timeout(
                &mut command("umount", &[std::ffi::OsStr::new("-l"), m.as_os_str()]),
                Duration::from_secs(10),
            );
        }
        if !mounts_under(&self.path).is_empty() {
            eprintln!(
                "oleo-testkit: not removing {}: mounts remain",
                self.path.display()
            );
            return;
        }
        if let Err(e) = std::fs::remove_dir_all(&self.path) {
            eprintln!("oleo-testkit: cannot remove {}: {e}", self.path.display());
        }
    }
}
