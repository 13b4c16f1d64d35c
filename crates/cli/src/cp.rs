//! `oleo cp`: copy files between the host and an unmounted image, at library speed and
//! without root. `oleo cp [-a] [-r] SRC... IMAGE:DEST` copies in, `oleo cp [-a] [-r]
//! IMAGE:SRC... DEST` copies out, with cp(1)'s rules for the destination: an existing
//! directory receives the sources inside it, a missing one names the copy.
//!
//! `-a` keeps what `cp -a` keeps: owners (as far as the caller may give them), modes, atime
//! and mtime, xattrs with POSIX ACLs, hard links among the copied files, symlinks as links,
//! device nodes, fifos and sockets, holes (SEEK_DATA/SEEK_HOLE on the host, the image's own
//! extent map inside it), and the NOCOW and compression flags. An error names its path and
//! the copy goes on; the exit status is then 1. The image is opened for writing only when it
//! is the destination, committed every GiB or 30 seconds and at the end.

use crate::common::host_tree::{Data, Entry, Event, Walk, WalkOptions};
use crate::common::into_image::{
    self, open_read, parse_place, show, split_last, InImage, Keep, Sink, Times, CHUNK, KEPT_FLAGS,
};
use crate::common::progress::Meter;
use oleo::mkfs::rootdir::{next_data, read_full};
use oleo::{Error, FileKind, Filesystem, InodeId, Timespec};
use std::collections::HashMap;
use std::ffi::{CString, OsStr, OsString};
use std::fs::{File, Metadata};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

#[derive(clap::Args)]
pub struct CpArgs {
    /// Archive: -r, symlinks as links, and keep owners, modes, times, xattrs (POSIX ACLs
    /// included), hard links, special files and the NOCOW/compression flags.
    #[arg(short = 'a', long = "archive")]
    archive: bool,
    /// Copy directories and what they hold.
    #[arg(short = 'r', short_alias = 'R', long = "recursive")]
    recursive: bool,
    /// Print each file as it is copied.
    #[arg(short = 'v', long)]
    verbose: bool,
    /// Reach paths in this subvolume (a path from the top level) instead of the default
    /// one. Without it, IMAGE:/sub/path goes through subvolumes found on the way too.
    #[arg(long, value_name = "PATH")]
    subvol: Option<String>,
    /// No progress line.
    #[arg(short = 'q', long)]
    quiet: bool,
    /// Sources, then the destination; IMAGE:PATH names a path in an image, on one side.
    #[arg(required = true, num_args = 2.., value_name = "SRC... DEST")]
    paths: Vec<OsString>,
}

impl CpArgs {
    fn keep(&self) -> Keep {
        Keep {
            owner: self.archive,
            mode: self.archive,
            times: self.archive,
            xattrs: self.archive,
        }
    }

    fn recursive(&self) -> bool {
        self.recursive || self.archive
    }
}

/// Ok(true): everything copied; Ok(false): some files failed (reported).
pub fn run(args: &CpArgs) -> Result<bool, String> {
    let (dest, sources) = args.paths.split_last().expect("two paths at least");
    let dest_place = parse_place(dest);
    let places: Vec<Option<InImage>> = sources.iter().map(|s| parse_place(s)).collect();
    match dest_place {
        Some(d) => {
            if places.iter().any(Option::is_some) {
                return Err(
                    "copies between two images are not supported: copy out, then in".into(),
                );
            }
            to_image(args, sources, &d)
        }
        None => {
            let srcs: Vec<InImage> = places.into_iter().flatten().collect();
            if srcs.len() != sources.len() {
                return Err("one side must be IMAGE:PATH (use cp(1) between host paths)".into());
            }
            if srcs.iter().any(|s| s.image != srcs[0].image) {
                return Err("all sources must come from one image".into());
            }
            from_image(args, &srcs, Path::new(dest))
        }
    }
}

// ---- host to image ----

