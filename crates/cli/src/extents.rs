//! `oleo extents IMAGE PATH`: a file's extents in `filefrag -v`'s layout, read from the
//! image, or asked of the daemon through the mount when oleo has the image mounted. FUSE
//! has no FIEMAP (its ioctl's variable-length reply cannot pass through FUSE's restricted
//! ioctls), so `filefrag` cannot ask a mount; oleo's own fixed-size ioctl pages through.
//! Offsets are in blocks of the filesystem's sector size; "physical" is the btrfs logical
//! address, as the kernel's btrfs FIEMAP reports it.

use oleo::format::items::Compression;
use oleo::{Filesystem, OpenOptions};
use oleo_fuse::subvol_ioctl::{Extent, EXTENT_ENCODED, EXTENT_INLINE, EXTENT_PREALLOC};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct ExtentsArgs {
    /// Image file or block device.
    image: PathBuf,
    /// Path of the file inside the filesystem (from its default subvolume's root).
    path: String,
    /// Subvolume path to start from instead of the default subvolume.
    #[arg(long)]
    subvol: Option<String>,
}

pub fn run(a: &ExtentsArgs) -> Result<(), String> {
    let rel = a.path.trim_start_matches('/');
    // A mounted image is being written by its daemon: ask it, through the mount.
    if let Some(at) = oleo_mount_of(&a.image) {
        if a.subvol.is_some() {
            return Err(format!(
                "{} is mounted by oleo at {}: give the file's path on the mount instead of \
                 --subvol",
                a.image.display(),
                at.display()
            ));
        }
        let (size, bs, extents) = crate::common::on_mount::extents(&at.join(rel))?;
        print(&a.path, size, u64::from(bs), &extents);
        return Ok(());
    }
    let opts = OpenOptions {
        subvol: a
            .subvol
            .as_ref()
            .map(|s| s.trim_start_matches('/').as_bytes().to_vec()),
        ..OpenOptions::default()
    };
    let fs = Filesystem::open(&a.image, opts).map_err(|e| format!("{}: {e}", a.image.display()))?;
    let id = fs
        .resolve_path(fs.root(), rel.as_bytes())
        .map_err(|e| format!("{}: {e}", a.path))?;
    let size = fs.getattr(id).map_err(|e| format!("{}: {e}", a.path))?.size;
    let extents: Vec<Extent> = fs
        .file_extents(id)
        .map_err(|e| format!("{}: {e}", a.path))?
        .into_iter()
        .map(|e| Extent {
            file_offset: e.file_offset,
            len: e.len,
            logical: e.logical,
            flags: if e.inline { EXTENT_INLINE } else { 0 }
                | if e.prealloc { EXTENT_PREALLOC } else { 0 }
                | if e.compression != Compression::None {
                    EXTENT_ENCODED
                } else {
                    0
                },
        })
        .collect();
    print(
        &a.path,
        size,
        u64::from(fs.superblock().sectorsize),
        &extents,
    );
    Ok(())
}

/// `filefrag -v`'s layout.
fn print(path: &str, size: u64, bs: u64, extents: &[Extent]) {
    println!(
        "Filesystem type is: 9123683e\nFile size of {path} is {size} ({} blocks of {bs} bytes)",
        size.div_ceil(bs)
    );
    println!(" ext:     logical_offset:        physical_offset: length:   expected: flags:");
    let n = extents.len();
    for (i, e) in extents.iter().enumerate() {
        let first = e.file_offset / bs;
        let last = (e.file_offset + e.len).div_ceil(bs).saturating_sub(1);
        let (p0, p1) = match e.logical {
            Some(l) => (l / bs, l / bs + (last - first)),
            None => (0, 0),
        };
        let mut flags = Vec::new();
        if e.flags & EXTENT_INLINE != 0 {
            flags.extend(["inline", "not_aligned"]);
        }
        if e.flags & EXTENT_PREALLOC != 0 {
            flags.push("unwritten");
        }
        if e.flags & EXTENT_ENCODED != 0 {
            flags.push("encoded");
        }
        if i + 1 == n {
            flags.push("last");
            if e.file_offset + e.len >= size {
                flags.push("eof");
            }
        }
        println!(
            "{i:>4}: {first:>10}..{last:>10}: {p0:>10}..{p1:>10}: {:>6}: {:>11} {}",
            last - first + 1,
            "",
            flags.join(",")
        );
    }
    println!("{path}: {n} extent{} found", if n == 1 { "" } else { "s" });
}

/// Where an oleo mount of `image` is, from mountinfo (its source is the image's path unless
/// fsname= changed it).
fn oleo_mount_of(image: &std::path::Path) -> Option<PathBuf> {
    let image = std::fs::canonicalize(image).ok()?;
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    info.lines().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        let point = crate::daemon::fuse_mount::unescape(left.split(' ').nth(4)?);
        let mut r = right.split(' ');
        let (fstype, source) = (r.next()?, crate::daemon::fuse_mount::unescape(r.next()?));
        (fstype == "fuse.oleo" && std::path::Path::new(&source) == image)
            .then(|| PathBuf::from(point))
    })
}
