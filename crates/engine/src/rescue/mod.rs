//! Rescue: copy files out of an image that will not mount, as `btrfs restore` does, and
//! find deleted files whose old tree leaves are still on disk ([`Undelete`]).
//!
//! Nothing here writes to the image. Every tree is read tolerantly: a block that fails on
//! all its copies is reported and walked around, so what survives is still restored.

mod chunk_scan;
mod data;
mod find_root;
mod open;
mod restore;
mod undelete;
mod walk;

use std::path::{Path, PathBuf};

pub use crate::error::Result;
pub use find_root::RootCandidate;
pub use undelete::{DataState, DeletedInode, Undelete};

/// Accepts a path (like `/dir/file`) to restore.
pub type PathFilter = Box<dyn Fn(&str) -> bool>;
/// Hears each path restored.
pub type PathSink = Box<dyn FnMut(&Path)>;

/// What to restore and how.
#[derive(Default)]
pub struct RestoreOptions {
    /// Superblock copy to use (0, 1 or 2); `None` takes the newest valid one.
    pub super_copy: Option<usize>,
    /// Root tree root block to use instead of the superblock's and its backups'.
    pub tree_root: Option<u64>,
    /// Subvolume to restore; `None` is the top level (tree 5) with its nested subvolumes.
    pub root: Option<u64>,
    /// Only print what would be restored.
    pub dry_run: bool,
    /// Also try the roots of older generations that a scan of the metadata chunks finds
    /// (btrfs-find-root), newest first, for a tree whose every known root is unreadable.
    pub older: bool,
    /// Restores only paths (like `/dir/file`) this accepts, with their parent directories.
    pub filter: Option<PathFilter>,
    /// Called with each path as it is restored (or would be, on a dry run).
    pub on_path: Option<PathSink>,
}

/// A tree block that could not be read from any copy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SkippedBlock {
    /// Logical address of the block.
    pub bytenr: u64,
    /// The tree it belongs to.
    pub owner: u64,
    /// Why it was refused.
    pub why: String,
}

/// What a restore did.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// Regular files restored with every byte.
    pub files_whole: u64,
    /// Files restored with holes where data could not be read: the path and its
    /// unreadable byte ranges `(start, end)`.
    pub files_with_holes: Vec<(PathBuf, Vec<(u64, u64)>)>,
    /// Files restored with data whose checksums could not be read (a csum item that
    /// fails its checks): the path and how many bytes were copied unverified. Each is also
    /// counted as whole or with holes.
    pub files_unverified: Vec<(PathBuf, u64)>,
    /// Directories restored.
    pub dirs: u64,
    /// Symbolic links restored.
    pub symlinks: u64,
    /// FIFOs, sockets and device nodes made.
    pub specials: u64,
    /// Names whose inode (or data) was not found.
    pub names_without_inode: Vec<PathBuf>,
    /// Tree blocks skipped.
    pub skipped_blocks: Vec<SkippedBlock>,
    /// Other failures (a file that could not be created, a special file left out, ...).
    pub errors: Vec<String>,
}

/// Copies every reachable file of the image at `image` into the directory `dest`.
pub fn restore(image: &Path, dest: &Path, options: RestoreOptions) -> Result<Report> {
    let mut report = Report::default();
    let mut img = open::open(image, options.super_copy, options.tree_root, &mut report)?;
    if options.older {
        img.older = find_root::scan(&img.io, &img.sb);
    }
    restore::run(&img, dest, options, &mut report)?;
    Ok(report)
}

/// The roots of every tree that the image's metadata chunks still hold, newest generation
/// first, as btrfs-find-root lists them (read-only).
pub fn find_roots(image: &Path, super_copy: Option<usize>) -> Result<Vec<RootCandidate>> {
    let mut report = Report::default();
    let img = open::open(image, super_copy, None, &mut report)?;
    Ok(find_root::scan(&img.io, &img.sb))
}
