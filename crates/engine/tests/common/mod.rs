//! Shared by the hostile-image tests: a bounded whole-filesystem walk through the public API,
//! and a runner that turns a panic or a hang into a reported failure instead of a crash.
#![allow(dead_code)]

pub mod crash;
pub mod extents;
pub mod tree_log;

use oleo::format::CsumType;
use oleo::{Error, FileKind, Filesystem, InodeId, OpenOptions};
use std::cell::RefCell;
use std::collections::{BTreeMap, HashSet};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::Once;
use std::time::{Duration, Instant};

/// Bounds that keep a walk of a hostile image finite even when the image claims huge files or
/// enormous directories. They bound the *walker*; the engine must stay bounded per call.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub max_entries: usize,
    pub max_file_bytes: u64,
    pub max_total_bytes: u64,
    pub read_chunk: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_entries: 50_000,
            max_file_bytes: 8 << 20,
            max_total_bytes: 256 << 20,
            read_chunk: 128 << 10,
        }
    }
}

/// What a walk saw. `digest` maps a path to what was read there (kind, size, content hash,
/// xattrs, or the error), so that two walks can be compared exactly.
#[derive(Default, Debug, Clone)]
pub struct Walk {
    pub entries: usize,
    pub errors: usize,
    pub first_errors: Vec<String>,
    pub bytes_read: u64,
    pub tree_blocks: usize,
    pub subvolumes: usize,
    pub digest: BTreeMap<String, String>,
    /// Every `Error::DataChecksum` seen, as (subvol, ino, offset, logical).
    pub data_csum_errors: Vec<(u64, u64, u64, u64)>,
    /// Errors other than `DataChecksum`.
    pub other_errors: usize,
    /// Every error message (the first 10000).
    pub all_errors: Vec<String>,
}

impl Walk {
    fn error(&mut self, what: &str, e: &Error) {
        self.note(format!("{what}: {e}"));
        if let Error::DataChecksum {
            subvol,
            ino,
            offset,
            logical,
        } = e
        {
            self.data_csum_errors
                .push((*subvol, *ino, *offset, *logical));
            assert_eq!(e.errno(), EIO, "{what}: a data checksum error must be EIO");
        } else {
            self.other_errors += 1;
        }
        // Every error maps to a real errno: the FUSE edge relies on it.
        assert!(e.errno() > 0, "{what}: error {e} has errno {}", e.errno());
    }

    /// Counts an error (without classifying it: callers of `error` do that).
    fn note(&mut self, msg: String) {
        self.errors += 1;
        if self.first_errors.len() < 5 {
            self.first_errors.push(msg.clone());
        }
        if self.all_errors.len() < 10_000 {
            self.all_errors.push(msg);
        }
    }

    /// True when some error message contains `needle`.
    pub fn mentions(&self, needle: &str) -> bool {
        self.all_errors.iter().any(|e| e.contains(needle))
    }

    pub fn summary(&self) -> String {
        format!(
            "walked {} entries, {} errors, {} bytes read, {} tree blocks, {} subvolumes{}",
            self.entries,
            self.errors,
            self.bytes_read,
            self.tree_blocks,
            self.subvolumes,
            if self.first_errors.is_empty() {
                String::new()
            } else {
                format!(" (first: {})", self.first_errors[0])
            }
        )
    }
}

/// EIO on Linux (no libc dependency in the tests).
pub const EIO: i32 = 5;

pub fn hash(data: &[u8]) -> u64 {
    u64::from_le_bytes(CsumType::Xxhash64.compute(data)[..8].try_into().unwrap())
}

fn show(name: &[u8]) -> String {
    String::from_utf8_lossy(name).into_owned()
}

