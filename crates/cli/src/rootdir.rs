//! `oleo mkfs --rootdir DIR`: fill the new filesystem from a directory, with a progress bar
//! on a terminal. The copy itself is the engine's (oleo::mkfs::rootdir).

use oleo::mkfs::rootdir::{self, Progress};
use oleo::{Filesystem, OpenOptions};
use std::io::IsTerminal;
use std::path::Path;

/// A size that holds `src`: its data, a metadata block per inode twice over (DUP), and room
/// for the chunks every filesystem starts with. Rounded up to a MiB.
pub fn size_for(src: &Path) -> Result<u64, String> {
    let need = rootdir::measure(src).map_err(|e| e.to_string())?;
    let data = need.bytes + need.bytes / 8;
    let metadata = need.inodes * 2 * 16384;
    let size = (data + metadata + (256 << 20)).next_multiple_of(1 << 20);
    Ok(size)
}

/// Copies `src` into the filesystem just made on `image`, then commits.
pub fn fill(image: &Path, src: &Path, quiet: bool) -> Result<(), String> {
    let fs = Filesystem::open_rw(image, OpenOptions::default())
        .map_err(|e| format!("{}: {e}", image.display()))?;
    let bar = if !quiet && std::io::stderr().is_terminal() {
        let total = rootdir::measure(src).map_err(|e| e.to_string())?;
        let bar = indicatif::ProgressBar::new(total.bytes);
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{bar:40} {bytes}/{total_bytes} {msg} ({eta} left)",
            )
            .expect("a valid template"),
        );
        Some((bar, total.inodes))
    } else {
        None
    };
    let mut tick = |p: &Progress, _path: &Path| {
        if let Some((bar, inodes)) = &bar {
            bar.set_position(p.bytes);
            bar.set_message(format!("{}/{} inodes", p.inodes, inodes));
        }
    };
    let r = rootdir::fill(&fs, src, &mut tick).map_err(|e| e.to_string());
    if let Some((bar, _)) = &bar {
        bar.finish_and_clear();
    }
    r?;
    fs.close()
        .map_err(|e| format!("{}: final commit: {e}", image.display()))
}
