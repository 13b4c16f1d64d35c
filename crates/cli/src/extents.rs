//! `oleo extents IMAGE PATH`: a file's extents, read from the image, in `filefrag -v`'s
//! layout. FUSE has no FIEMAP (its ioctl's variable-length reply cannot pass through FUSE's
//! restricted ioctls), so `filefrag` cannot ask a mount; this asks the image instead.
//! Offsets are in blocks of the filesystem's sector size; "physical" is the btrfs logical
//! address, as the kernel's btrfs FIEMAP reports it.

use oleo::format::items::Compression;
use oleo::{Filesystem, OpenOptions};
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
    let opts = OpenOptions {
        subvol: a
            .subvol
            .as_ref()
            .map(|s| s.trim_start_matches('/').as_bytes().to_vec()),
        ..OpenOptions::default()
    };
    let fs = Filesystem::open(&a.image, opts).map_err(|e| match e {
        oleo::Error::Busy(m) => match oleo_mount_of(&a.image) {
            Some(at) => format!(
                "{} is mounted by oleo at {}: `oleo extents` reads the image, which that mount \
                 is writing (FUSE cannot carry FIEMAP); unmount it first",
                a.image.display(),
                at.display()
            ),
            None => m,
        },
        e => format!("{}: {e}", a.image.display()),
    })?;
    let rel = a.path.trim_start_matches('/');
    let id = fs
        .resolve_path(fs.root(), rel.as_bytes())
        .map_err(|e| format!("{}: {e}", a.path))?;
    let size = fs.getattr(id).map_err(|e| format!("{}: {e}", a.path))?.size;
    let extents = fs
        .file_extents(id)
        .map_err(|e| format!("{}: {e}", a.path))?;
    let bs = u64::from(fs.superblock().sectorsize);
    println!(
        "Filesystem type is: 9123683e\nFile size of {} is {size} ({} blocks of {bs} bytes)",
        a.path,
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
        if e.inline {
            flags.extend(["inline", "not_aligned"]);
        }
        if e.prealloc {
            flags.push("unwritten");
        }
        if e.compression != Compression::None {
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
    println!(
        "{}: {n} extent{} found",
        a.path,
        if n == 1 { "" } else { "s" }
    );
    Ok(())
}

/// Where an oleo mount of `image` is, from mountinfo (its source is the image's path unless
/// fsname= changed it).
fn oleo_mount_of(image: &std::path::Path) -> Option<PathBuf> {
    let image = std::fs::canonicalize(image).ok()?;
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    info.lines().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        let point = crate::fuse_mount::unescape(left.split(' ').nth(4)?);
        let mut r = right.split(' ');
        let (fstype, source) = (r.next()?, crate::fuse_mount::unescape(r.next()?));
        (fstype == "fuse.oleo" && std::path::Path::new(&source) == image)
            .then(|| PathBuf::from(point))
    })
}