struct In<'a> {
    sink: Sink,
    args: &'a CpArgs,
    keep: Keep,
    /// Source (st_dev, st_ino) of files with several links, and their copy.
    links: HashMap<(u64, u64), InodeId>,
    /// The image file itself, never copied into itself.
    image_id: (u64, u64),
    buf: Vec<u8>,
}

fn to_image(args: &CpArgs, sources: &[OsString], dest: &InImage) -> Result<bool, String> {
    let image_meta =
        std::fs::metadata(&dest.image).map_err(|e| format!("{}: {e}", dest.image.display()))?;
    let sink = Sink::open(&dest.image, args.subvol.as_deref(), args.quiet)?;
    let mut c = In {
        sink,
        args,
        keep: args.keep(),
        links: HashMap::new(),
        image_id: (image_meta.dev(), image_meta.ino()),
        buf: vec![0u8; CHUNK],
    };
    let target = format!("{}:/{}", dest.image.display(), show(&dest.path));
    // Where each source goes: inside an existing directory, or as the name given.
    let dest_dir = match c.sink.fs.resolve_path(c.sink.fs.root(), &dest.path) {
        Ok(id) => match c.sink.fs.getattr(id) {
            Ok(a) if a.kind == FileKind::Dir => Some(id),
            Ok(_) => None,
            Err(e) => return Err(format!("{target}: {e}")),
        },
        Err(Error::NotFound) => None,
        Err(e) => return Err(format!("{target}: {e}")),
    };
    if dest_dir.is_none() && sources.len() > 1 {
        return Err(format!("target '{target}' is not a directory"));
    }
    for src in sources {
        let src = Path::new(src);
        let follow = !args.recursive();
        let meta = if follow {
            std::fs::metadata(src)
        } else {
            std::fs::symlink_metadata(src)
        };
        let meta = match meta {
            Ok(m) => m,
            Err(e) => {
                c.sink.report(&src.display().to_string(), e);
                continue;
            }
        };
        let (dir, name) = match dest_dir {
            Some(d) => {
                let Some(name) = base_name(src) else {
                    c.sink
                        .report(&src.display().to_string(), "no name to copy to");
                    continue;
                };
                (d, name)
            }
            None => {
                let (parent, name) = split_last(&dest.path);
                if name.is_empty() {
                    return Err(format!("{target}: cannot overwrite the root directory"));
                }
                match c.sink.dir_at(parent, false) {
                    Ok(p) => (p, name.to_vec()),
                    Err(e) => return Err(format!("cannot create {target}: {e}")),
                }
            }
        };
        c.copy(dir, &name, src, meta);
    }
    c.sink.finish()
}

fn base_name(p: &Path) -> Option<Vec<u8>> {
    let trimmed = into_image::trim_path(p.as_os_str().as_bytes());
    let (_, name) = split_last(&trimmed);
    (!name.is_empty() && name != b"..").then(|| name.to_vec())
}

