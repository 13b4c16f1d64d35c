//! `oleo tar -x -f ARCHIVE -C IMAGE:DEST`: extract a tar archive (or `-f -`, standard
//! input) into an unmounted image through the library, gzip, bzip2, xz or zstd compressed
//! or not (told by the flags or by the first bytes). What GNU tar keeps when root runs it
//! with --xattrs --acls --same-owner --preserve-permissions is kept: owners (names looked
//! up as GNU tar does, numbers otherwise), every mode bit, mtime (pax times with
//! their nanoseconds; atime is the time of extraction, as GNU tar has it), xattrs (pax SCHILY.xattr.*, POSIX ACLs among them), hard links,
//! symlinks, device nodes, fifos, and the holes of sparse members (GNU old-style and pax
//! 1.0). A caller other than root gets what GNU tar gives them: files of their own, modes
//! less the umask, no device nodes. Directories get their times once everything is in.

use crate::common::into_image::{
    self, parse_place, show, split_last, Keep, Meta, Sink, Times, CHUNK,
};
use crate::common::read_ahead::ReadAhead;
use oleo::{InodeId, Timespec};
use std::collections::HashMap;
use std::ffi::{CString, OsString};
use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct TarArgs {
    /// Extract.
    #[arg(short = 'x', long = "extract", required = true)]
    extract: bool,
    /// The archive; `-` for standard input.
    #[arg(short = 'f', long = "file", value_name = "ARCHIVE")]
    file: PathBuf,
    /// Where to extract: IMAGE:DIR (an existing directory; IMAGE alone: the root).
    #[arg(short = 'C', long = "directory", value_name = "IMAGE:DIR")]
    directory: OsString,
    /// gzip compressed.
    #[arg(short = 'z', long = "gzip")]
    gzip: bool,
    /// bzip2 compressed.
    #[arg(short = 'j', long = "bzip2")]
    bzip2: bool,
    /// xz compressed.
    #[arg(short = 'J', long = "xz")]
    xz: bool,
    /// zstd compressed.
    #[arg(long = "zstd")]
    zstd: bool,
    /// Reach DIR in this subvolume (a path from the top level) instead of the default one.
    #[arg(long, value_name = "PATH")]
    subvol: Option<String>,
    /// Print each member's name.
    #[arg(short = 'v', long)]
    verbose: bool,
    /// No progress line.
    #[arg(short = 'q', long)]
    quiet: bool,
    /// Accepted for GNU tar's command lines; always on: xattrs and ACLs are kept.
    #[arg(long = "xattrs", hide = true)]
    _xattrs: bool,
    #[arg(long = "acls", hide = true)]
    _acls: bool,
    #[arg(short = 'p', long = "preserve-permissions", hide = true)]
    _same_permissions: bool,
    #[arg(long = "same-owner", hide = true)]
    _same_owner: bool,
    #[arg(long = "numeric-owner")]
    /// Owners by number only, not by the names the archive gives.
    numeric_owner: bool,
}

#[derive(Clone, Copy)]
enum Compression {
    None,
    Gzip,
    Bzip2,
    Xz,
    Zstd,
}

/// What the first bytes say the stream is compressed with.
fn sniff(head: &[u8]) -> Compression {
    if head.starts_with(&[0x1f, 0x8b]) {
        Compression::Gzip
    } else if head.starts_with(b"BZh") {
        Compression::Bzip2
    } else if head.starts_with(&[0xfd, b'7', b'z', b'X', b'Z', 0]) {
        Compression::Xz
    } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        Compression::Zstd
    } else {
        Compression::None
    }
}

/// The archive's bytes, decompressed, read ahead on a thread of their own (`ReadAhead`).
fn open_archive(args: &TarArgs) -> Result<Box<dyn Read>, String> {
    let r = open_decoder(args)?;
    let ahead = ReadAhead::spawn(r, READ_AHEAD_CHUNK, READ_AHEAD_DEPTH)
        .map_err(|e| format!("{}: cannot start reading: {e}", args.file.display()))?;
    Ok(Box::new(ahead))
}

/// Chunks of the archive read ahead, and how many may wait.
const READ_AHEAD_CHUNK: usize = 1 << 20;
const READ_AHEAD_DEPTH: usize = 8;

