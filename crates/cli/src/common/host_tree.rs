//! The host side of `oleo cp SRC... IMAGE:DEST`: a source tree read on a thread of its own,
//! ahead of the copy. Listing directories, stat, xattrs, chattr flags, symlink targets and
//! the data of small files are system calls on the host (a quarter of a copy's time with
//! the host's cache warm, most of it with the cache cold); the copy's own work is writing
//! the image, one thread under the filesystem's lock. The walker does the first while the
//! copy does the second, and hands entries over in the order a depth-first walk of sorted
//! directories meets them, so a copy of the same tree is the same.
//!
//! Memory stays bounded: a file's data is read ahead only up to `SMALL` bytes, and no more
//! than `AHEAD` bytes of data wait for the copy at once (larger files are read by the copy
//! itself, piece by piece).

use crate::common::into_image::{Meta, Times, Xattrs, KEPT_FLAGS};
use oleo::mkfs::rootdir::{next_data, read_full};
use oleo::Timespec;
use std::collections::HashSet;
use std::ffi::OsString;
use std::fs::{File, Metadata};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::{Arc, Condvar, Mutex};

/// Files up to this size are read by the walker.
const SMALL: u64 = 1 << 20;
/// Bytes of data read ahead and not yet written, at most (one file over it may wait alone).
const AHEAD: usize = 64 << 20;
/// Entries waiting for the copy, at most.
const QUEUE: usize = 4096;

/// What the walker hands over.
pub enum Event {
    /// A file, directory, link or special file. A directory with `descends` is followed by
    /// its contents and then a `Leave`.
    Entry(Box<Entry>),
    /// The end of the directory entered last.
    Leave,
    /// A path that could not be listed or stat'ed: reported, and nothing of it copied.
    Failed { path: PathBuf, error: String },
}

/// One source entry and what the copy needs of it from the host.
pub struct Entry {
    pub path: PathBuf,
    /// Its name in its directory (empty for the source named on the command line).
    pub name: Vec<u8>,
    pub meta: Metadata,
    /// The walker goes into this directory.
    pub descends: bool,
    /// Owner, mode, times, xattrs and flags, and a symlink's target.
    pub host: Result<(Meta, Option<Vec<u8>>), String>,
    pub data: Data,
    /// Bytes of `data` counted against the read-ahead budget.
    held: usize,
}

/// A regular file's contents, as read ahead.
pub enum Data {
    /// Not a regular file, or another name of a file with several links seen before.
    None,
    /// The data ranges (holes left out), or why they could not be read.
    Read(Result<Vec<(u64, Vec<u8>)>, String>),
    /// Too large to hold: the copy reads it.
    Large,
}

/// The read-ahead budget shared by the walker and the copy.
struct Budget {
    state: Mutex<(usize, bool)>,
    freed: Condvar,
}

impl Budget {
    /// Waits until `n` more bytes fit (or nothing is held); false once the copy is gone.
    fn take(&self, n: usize) -> bool {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        while !s.1 && s.0 > 0 && s.0 + n > AHEAD {
            s = self.freed.wait(s).unwrap_or_else(|p| p.into_inner());
        }
        s.0 += n;
        !s.1
    }

    fn give(&self, n: usize) {
        if n == 0 {
            return;
        }
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.0 = s.0.saturating_sub(n);
        self.freed.notify_one();
    }

    fn close(&self) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.1 = true;
        self.freed.notify_one();
    }
}

/// The copy's end: events in walk order. Dropping it stops the walker.
pub struct Walk {
    rx: Option<Receiver<Event>>,
    budget: Arc<Budget>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// How the walker reads: what `cp` keeps decides what it fetches.
#[derive(Clone, Copy)]
pub struct WalkOptions {
    pub recursive: bool,
    pub xattrs: bool,
    /// Hard links are kept: the data of a file with several links is read once.
    pub links: bool,
}

impl Walk {
    /// Starts walking `src`, whose metadata the caller has (followed or not, as it chose).
    pub fn start(src: &Path, meta: Metadata, opts: WalkOptions) -> std::io::Result<Walk> {
        let (tx, rx) = sync_channel(QUEUE);
        let budget = Arc::new(Budget {
            state: Mutex::new((0, false)),
            freed: Condvar::new(),
        });
        let b = budget.clone();
        let src = src.to_path_buf();
        let thread = std::thread::Builder::new()
            .name("oleo-cp-walk".into())
            .spawn(move || {
                let mut w = Walker {
                    opts,
                    budget: b,
                    seen: HashSet::new(),
                    send: &|e| tx.send(e).is_ok(),
                };
                w.entry(src, Vec::new(), meta);
            })?;
        Ok(Walk {
            rx: Some(rx),
            budget,
            thread: Some(thread),
        })
    }