impl In<'_> {
    /// Copies `src` as `name` in `dir`, and what it holds, the host read ahead on a thread
    /// of its own (`host_tree`); errors are reported, not returned.
    fn copy(&mut self, dir: InodeId, name: &[u8], src: &Path, meta: Metadata) {
        let opts = WalkOptions {
            recursive: self.args.recursive(),
            xattrs: self.keep.xattrs,
            links: self.keep.owner,
        };
        let mut walk = match Walk::start(src, meta, opts) {
            Ok(w) => w,
            Err(e) => {
                self.sink.report(&src.display().to_string(), e);
                return;
            }
        };
        // The directories entered: their copy (None where it failed: nothing inside is
        // copied) and their times, set once their contents are in.
        let mut open: Vec<Option<(InodeId, Option<Times>, PathBuf)>> = Vec::new();
        while let Some(event) = walk.next() {
            let parent = match open.last() {
                None => Some(dir),
                Some(p) => p.as_ref().map(|(id, _, _)| *id),
            };
            match event {
                Event::Entry(e) => {
                    let made = parent.and_then(|p| {
                        let name = if open.is_empty() { name } else { &e.name[..] };
                        self.entry(p, name, &e)
                    });
                    walk.done(&e);
                    if e.descends {
                        open.push(made.map(|(id, times)| (id, times, e.path.clone())));
                    }
                }
                Event::Leave => {
                    if let Some(Some((id, times, path))) = open.pop() {
                        let what = path.display().to_string();
                        // After the contents: filling a directory changes its mtime.
                        if let Some(times) = times {
                            if let Err(err) = self.sink.set_times(id, &times) {
                                self.sink.report(&what, err);
                            }
                        }
                        if let Err(err) = self.sink.maybe_commit() {
                            self.sink.report(&what, err);
                        }
                    }
                }
                Event::Failed { path, error } => {
                    if parent.is_some() {
                        self.sink.report(&path.display().to_string(), error);
                    }
                }
            }
        }
    }

    /// Makes one entry as `name` in `dir`; for a directory the walk goes into, its copy and
    /// the times to give it after its contents.
    fn entry(&mut self, dir: InodeId, name: &[u8], e: &Entry) -> Option<(InodeId, Option<Times>)> {
        let (src, meta) = (&e.path, &e.meta);
        let what = src.display().to_string();
        if (meta.dev(), meta.ino()) == self.image_id {
            self.sink.report(&what, "is the destination image; skipped");
            return None;
        }
        let ft = meta.file_type();
        if ft.is_dir() && !self.args.recursive() {
            self.sink
                .report(&what, "-r not specified; omitting directory");
            return None;
        }
        if self.args.verbose {
            self.sink.meter.clear();
            println!("'{}' -> '{}'", src.display(), show(name));
        }
        if self.keep.owner && !ft.is_dir() && meta.nlink() > 1 {
            if let Some(&id) = self.links.get(&(meta.dev(), meta.ino())) {
                if let Err(err) = self.sink.link(id, dir, name) {
                    self.sink.report(&what, err);
                }
                return None;
            }
        }
        let (m, target) = match &e.host {
            Ok(h) => h,
            Err(err) => {
                self.sink.report(&what, err);
                return None;
            }
        };
        let id = match self.sink.create(dir, name, m, target.as_deref(), self.keep) {
            Ok(id) => id,
            Err(err) => {
                self.sink.report(&what, err);
                return None;
            }
        };
        if !ft.is_dir() && self.keep.owner && meta.nlink() > 1 {
            self.links.insert((meta.dev(), meta.ino()), id);
        }
        if ft.is_dir() {
            return Some((id, self.keep.times.then_some(m.times)));
        }
        let mut times_set = false;
        if ft.is_file() {
            let data = match &e.data {
                Data::Read(Ok(ranges)) => ranges
                    .iter()
                    .try_for_each(|(at, d)| self.sink.write(id, *at, d))
                    .map(|()| meta.len()),
                Data::Read(Err(err)) => Err(err.clone()),
                Data::Large | Data::None => self.data(id, src, meta),
            };
            // The size, and the times with it when they are kept: one change.
            let r = data.and_then(|len| {
                times_set = self.keep.times;
                if times_set {
                    self.sink.set_size_and_times(id, len, &m.times)
                } else {
                    self.sink.set_size(id, len)
                }
            });
            if let Err(err) = r {
                self.sink.report(&what, err);
            }
        }
        if self.keep.times && !times_set {
            if let Err(err) = self.sink.set_times(id, &m.times) {
                self.sink.report(&what, err);
            }
        }
        if let Err(err) = self.sink.maybe_commit() {
            self.sink.report(&what, err);
        }
        None
    }

    /// The data ranges of `src` (holes skipped); the size to set.
    fn data(&mut self, id: InodeId, src: &Path, meta: &Metadata) -> Result<u64, String> {
        let file = File::open(src).map_err(|e| e.to_string())?;
        let len = meta.len();
        let mut at = 0u64;
        while at < len {
            let Some((start, end)) = next_data(&file, at, len) else {
                break;
            };
            let mut pos = start;
            while pos < end {
                let n = ((end - pos) as usize).min(self.buf.len());
                let got = read_full(&file, &mut self.buf[..n], pos).map_err(|e| e.to_string())?;
                if got == 0 {
                    break;
                }
                let buf = std::mem::take(&mut self.buf);
                let r = self.sink.write(id, pos, &buf[..got]);
                self.buf = buf;
                r?;
                pos += got as u64;
            }
            at = end;
        }
        Ok(len)
    }
}