fn open_decoder(args: &TarArgs) -> Result<Box<dyn Read + Send>, String> {
    let raw: Box<dyn Read + Send> = if args.file.as_os_str() == "-" {
        Box::new(std::io::stdin())
    } else {
        Box::new(
            std::fs::File::open(&args.file).map_err(|e| format!("{}: {e}", args.file.display()))?,
        )
    };
    let mut r = BufReader::with_capacity(1 << 20, raw);
    let kind = if args.gzip {
        Compression::Gzip
    } else if args.bzip2 {
        Compression::Bzip2
    } else if args.xz {
        Compression::Xz
    } else if args.zstd {
        Compression::Zstd
    } else {
        let head = r.fill_buf().map_err(|e| e.to_string())?;
        sniff(head)
    };
    Ok(match kind {
        Compression::None => Box::new(r),
        Compression::Gzip => Box::new(flate2::read::MultiGzDecoder::new(r)),
        Compression::Bzip2 => Box::new(bzip2::read::MultiBzDecoder::new(r)),
        Compression::Xz => Box::new(xz2::read::XzDecoder::new_multi_decoder(r)),
        Compression::Zstd => {
            Box::new(zstd::stream::read::Decoder::with_buffer(r).map_err(|e| e.to_string())?)
        }
    })
}

struct Extract {
    sink: Sink,
    keep: Keep,
    numeric: bool,
    verbose: bool,
    /// The extraction directory's path in the image (trimmed).
    base: Vec<u8>,
    /// Directories and their times, set at the end.
    dirs: Vec<(InodeId, Times, String)>,
    users: HashMap<Vec<u8>, Option<u32>>,
    groups: HashMap<Vec<u8>, Option<u32>>,
    buf: Vec<u8>,
}

/// Ok(true): everything extracted; Ok(false): some members failed (reported).
pub fn run(args: &TarArgs) -> Result<bool, String> {
    debug_assert!(args.extract);
    let dest = parse_place(&args.directory).ok_or_else(|| {
        format!(
            "-C {}: not IMAGE:DIR (an image file, a colon, a directory in it)",
            args.directory.to_string_lossy()
        )
    })?;
    let input = open_archive(args)?;
    let sink = Sink::open(&dest.image, args.subvol.as_deref(), args.quiet)?;
    let root = sink.is_root();
    let mut x = Extract {
        sink,
        // As GNU tar: root keeps owners and modes, anyone else gets their own files with
        // the umask applied.
        keep: Keep {
            owner: root,
            mode: root,
            times: true,
            xattrs: true,
        },
        numeric: args.numeric_owner,
        verbose: args.verbose,
        base: dest.path.clone(),
        dirs: Vec::new(),
        users: HashMap::new(),
        groups: HashMap::new(),
        buf: vec![0u8; CHUNK],
    };
    if let Err(e) = x.sink.dir_at(&dest.path, false) {
        return Err(format!("-C: {e}"));
    }
    let mut archive = tar::Archive::new(input);
    // Raw: pax headers are parsed here, as the crate's reader splits their records at
    // every newline and binary values (POSIX ACLs in SCHILY.xattr.*) hold newlines.
    let entries = archive.entries().map_err(|e| e.to_string())?.raw(true);
    let mut global: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
    let mut local: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
    let (mut long_name, mut long_link) = (None, None);
    for entry in entries {
        let mut entry = match entry {
            Ok(e) => e,
            Err(e) => {
                // A broken stream cannot be read on.
                x.sink.report(&args.file.display().to_string(), e);
                break;
            }
        };
        let kind = entry.header().entry_type();
        if matches!(
            kind,
            tar::EntryType::XHeader
                | tar::EntryType::XGlobalHeader
                | tar::EntryType::GNULongName
                | tar::EntryType::GNULongLink
        ) {
            let mut data = Vec::new();
            if let Err(e) = entry.read_to_end(&mut data) {
                x.sink.report(&args.file.display().to_string(), e);
                break;
            }
            match kind {
                tar::EntryType::XHeader => local.extend(parse_pax(&data)),
                tar::EntryType::XGlobalHeader => global.extend(parse_pax(&data)),
                tar::EntryType::GNULongName => long_name = Some(trim_nul(data)),
                _ => long_link = Some(trim_nul(data)),
            }
            continue;
        }
        let mut pax = global.clone();
        pax.append(&mut local);
        let names = Names {
            path: long_name.take(),
            link: long_link.take(),
        };
        let shown = names
            .path
            .clone()
            .unwrap_or_else(|| entry.path_bytes().into_owned());
        if let Err(e) = x.member(&mut entry, &pax, names) {
            x.sink.report(&show(&shown), e);
        }
        if let Err(e) = x.sink.maybe_commit() {
            x.sink.report(&show(&shown), e);
        }
    }
    // Deepest first does not matter: setting times changes no parent.
    for (id, times, name) in std::mem::take(&mut x.dirs) {
        if let Err(e) = x.sink.set_times(id, &times) {
            x.sink.report(&name, e);
        }
    }
    x.sink.finish()
}