/// Walks everything reachable through the public API: every directory (readdir in pages,
/// lookup of each name and of ".."), getattr, full reads of files (up to the limits),
/// readlink, listxattr/getxattr, every subvolume root, list_subvolumes, statfs, and every
/// block of every tree via walk_tree. Errors are counted, never fatal.
pub fn walk(fs: &Filesystem, lim: &Limits) -> Walk {
    let mut w = Walk::default();
    let mut visited: HashSet<InodeId> = HashSet::new();
    let mut stack: Vec<(InodeId, String)> = vec![(fs.root(), String::new())];

    match fs.statfs() {
        Ok(s) => {
            w.digest.insert("#statfs".into(), format!("{s:?}"));
        }
        Err(e) => w.error("statfs", &e),
    }
    if let Err(e) = fs.default_subvolume() {
        w.error("default_subvolume", &e);
    }
    match fs.list_subvolumes() {
        Ok(subs) => {
            w.subvolumes = subs.len();
            for s in &subs {
                w.digest.insert(
                    format!("#subvol {}", s.id),
                    format!(
                        "parent {:?} name {} path {:?} gen {} ro {}",
                        s.parent,
                        show(&s.name),
                        s.path.as_deref().map(show),
                        s.generation,
                        s.readonly
                    ),
                );
                // Subvolume roots are walked even when no directory leads to them.
                stack.push((
                    InodeId {
                        subvol: s.id,
                        ino: 256,
                    },
                    format!("#subvol-{}", s.id),
                ));
            }
        }
        Err(e) => w.error("list_subvolumes", &e),
    }

    while let Some((dir, path)) = stack.pop() {
        if !visited.insert(dir) || w.entries >= lim.max_entries {
            continue;
        }
        visit_inode(fs, lim, &mut w, dir, &path);
        if let Err(e) = fs.lookup(dir, b"..") {
            w.error(&format!("lookup {path}/.."), &e);
        }
        // readdir in pages of 50, resuming from each page's last cookie.
        let mut from = 0u64;
        let mut names: Vec<oleo::DirEntry> = Vec::new();
        loop {
            let mut page = Vec::new();
            let r = fs.readdir(dir, from, &mut |e| {
                page.push(e);
                page.len() < 50
            });
            if let Err(e) = r {
                w.error(&format!("readdir {path} from {from}"), &e);
                break;
            }
            let Some(last) = page.last() else { break };
            let next = last.next_offset;
            let full = page.len() >= 50;
            names.extend(page);
            // A cookie that does not advance would loop forever: stop (and count it).
            if !full || next <= from || names.len() >= lim.max_entries {
                if full && next <= from {
                    w.other_errors += 1;
                    w.note(format!("readdir {path}: cookie {next} does not advance"));
                }
                break;
            }
            from = next;
        }
        for e in names {
            if w.entries >= lim.max_entries {
                break;
            }
            w.entries += 1;
            let child = format!("{path}/{}", show(&e.name));
            match fs.lookup(dir, &e.name) {
                Ok(id) if id != e.id => {
                    w.digest
                        .insert(format!("{child}#lookup"), format!("{id:?} vs {:?}", e.id));
                }
                Ok(_) => {}
                Err(err) => w.error(&format!("lookup {child}"), &err),
            }
            if e.kind == FileKind::Dir {
                stack.push((e.id, child));
            } else if !visited.contains(&e.id) {
                visited.insert(e.id);
                visit_inode(fs, lim, &mut w, e.id, &child);
            }
        }
    }

    match fs.tree_ids() {
        Ok(ids) => {
            for id in ids {
                match fs.tree_root(id) {
                    Ok(Some(root)) => {
                        let mut blocks = 0usize;
                        let mut errs: Vec<String> = Vec::new();
                        let r = fs.walk_tree(&root, &mut |_b| blocks += 1, &mut |e| {
                            errs.push(e.to_string())
                        });
                        w.tree_blocks += blocks;
                        w.digest.insert(
                            format!("#tree {id}"),
                            format!("{blocks} blocks, {} bad", errs.len()),
                        );
                        for e in errs {
                            w.other_errors += 1;
                            w.note(format!("walk_tree {id}: {e}"));
                        }
                        if let Err(e) = r {
                            w.error(&format!("walk_tree {id}"), &e);
                        }
                    }
                    Ok(None) => {}
                    Err(e) => w.error(&format!("tree_root {id}"), &e),
                }
            }
        }
        Err(e) => w.error("tree_ids", &e),
    }
    w
}