fn cpath(path: &Path) -> Result<CString, String> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| "NUL in path".to_string())
}

// ---- image to host ----

struct Out<'a> {
    fs: Filesystem,
    args: &'a CpArgs,
    keep: Keep,
    meter: Meter,
    failed: bool,
    root: bool,
    umask: u32,
    /// Image inodes with several links, and the host path of their first copy.
    links: HashMap<InodeId, PathBuf>,
    buf: Vec<u8>,
}

fn from_image(args: &CpArgs, sources: &[InImage], dest: &Path) -> Result<bool, String> {
    let fs = open_read(&sources[0].image, args.subvol.as_deref())?;
    // SAFETY: umask is set back at once; geteuid cannot fail.
    let (root, umask) = unsafe {
        let m = libc::umask(0);
        libc::umask(m);
        (libc::geteuid() == 0, m as u32)
    };
    let mut c = Out {
        fs,
        args,
        keep: args.keep(),
        meter: Meter::new(args.quiet),
        failed: false,
        root,
        umask,
        links: HashMap::new(),
        buf: Vec::new(),
    };
    let dest_is_dir = std::fs::metadata(dest).is_ok_and(|m| m.is_dir());
    if !dest_is_dir && sources.len() > 1 {
        return Err(format!("target '{}' is not a directory", dest.display()));
    }
    for src in sources {
        let what = format!("{}:/{}", src.image.display(), show(&src.path));
        let id = match c.fs.resolve_path(c.fs.root(), &src.path) {
            Ok(id) => id,
            Err(e) => {
                c.report(&what, e);
                continue;
            }
        };
        let to = if dest_is_dir {
            let (_, name) = split_last(&src.path);
            if name.is_empty() {
                // The root directory: its contents go into a directory named after it,
                // as `cp -r /. dest`... there is no name, so they go into DEST itself.
                dest.to_path_buf()
            } else {
                dest.join(OsStr::from_bytes(name))
            }
        } else {
            dest.to_path_buf()
        };
        c.entry(id, &to, &what);
    }
    c.meter.clear();
    Ok(!c.failed)
}