/// A pax time: seconds with an optional fraction.
fn pax_time(v: &[u8]) -> Option<Timespec> {
    let s = std::str::from_utf8(v).ok()?;
    let (sec, frac) = s.split_once('.').unwrap_or((s, ""));
    let sec: i64 = sec.parse().ok()?;
    let digits: String = frac.chars().take(9).collect();
    let mut nsec: u32 = if digits.is_empty() {
        0
    } else {
        digits.parse().ok()?
    };
    for _ in digits.len()..9 {
        nsec *= 10;
    }
    // "-0.5" is half a second before the epoch: the sign is the string's, not the
    // number's.
    if s.starts_with('-') && nsec > 0 {
        // -1.25 is 1.25 seconds before the epoch: -2 s + 0.75 s.
        return Some(Timespec {
            sec: sec - 1,
            nsec: 1_000_000_000 - nsec,
        });
    }
    Some(Timespec { sec, nsec })
}

/// A member's path, trimmed; None if it climbs out with `..`.
fn member_path(raw: &[u8]) -> Option<Vec<u8>> {
    let p = into_image::trim_path(raw);
    if p.split(|&b| b == b'/').any(|c| c == b"..") {
        return None;
    }
    Some(p)
}

impl Extract {
    fn join(&self, member: &[u8]) -> Vec<u8> {
        let mut p = self.base.clone();
        if !p.is_empty() && !member.is_empty() {
            p.push(b'/');
        }
        p.extend_from_slice(member);
        p
    }

    fn lookup_id(
        cache: &mut HashMap<Vec<u8>, Option<u32>>,
        name: &[u8],
        user: bool,
    ) -> Option<u32> {
        if name.is_empty() {
            return None;
        }
        *cache.entry(name.to_vec()).or_insert_with(|| {
            let c = CString::new(name).ok()?;
            // SAFETY: NUL-terminated names; the results are read at once, on this
            // thread only.
            unsafe {
                if user {
                    let p = libc::getpwnam(c.as_ptr());
                    (!p.is_null()).then(|| (*p).pw_uid)
                } else {
                    let g = libc::getgrnam(c.as_ptr());
                    (!g.is_null()).then(|| (*g).gr_gid)
                }
            }
        })
    }