/// getattr, then by kind: read the file fully, readlink; then xattrs. Records a digest line.
fn visit_inode(fs: &Filesystem, lim: &Limits, w: &mut Walk, id: InodeId, path: &str) {
    let attr = match fs.getattr(id) {
        Ok(a) => a,
        Err(e) => {
            w.error(&format!("getattr {path}"), &e);
            w.digest.insert(path.to_string(), format!("getattr: {e}"));
            return;
        }
    };
    let mut line = format!(
        "{:?} {:o} size {} nlink {} uid {} gid {} rdev {} mtime {:?}",
        attr.kind, attr.mode, attr.size, attr.nlink, attr.uid, attr.gid, attr.rdev, attr.mtime
    );
    match attr.kind {
        FileKind::File => {
            let want = attr.size.min(lim.max_file_bytes);
            let mut off = 0u64;
            let mut acc = 0u64;
            while off < want && w.bytes_read < lim.max_total_bytes {
                let n = (want - off).min(lim.read_chunk as u64) as u32;
                match fs.read(id, off, n) {
                    Ok(data) => {
                        if data.len() as u32 != n {
                            line.push_str(&format!(" short read {} at {off}", data.len()));
                        }
                        if data.is_empty() {
                            break;
                        }
                        acc = acc.rotate_left(7) ^ hash(&data);
                        w.bytes_read += data.len() as u64;
                        off += data.len() as u64;
                    }
                    Err(e) => {
                        line.push_str(&format!(" read error at {off}: {e}"));
                        w.error(&format!("read {path} at {off}"), &e);
                        // Skip the failing chunk and go on: the rest may be intact.
                        off += n as u64;
                    }
                }
            }
            line.push_str(&format!(" data {acc:016x}"));
            // Reads at and past the end must be empty, never an error or a panic.
            for o in [attr.size, attr.size.saturating_add(1), u64::MAX - 1] {
                match fs.read(id, o, 4096) {
                    Ok(d) if d.is_empty() => {}
                    Ok(d) => line.push_str(&format!(" {} bytes past EOF at {o}", d.len())),
                    Err(e) => w.error(&format!("read {path} past EOF at {o}"), &e),
                }
            }
        }
        FileKind::Symlink => match fs.readlink(id) {
            Ok(t) => line.push_str(&format!(" -> {:016x}", hash(&t))),
            Err(e) => {
                line.push_str(&format!(" readlink: {e}"));
                w.error(&format!("readlink {path}"), &e);
            }
        },
        _ => {}
    }
    match fs.listxattr(id) {
        Ok(names) => {
            for n in names.iter().take(1000) {
                match fs.getxattr(id, n) {
                    Ok(v) => line.push_str(&format!(" x:{}={:016x}", show(n), hash(&v))),
                    Err(e) => {
                        line.push_str(&format!(" x:{}: {e}", show(n)));
                        w.error(&format!("getxattr {path} {}", show(n)), &e);
                    }
                }
            }
        }
        Err(e) => {
            line.push_str(&format!(" listxattr: {e}"));
            w.error(&format!("listxattr {path}"), &e);
        }
    }
    w.digest.insert(path.to_string(), line);
}

/// How one bounded run ended.
#[derive(Debug)]
pub enum Outcome<T> {
    Done(T),
    Panicked(String),
    Hung(Duration),
}

thread_local! {
    static PANIC_AT: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Keeps the default panic output and also remembers where the panic happened, so the
/// per-image report can name it.
fn install_panic_hook() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let loc = info
                .location()
                .map(|l| format!("{}:{}", l.file(), l.line()))
                .unwrap_or_default();
            PANIC_AT.with(|p| *p.borrow_mut() = Some(loc));
            prev(info);
        }));
    });
}