impl Out<'_> {
    fn report(&mut self, what: &str, e: impl std::fmt::Display) {
        self.meter.clear();
        eprintln!("oleo: {what}: {e}");
        self.failed = true;
    }

    fn entry(&mut self, id: InodeId, to: &Path, what: &str) {
        let attr = match self.fs.getattr(id) {
            Ok(a) => a,
            Err(e) => return self.report(what, e),
        };
        if attr.kind == FileKind::Dir && !self.args.recursive() {
            return self.report(what, "-r not specified; omitting directory");
        }
        if self.args.verbose {
            self.meter.clear();
            println!("'{what}' -> '{}'", to.display());
        }
        if self.keep.owner && attr.kind != FileKind::Dir && attr.nlink > 1 {
            if let Some(first) = self.links.get(&id).cloned() {
                let _ = remove_non_dir(to);
                if let Err(e) = std::fs::hard_link(&first, to) {
                    self.report(&to.display().to_string(), e);
                }
                return;
            }
        }
        if let Err(e) = self.make(id, &attr, to) {
            return self.report(&to.display().to_string(), e);
        }
        if self.keep.owner && attr.kind != FileKind::Dir && attr.nlink > 1 {
            self.links.insert(id, to.to_path_buf());
        }
        if attr.kind == FileKind::Dir {
            let mut names = Vec::new();
            let r = self.fs.readdir(id, 0, &mut |e| {
                if e.name != b"." && e.name != b".." {
                    names.push((e.name, e.id));
                }
                true
            });
            if let Err(e) = r {
                self.report(what, e);
            }
            names.sort();
            for (name, child) in names {
                let w = format!("{what}/{}", show(&name));
                self.entry(child, &to.join(OsStr::from_bytes(&name)), &w);
            }
        }
        if let Err(e) = self.finish_attrs(id, &attr, to) {
            self.report(&to.display().to_string(), e);
        }
    }

    /// Makes `to` as `attr` says, with its data.
    fn make(&mut self, id: InodeId, attr: &oleo::Attr, to: &Path) -> Result<(), String> {
        match attr.kind {
            FileKind::Dir => match std::fs::symlink_metadata(to) {
                Ok(m) if m.is_dir() => Ok(()),
                Ok(_) => Err("cannot overwrite non-directory with directory".into()),
                Err(_) => {
                    // Owner-writable while it is filled; the mode comes at the end.
                    mkdir(to, 0o700).map_err(|e| e.to_string())
                }
            },
            FileKind::Symlink => {
                let target = self.fs.readlink(id).map_err(|e| e.to_string())?;
                remove_non_dir(to)?;
                std::os::unix::fs::symlink(OsStr::from_bytes(&target), to)
                    .map_err(|e| e.to_string())
            }
            FileKind::File => {
                remove_non_dir(to)?;
                let file = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(to)
                    .map_err(|e| e.to_string())?;
                if self.keep.xattrs {
                    let flags = self.fs.get_fs_flags(id).unwrap_or(0) & KEPT_FLAGS;
                    if flags != 0 {
                        let mut f: libc::c_long = flags as libc::c_long;
                        // SAFETY: FS_IOC_SETFLAGS reads a long; a host filesystem without
                        // these flags refuses, which is no error for a copy.
                        unsafe { libc::ioctl(file.as_raw_fd(), libc::FS_IOC_SETFLAGS, &mut f) };
                    }
                }
                self.data(id, attr.size, &file)
            }
            _ => {
                if !self.args.recursive() {
                    return Err("not a regular file (use -r or -a for special files)".into());
                }
                remove_non_dir(to)?;
                let fmt = attr.mode & libc::S_IFMT;
                let c = cpath(to)?;
                // SAFETY: a NUL-terminated path.
                let r = unsafe { libc::mknod(c.as_ptr(), fmt | 0o600, attr.rdev as libc::dev_t) };
                if r < 0 {
                    return Err(std::io::Error::last_os_error().to_string());
                }
                Ok(())
            }
        }
    }

    /// The data of `id` into `file`, holes left as holes.
    fn data(&mut self, id: InodeId, size: u64, file: &File) -> Result<(), String> {
        let mut at = 0u64;
        while at < size {
            let start = match self.fs.seek_data_hole(id, at, true) {
                Ok(s) => s,
                Err(Error::NoSuchOffset) => break,
                Err(e) => return Err(e.to_string()),
            };
            let end = match self.fs.seek_data_hole(id, start, false) {
                Ok(e) => e.min(size),
                Err(Error::NoSuchOffset) => size,
                Err(e) => return Err(e.to_string()),
            };
            let mut pos = start;
            while pos < end {
                let n = ((end - pos) as usize).min(CHUNK);
                self.buf.resize(n, 0);
                let got = self
                    .fs
                    .read_into(id, pos, &mut self.buf[..n], false)
                    .map_err(|e| e.to_string())?;
                if got == 0 {
                    break;
                }
                file.write_all_at(&self.buf[..got], pos)
                    .map_err(|e| e.to_string())?;
                self.meter.add(got);
                pos += got as u64;
            }
            at = end.max(start + 1);
        }
        file.set_len(size).map_err(|e| e.to_string())
    }

    /// Owner, mode, xattrs, then times: in this order, as a chown clears set-id bits and an
    /// ACL is read against the mode.
    fn finish_attrs(&mut self, id: InodeId, attr: &oleo::Attr, to: &Path) -> Result<(), String> {
        let c = cpath(to)?;
        let symlink = attr.kind == FileKind::Symlink;
        let mut owner_kept = true;
        if self.keep.owner {
            // SAFETY: a NUL-terminated path.
            let r = unsafe { libc::lchown(c.as_ptr(), attr.uid, attr.gid) };
            if r < 0 {
                owner_kept = false;
                // As cp: keep the group if only that is allowed, and say nothing.
                // SAFETY: as above.
                unsafe { libc::lchown(c.as_ptr(), u32::MAX, attr.gid) };
                if self.root {
                    return Err(format!("chown: {}", std::io::Error::last_os_error()));
                }
            }
        }
        if !symlink {
            let mut perm = if self.keep.mode {
                attr.mode & 0o7777
            } else {
                attr.mode & 0o777 & !self.umask
            };
            if !owner_kept {
                perm &= !(libc::S_ISUID | libc::S_ISGID);
            }
            // SAFETY: a NUL-terminated path.
            if unsafe { libc::chmod(c.as_ptr(), perm) } < 0 {
                return Err(format!("chmod: {}", std::io::Error::last_os_error()));
            }
        }
        if self.keep.xattrs {
            let names = self.fs.listxattr(id).map_err(|e| e.to_string())?;
            for name in names {
                if !self.root && (name.starts_with(b"trusted.") || name.starts_with(b"security.")) {
                    continue;
                }
                // The compression property is the flag's business on the host.
                if name.starts_with(b"btrfs.") {
                    continue;
                }
                let value = self.fs.getxattr(id, &name).map_err(|e| e.to_string())?;
                let cn = CString::new(name.clone()).map_err(|_| "NUL in xattr name")?;
                // SAFETY: NUL-terminated strings and a valid buffer.
                let r = unsafe {
                    libc::lsetxattr(
                        c.as_ptr(),
                        cn.as_ptr(),
                        value.as_ptr().cast(),
                        value.len(),
                        0,
                    )
                };
                if r < 0 {
                    let e = std::io::Error::last_os_error();
                    if e.raw_os_error() != Some(libc::ENOTSUP) {
                        return Err(format!("xattr {}: {e}", show(&name)));
                    }
                }
            }
        }
        if self.keep.times {
            let ts = |t: Timespec| libc::timespec {
                tv_sec: t.sec as libc::time_t,
                tv_nsec: t.nsec as libc::c_long,
            };
            let times = [ts(attr.atime), ts(attr.mtime)];
            // SAFETY: a NUL-terminated path and two timespecs.
            let r = unsafe {
                libc::utimensat(
                    libc::AT_FDCWD,
                    c.as_ptr(),
                    times.as_ptr(),
                    libc::AT_SYMLINK_NOFOLLOW,
                )
            };
            if r < 0 {
                return Err(format!("utimensat: {}", std::io::Error::last_os_error()));
            }
        }
        Ok(())
    }
}

fn mkdir(path: &Path, mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new().mode(mode).create(path)
}

/// Removes what is at `path` unless it is a directory (an error then) or nothing.
fn remove_non_dir(path: &Path) -> Result<(), String> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => Err("cannot overwrite directory with non-directory".into()),
        Ok(_) => std::fs::remove_file(path).map_err(|e| e.to_string()),
        Err(_) => Ok(()),
    }
}