    fn member<R: Read>(
        &mut self,
        entry: &mut tar::Entry<R>,
        pax: &[(Vec<u8>, Vec<u8>)],
        names: Names,
    ) -> Result<(), String> {
        let get = |k: &str| {
            pax.iter()
                .rev()
                .find(|(key, _)| key == k.as_bytes())
                .map(|(_, v)| v.as_slice())
        };
        let sparse_pax = get("GNU.sparse.major") == Some(b"1");
        let raw_path = match (sparse_pax, get("GNU.sparse.name")) {
            (true, Some(n)) => n.to_vec(),
            _ => get("path")
                .map(<[u8]>::to_vec)
                .or(names.path)
                .unwrap_or_else(|| entry.path_bytes().into_owned()),
        };
        let link_name = get("linkpath")
            .map(<[u8]>::to_vec)
            .or(names.link)
            .or_else(|| entry.link_name_bytes().map(|l| l.into_owned()));
        let path = member_path(&raw_path).ok_or("member name contains '..': skipped")?;
        if self.verbose {
            self.sink.meter.clear();
            println!("{}", show(&raw_path));
        }
        let header = entry.header();
        let kind = header.entry_type();
        let fmt = match kind {
            tar::EntryType::Regular | tar::EntryType::Continuous => libc::S_IFREG,
            tar::EntryType::GNUSparse => {
                return Err(
                    "old GNU sparse member: not supported (pax sparse members are: \
                            GNU tar --format=posix, or --xattrs)"
                        .into(),
                )
            }
            tar::EntryType::Directory => libc::S_IFDIR,
            tar::EntryType::Symlink => libc::S_IFLNK,
            tar::EntryType::Char => libc::S_IFCHR,
            tar::EntryType::Block => libc::S_IFBLK,
            tar::EntryType::Fifo => libc::S_IFIFO,
            tar::EntryType::Link => 0,
            // Headers the crate has read for us (pax, GNU long names) and the rest.
            _ => return Ok(()),
        };
        let full = self.join(&path);
        let (parent_path, name) = split_last(&full);
        if name.is_empty() || path.is_empty() {
            // `./` itself: the extraction directory takes its attributes.
            if fmt == libc::S_IFDIR {
                let id = self.sink.dir_at(&full, false)?;
                let meta = self.meta(entry, pax, fmt)?;
                let mut keep = self.keep;
                keep.xattrs = true;
                self.sink.apply_to_existing_dir(id, &meta, keep)?;
                self.dirs.push((id, meta.times, show(&raw_path)));
            }
            return Ok(());
        }
        let parent = self.sink.dir_at(parent_path, true)?;
        if kind == tar::EntryType::Link {
            let target = link_name.ok_or("hard link without a target")?;
            let target = member_path(&target).ok_or("hard link target contains '..': skipped")?;
            let tfull = self.join(&target);
            let id = self
                .sink
                .fs
                .resolve_path(self.sink.fs.root(), &tfull)
                .map_err(|e| format!("link to {}: {e}", show(&target)))?;
            return self.sink.link(id, parent, name);
        }
        let meta = self.meta(entry, pax, fmt)?;
        let target = if fmt == libc::S_IFLNK {
            Some(link_name.ok_or("symlink without a target")?)
        } else {
            None
        };
        let id = self
            .sink
            .create(parent, name, &meta, target.as_deref(), self.keep)?;
        if fmt == libc::S_IFREG {
            let size = if sparse_pax {
                let size = get("GNU.sparse.realsize")
                    .and_then(|v| std::str::from_utf8(v).ok()?.parse().ok())
                    .ok_or("sparse member without GNU.sparse.realsize")?;
                self.sparse_pax_data(id, entry)?;
                size
            } else {
                self.data(id, entry)?
            };
            // Size and times in one change (a hole at the end is a hole).
            return self.sink.set_size_and_times(id, size, &meta.times);
        }
        if fmt == libc::S_IFDIR {
            self.dirs.push((id, meta.times, show(&raw_path)));
        } else {
            self.sink.set_times(id, &meta.times)?;
        }
        Ok(())
    }

    fn meta<R: Read>(
        &mut self,
        entry: &tar::Entry<R>,
        pax: &[(Vec<u8>, Vec<u8>)],
        fmt: u32,
    ) -> Result<Meta, String> {
        let get = |k: &str| {
            pax.iter()
                .rev()
                .find(|(key, _)| key == k.as_bytes())
                .map(|(_, v)| v.as_slice())
        };
        let num = |k: &str| get(k).and_then(|v| std::str::from_utf8(v).ok()?.parse::<u32>().ok());
        let h = entry.header();
        let e = |e: std::io::Error| e.to_string();
        let mut uid = num("uid")
            .map_or_else(|| h.uid().map(|u| u as u32), Ok)
            .map_err(e)?;
        let mut gid = num("gid")
            .map_or_else(|| h.gid().map(|g| g as u32), Ok)
            .map_err(e)?;
        if !self.numeric {
            let uname = get("uname")
                .map(<[u8]>::to_vec)
                .or_else(|| h.username_bytes().map(<[u8]>::to_vec));
            let gname = get("gname")
                .map(<[u8]>::to_vec)
                .or_else(|| h.groupname_bytes().map(<[u8]>::to_vec));
            if let Some(u) = uname.and_then(|n| Self::lookup_id(&mut self.users, &n, true)) {
                uid = u;
            }
            if let Some(g) = gname.and_then(|n| Self::lookup_id(&mut self.groups, &n, false)) {
                gid = g;
            }
        }
        let mtime = match get("mtime").and_then(pax_time) {
            Some(t) => t,
            None => Timespec {
                sec: h.mtime().map_err(e)? as i64,
                nsec: 0,
            },
        };
        // As GNU tar: the time of extraction, whatever atime the archive holds.
        let atime = into_image::now();
        let rdev = if fmt == libc::S_IFCHR || fmt == libc::S_IFBLK {
            let major = h.device_major().map_err(e)?.unwrap_or(0);
            let minor = h.device_minor().map_err(e)?.unwrap_or(0);
            libc::makedev(major, minor)
        } else {
            0
        };
        let xattrs = pax
            .iter()
            .filter_map(|(k, v)| {
                k.strip_prefix(b"SCHILY.xattr.")
                    .map(|name| (name.to_vec(), v.clone()))
            })
            .collect();
        Ok(Meta {
            mode: fmt | (h.mode().map_err(e)? & 0o7777),
            uid,
            gid,
            rdev,
            times: Times { atime, mtime },
            xattrs,
            flags: 0,
        })
    }