/// Runs `f` on its own thread; a panic is caught and reported, and a run longer than
/// `limit` is reported as a hang (the thread is left behind: it cannot be killed).
pub fn bounded<T: Send + 'static>(
    name: &str,
    limit: Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> Outcome<T> {
    install_panic_hook();
    let (tx, rx) = mpsc::channel();
    let start = Instant::now();
    std::thread::Builder::new()
        .name(format!("bounded-{name}"))
        .spawn(move || {
            let r = catch_unwind(AssertUnwindSafe(f)).map_err(|payload| {
                let msg = payload
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| payload.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "non-string panic".into());
                let at = PANIC_AT.with(|p| p.borrow_mut().take()).unwrap_or_default();
                format!("{msg} at {at}")
            });
            let _ = tx.send(r);
        })
        .expect("spawn");
    match rx.recv_timeout(limit) {
        Ok(Ok(v)) => Outcome::Done(v),
        Ok(Err(p)) => Outcome::Panicked(p),
        Err(mpsc::RecvTimeoutError::Timeout) => Outcome::Hung(start.elapsed()),
        Err(mpsc::RecvTimeoutError::Disconnected) => Outcome::Panicked("thread died".into()),
    }
}

/// Opening an image: refused with a message, or walked.
#[derive(Debug)]
pub enum ImageResult {
    Refused(Error),
    Walked(Walk),
}

impl ImageResult {
    pub fn describe(&self) -> String {
        match self {
            ImageResult::Refused(e) => format!("refused: {e}"),
            ImageResult::Walked(w) => w.summary(),
        }
    }
}

pub fn open_and_walk(path: &Path, lim: &Limits) -> ImageResult {
    open_and_walk_with(path, lim, OpenOptions::default())
}

fn open_and_walk_with(path: &Path, lim: &Limits, opts: OpenOptions) -> ImageResult {
    match Filesystem::open(path, opts) {
        Err(e) => ImageResult::Refused(e),
        Ok(fs) => ImageResult::Walked(walk(&fs, lim)),
    }
}

/// `open_and_walk` under `bounded`.
pub fn check_image(name: &str, path: &Path, limit: Duration) -> Outcome<ImageResult> {
    let p = path.to_path_buf();
    bounded(name, limit, move || open_and_walk(&p, &Limits::default()))
}

/// Every rescue option at once (`rescue=all,usebackuproot`), read-only.
pub fn rescue_all() -> OpenOptions {
    let mut rescue = oleo::Rescue::default();
    rescue.add("all:usebackuproot").expect("known options");
    OpenOptions {
        log_replay: false,
        rescue,
        ..OpenOptions::default()
    }
}

/// `check_image` with every rescue option.
pub fn check_image_rescue(name: &str, path: &Path, limit: Duration) -> Outcome<ImageResult> {
    let p = path.to_path_buf();
    bounded(name, limit, move || {
        open_and_walk_with(&p, &Limits::default(), rescue_all())
    })
}

/// A small deterministic PRNG (splitmix64): the same seed gives the same damage everywhere.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }

    /// One element of the non-empty `v`.
    pub fn pick<'a, T>(&mut self, v: &'a [T]) -> &'a T {
        &v[self.below(v.len() as u64) as usize]
    }
}

/// A scratch directory and an empty mkfs.btrfs image of `mb` MiB in it (with `mkfs`'s
/// arguments); None, after a skip message naming `what`, where root is missing.
pub fn scratch_image(
    what: &str,
    label: &str,
    mb: u64,
    mkfs: &[&str],
) -> Option<(oleo_testkit::TempDir, PathBuf)> {
    if !oleo_testkit::require_root(what) {
        return None;
    }
    let tmp = oleo_testkit::TempDir::new(label).expect("tempdir");
    let image = tmp.join("image");
    oleo_testkit::image::empty_image(&image, mb, mkfs).expect("mkfs.btrfs");
    Some((tmp, image))
}

/// Opens `image` read-write at the top-level subvolume.
pub fn open_top_rw(image: &Path) -> Filesystem {
    let opts = OpenOptions {
        subvolid: Some(5),
        ..OpenOptions::default()
    };
    Filesystem::open_rw(image, opts).expect("open read-write")
}

/// The inode at `path` from the opened subvolume's root.
pub fn resolve(fs: &Filesystem, path: &str) -> InodeId {
    fs.resolve_path(fs.root(), path.as_bytes())
        .unwrap_or_else(|e| panic!("{path}: {e}"))
}