    /// The next event; None at the end.
    pub fn next(&mut self) -> Option<Event> {
        self.rx.as_ref()?.recv().ok()
    }

    /// The copy is done with an entry's data: its bytes leave the budget.
    pub fn done(&self, entry: &Entry) {
        self.budget.give(entry.held);
    }
}

impl Drop for Walk {
    fn drop(&mut self) {
        self.budget.close();
        self.rx = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

struct Walker<'a> {
    opts: WalkOptions,
    budget: Arc<Budget>,
    /// (st_dev, st_ino) of files with several links whose data was read.
    seen: HashSet<(u64, u64)>,
    send: &'a dyn Fn(Event) -> bool,
}

impl Walker<'_> {
    /// Hands over `path` and, for a directory, what it holds. False: the copy is gone.
    fn entry(&mut self, path: PathBuf, name: Vec<u8>, meta: Metadata) -> bool {
        let ft = meta.file_type();
        let descends = ft.is_dir() && self.opts.recursive;
        let host = host_meta(&path, &meta, self.opts.xattrs).and_then(|m| {
            let target = if ft.is_symlink() {
                let t = std::fs::read_link(&path).map_err(|e| e.to_string())?;
                Some(t.into_os_string().into_vec())
            } else {
                None
            };
            Ok((m, target))
        });
        let (data, held) = if ft.is_file() {
            self.data(&path, &meta)
        } else {
            (Data::None, 0)
        };
        if !self.budget.take(held) {
            return false;
        }
        let entry = Entry {
            path,
            name,
            meta,
            descends,
            host,
            data,
            held,
        };
        let path = descends.then(|| entry.path.clone());
        if !(self.send)(Event::Entry(Box::new(entry))) {
            return false;
        }
        if let Some(path) = path {
            if !self.dir(&path) {
                return false;
            }
            return (self.send)(Event::Leave);
        }
        true
    }

    fn dir(&mut self, path: &Path) -> bool {
        let listed = std::fs::read_dir(path).and_then(|r| r.collect::<Result<Vec<_>, _>>());
        let entries = match listed {
            Ok(e) => e,
            Err(e) => {
                return (self.send)(Event::Failed {
                    path: path.to_path_buf(),
                    error: e.to_string(),
                })
            }
        };
        let mut entries: Vec<(OsString, PathBuf)> = entries
            .into_iter()
            .map(|e| (e.file_name(), e.path()))
            .collect();
        entries.sort();
        for (name, path) in entries {
            let going = match std::fs::symlink_metadata(&path) {
                Ok(meta) => self.entry(path, name.into_vec(), meta),
                Err(e) => (self.send)(Event::Failed {
                    path,
                    error: e.to_string(),
                }),
            };
            if !going {
                return false;
            }
        }
        true
    }

    /// A small file's data ranges and their size; `Large` for the rest.
    fn data(&mut self, path: &Path, meta: &Metadata) -> (Data, usize) {
        let len = meta.len();
        if len > SMALL {
            return (Data::Large, 0);
        }
        if self.opts.links && meta.nlink() > 1 && !self.seen.insert((meta.dev(), meta.ino())) {
            // Another name of a file already read: the copy links it.
            return (Data::None, 0);
        }
        match read_ranges(path, len) {
            Ok(ranges) => {
                let held = ranges.iter().map(|(_, d)| d.len()).sum();
                (Data::Read(Ok(ranges)), held)
            }
            Err(e) => (Data::Read(Err(e)), 0),
        }
    }
}

/// The data ranges of the first `len` bytes of `path`, holes skipped.
fn read_ranges(path: &Path, len: u64) -> Result<Vec<(u64, Vec<u8>)>, String> {
    let file = File::open(path).map_err(|e| e.to_string())?;
    let mut ranges = Vec::new();
    let mut at = 0u64;
    while at < len {
        let Some((start, end)) = next_data(&file, at, len) else {
            break;
        };
        let mut buf = vec![0u8; (end - start) as usize];
        let got = read_full(&file, &mut buf, start).map_err(|e| e.to_string())?;
        buf.truncate(got);
        if !buf.is_empty() {
            ranges.push((start, buf));
        }
        if got as u64 != end - start {
            // The file shrank under us: what was there is what is copied.
            break;
        }
        at = end;
    }
    Ok(ranges)
}

/// The metadata of a host file, its xattrs and chattr flags if `xattrs`.
pub fn host_meta(path: &Path, meta: &Metadata, xattrs: bool) -> Result<Meta, String> {
    let t = |sec: i64, nsec: i64| Timespec {
        sec,
        nsec: nsec as u32,
    };
    let (xattrs, flags) = if xattrs {
        let x = read_xattrs(path)?;
        let flags = if meta.is_file() || meta.is_dir() {
            host_flags(path)
        } else {
            0
        };
        (x, flags)
    } else {
        (Vec::new(), 0)
    };
    Ok(Meta {
        mode: meta.mode(),
        uid: meta.uid(),
        gid: meta.gid(),
        rdev: meta.rdev(),
        times: Times {
            atime: t(meta.atime(), meta.atime_nsec()),
            mtime: t(meta.mtime(), meta.mtime_nsec()),
        },
        xattrs,
        flags,
    })
}

/// FS_IOC_GETFLAGS of a host file or directory; 0 where the filesystem has none.
fn host_flags(path: &Path) -> u32 {
    let Ok(f) = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW)
        .open(path)
    else {
        return 0;
    };
    let mut flags: libc::c_long = 0;
    // SAFETY: FS_IOC_GETFLAGS writes a long through the pointer.
    let r = unsafe { libc::ioctl(f.as_raw_fd(), libc::FS_IOC_GETFLAGS, &mut flags) };
    if r < 0 {
        0
    } else {
        flags as u32 & KEPT_FLAGS
    }
}