    /// The member's data, in order; its size (set by the caller).
    fn data<R: Read>(&mut self, id: InodeId, entry: &mut tar::Entry<R>) -> Result<u64, String> {
        let mut pos = 0u64;
        loop {
            let n = read_full(entry, &mut self.buf).map_err(|e| e.to_string())?;
            if n == 0 {
                break;
            }
            let buf = std::mem::take(&mut self.buf);
            let r = self.sink.write(id, pos, &buf[..n]);
            self.buf = buf;
            r?;
            pos += n as u64;
        }
        Ok(pos)
    }

    /// A pax 1.0 sparse member: a map (decimal lines: count, then offset and length of
    /// each data piece) padded to 512 bytes, then the pieces (the caller sets the size).
    fn sparse_pax_data<R: Read>(
        &mut self,
        id: InodeId,
        entry: &mut tar::Entry<R>,
    ) -> Result<(), String> {
        let mut head = Vec::new();
        let mut numbers: Vec<u64> = Vec::new();
        let mut block = [0u8; 512];
        let mut want = None;
        while want.is_none_or(|w| numbers.len() < w) {
            entry
                .read_exact(&mut block)
                .map_err(|e| format!("sparse map: {e}"))?;
            head.extend_from_slice(&block);
            numbers.clear();
            let mut lines = head.split(|&b| b == b'\n');
            // The last piece may be cut by the block's end: only whole lines count.
            let whole = head.iter().filter(|&&b| b == b'\n').count();
            for line in lines.by_ref().take(whole) {
                let n = std::str::from_utf8(line)
                    .ok()
                    .and_then(|s| s.parse().ok())
                    .ok_or("bad sparse map")?;
                numbers.push(n);
                if want.is_none() {
                    want = Some(1 + 2 * n as usize);
                }
                if want.is_some_and(|w| numbers.len() >= w) {
                    break;
                }
            }
            if head.len() > 1 << 24 {
                return Err("sparse map too long".into());
            }
        }
        for piece in numbers[1..].chunks(2) {
            let (offset, len) = (piece[0], piece[1]);
            let mut done = 0u64;
            while done < len {
                let n = ((len - done) as usize).min(self.buf.len());
                entry
                    .read_exact(&mut self.buf[..n])
                    .map_err(|e| format!("sparse data: {e}"))?;
                let buf = std::mem::take(&mut self.buf);
                let r = self.sink.write(id, offset + done, &buf[..n]);
                self.buf = buf;
                r?;
                done += n as u64;
            }
        }
        Ok(())
    }
}

/// Long names from GNU 'L' and 'K' headers, for the member that follows them.
struct Names {
    path: Option<Vec<u8>>,
    link: Option<Vec<u8>>,
}

fn trim_nul(mut v: Vec<u8>) -> Vec<u8> {
    while v.last() == Some(&0) {
        v.pop();
    }
    v
}

/// pax records: "LEN KEY=VALUE\n", LEN counting the whole record, so that values may hold
/// any byte.
fn parse_pax(data: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < data.len() {
        let Some(space) = data[pos..].iter().position(|&b| b == b' ') else {
            break;
        };
        let Some(len) = std::str::from_utf8(&data[pos..pos + space])
            .ok()
            .and_then(|s| s.parse::<usize>().ok())
        else {
            break;
        };
        if len <= space + 1 || pos + len > data.len() {
            break;
        }
        let record = &data[pos + space + 1..pos + len];
        let record = record.strip_suffix(b"\n").unwrap_or(record);
        if let Some(eq) = record.iter().position(|&b| b == b'=') {
            out.push((record[..eq].to_vec(), record[eq + 1..].to_vec()));
        }
        pos += len;
    }
    out
}

fn read_full(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match r.read(&mut buf[done..]) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}