/// Every xattr of `path` (not following a symlink) this process may read.
fn read_xattrs(path: &Path) -> Result<Xattrs, String> {
    oleo::mkfs::rootdir::read_xattrs(path).map_err(|e| format!("xattrs: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn walk_all(root: &Path, opts: WalkOptions) -> Vec<String> {
        let meta = std::fs::symlink_metadata(root).unwrap();
        let mut w = Walk::start(root, meta, opts).unwrap();
        let mut out = Vec::new();
        while let Some(ev) = w.next() {
            match ev {
                Event::Entry(e) => {
                    let what = match &e.data {
                        Data::None => "-".to_string(),
                        Data::Large => "large".to_string(),
                        Data::Read(Ok(r)) => format!(
                            "{:?}",
                            r.iter().map(|(o, d)| (*o, d.len())).collect::<Vec<_>>()
                        ),
                        Data::Read(Err(e)) => format!("error {e}"),
                    };
                    out.push(format!(
                        "{} {} {}",
                        String::from_utf8_lossy(&e.name),
                        e.descends,
                        what
                    ));
                    w.done(&e);
                }
                Event::Leave => out.push("leave".into()),
                Event::Failed { path, .. } => out.push(format!("failed {}", path.display())),
            }
        }
        out
    }

    use oleo_testkit::TempDir;

    #[test]
    fn walks_sorted_depth_first_with_small_data_read_and_links_once() {
        let dir = TempDir::new("oleo-host-tree-walk").unwrap();
        let root = dir.path().join("t");
        std::fs::create_dir_all(root.join("b/c")).unwrap();
        std::fs::write(root.join("a"), b"hello").unwrap();
        std::fs::write(root.join("b/c/z"), vec![7u8; 3000]).unwrap();
        std::fs::hard_link(root.join("a"), root.join("b/x")).unwrap();
        let big = File::create(root.join("big")).unwrap();
        big.set_len(SMALL + 1).unwrap();
        std::os::unix::fs::symlink("a", root.join("l")).unwrap();
        let opts = WalkOptions {
            recursive: true,
            xattrs: false,
            links: true,
        };
        assert_eq!(
            walk_all(&root, opts),
            [
                " true -",
                "a false [(0, 5)]",
                "b true -",
                "c true -",
                "z false [(0, 3000)]",
                "leave",
                "x false -",
                "leave",
                "big false large",
                "l false -",
                "leave",
            ]
        );
        // Without -r the walker stays out; without links kept a second name is read.
        let flat = WalkOptions {
            recursive: false,
            xattrs: false,
            links: false,
        };
        assert_eq!(walk_all(&root, flat), [" false -"]);
        assert_eq!(walk_all(&root.join("b/x"), flat), [" false [(0, 5)]"]);
    }

    #[test]
    fn a_dropped_walk_stops_its_thread_with_data_waiting() {
        let dir = TempDir::new("oleo-host-tree-drop").unwrap();
        for i in 0..200 {
            std::fs::write(dir.path().join(format!("f{i:03}")), vec![1u8; 1 << 20]).unwrap();
        }
        let meta = std::fs::symlink_metadata(dir.path()).unwrap();
        let opts = WalkOptions {
            recursive: true,
            xattrs: false,
            links: false,
        };
        let mut w = Walk::start(dir.path(), meta, opts).unwrap();
        // Take two entries without giving their bytes back, then drop: the walker, waiting
        // for budget, must end (the drop joins it).
        assert!(w.next().is_some());
        assert!(w.next().is_some());
        drop(w);
    }
}
