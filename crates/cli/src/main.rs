//! The `oleo` command. One file per verb, as a user's command maps to one place.

mod common;
use common::logging;
mod cp;
mod daemon;
mod device;
mod dump_super;
mod dump_tree;
mod extents;
mod filesystem;
mod inspect;
mod mkfs;
mod mount;
mod mount_stats;
mod property;
mod receive;
mod restore;
mod rootdir;
mod scrub;
mod send;
mod subvolume;
mod tar;
mod umount;

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "oleo",
    version,
    about = "btrfs in userspace: mount and inspect btrfs images without the kernel driver"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Mount a btrfs image or device through FUSE.
    Mount(mount::MountArgs),
    /// Unmount oleo mounts and wait until each server has written its final commit and
    /// released the image; exits with the server's status.
    Umount(umount::UmountArgs),
    /// Requests of each FUSE opcode the kernel has sent a running mount, and the server's
    /// mean time on each (root only).
    MountStats(mount_stats::MountStatsArgs),
    /// Print the superblock.
    DumpSuper {
        image: PathBuf,
        /// Which copy: 0 (primary), 1 (64 MiB) or 2 (256 GiB).
        #[arg(long, default_value_t = 0)]
        mirror: usize,
    },
    /// Print tree blocks and their items.
    DumpTree(dump_tree::DumpTreeArgs),
    /// Create a new btrfs on image files or block devices (several: a multi-device one).
    Mkfs(mkfs::MkfsArgs),
    /// Print a file's extents from the image, like `filefrag -v` (FUSE has no FIEMAP).
    Extents(extents::ExtentsArgs),
    /// Read-only forensics of an image: subvolumes, a file's versions across snapshots,
    /// an inode's attributes, xattrs and extents, deleted files and undelete.
    Inspect(inspect::InspectArgs),
    /// Create, snapshot, delete, list and show subvolumes, get and set the default one, on a
    /// mount or an image (`btrfs subvolume`).
    Subvolume(subvolume::SubvolumeArgs),
    /// Get or set a subvolume's read-only flag or a file's compression, on a mount or an
    /// image (`btrfs property`).
    Property(property::PropertyArgs),
    /// Show a filesystem's devices and space, on a mount or an image set (`btrfs
    /// filesystem show | df | usage`).
    Filesystem(filesystem::FilesystemArgs),
    /// Verify every copy of every block and repair bad copies from good ones, on a mount or
    /// an image or device set (`btrfs scrub`).
    Scrub(scrub::ScrubArgs),
    /// Copy files out of an image that will not mount (`btrfs restore`); never writes to it.
    Restore(restore::RestoreArgs),
    /// Device error counters (`btrfs device stats`), on a mount or an image or device set.
    Device(device::DeviceArgs),
    /// Apply send streams, full or incremental, on a mount or to an image (`btrfs
    /// receive`), or print one with `--dump`.
    Receive(receive::ReceiveArgs),
    /// Write a send stream, full or incremental (-p, -c), of read-only snapshots on a mount
    /// or in an image (`btrfs send`).
    Send(send::SendArgs),
    /// Copy files into an unmounted image, or out of one, as cp(1) does (SRC... IMAGE:DEST
    /// or IMAGE:SRC... DEST): no mount, no root, at library speed.
    Cp(cp::CpArgs),
    /// Extract a tar archive into an unmounted image (-x -f ARCHIVE -C IMAGE:DEST): no
    /// mount, no root, at library speed.
    Tar(tar::TarArgs),
}

/// mimalloc: the FUSE server allocates and frees from many threads (a queue's threads, the
/// commit thread); glibc's per-thread arenas made every request's allocations cold.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc's `purge_delay` option (its enum's position in mimalloc 3).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// A verb that runs once and exits keeps the memory it frees for its next allocations
/// instead of handing it back to the kernel after a second: `oleo cp`/`oleo tar` into an
/// image free and allocate tree blocks all along, and every page handed back was zeroed
/// again by the kernel at its next touch (13% of `oleo cp -a`'s time). The mount daemon
/// keeps mimalloc's default: it lives on, and hands back what a large transaction used.
fn keep_freed_memory() {
    // SAFETY: setting an option is allowed at any time; -1 means "never purge".
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, -1) };
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    // mount(8) runs helpers as `mount.fuse.oleo SOURCE TARGET -o OPTIONS`, and mount.fuse3
    // runs `oleo SOURCE TARGET -o OPTIONS`: both mean "mount".
    let helper = args.first().is_some_and(|a| {
        a.rsplit('/')
            .next()
            .is_some_and(|n| n.starts_with("mount."))
    });
    // `oleo send MNT/SNAP` has a directory second too: a subcommand's name is no SOURCE.
    let verb = |a: &str| {
        use clap::CommandFactory;
        Cli::command().get_subcommands().any(|c| c.get_name() == a)
    };
    let bare_mount = args.len() >= 3
        && !args[1].starts_with('-')
        && !verb(&args[1])
        && std::path::Path::new(&args[2]).is_dir();
    if helper || bare_mount {
        logging::init();
        return mount::run_helper(&args[1..]);
    }
    let cli = Cli::parse();
    logging::init();
    if !matches!(cli.command, Command::Mount(_)) {
        keep_freed_memory();
    }
    let result = match cli.command {
        Command::Mount(m) => return mount::run(m),
        Command::Umount(a) => return umount::run(&a),
        Command::MountStats(a) => mount_stats::run(&a),
        Command::DumpSuper { image, mirror } => dump_super::run(&image, mirror),
        Command::DumpTree(a) => dump_tree::run(&a),
        Command::Mkfs(a) => mkfs::run(&a),
        Command::Extents(a) => extents::run(&a),
        Command::Inspect(a) => inspect::run(&a),
        Command::Subvolume(a) => subvolume::run(&a),
        Command::Property(a) => property::run(&a),
        Command::Filesystem(a) => filesystem::run(&a),
        Command::Scrub(a) => match scrub::run(&a) {
            Ok(true) => return ExitCode::from(3),
            Ok(false) => Ok(()),
            Err(e) => Err(e),
        },
        Command::Restore(a) => restore::run(&a),
        Command::Receive(a) => receive::run(&a),
        Command::Send(a) => send::run(&a),
        Command::Cp(a) => match cp::run(&a) {
            Ok(true) => Ok(()),
            Ok(false) => return ExitCode::FAILURE,
            Err(e) => Err(e),
        },
        Command::Tar(a) => match tar::run(&a) {
            Ok(true) => Ok(()),
            Ok(false) => return ExitCode::FAILURE,
            Err(e) => Err(e),
        },
        Command::Device(a) => match device::run(&a) {
            Ok(true) => return ExitCode::from(64),
            Ok(false) => Ok(()),
            Err(e) => Err(e),
        },
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("oleo: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::MI_OPTION_PURGE_DELAY;

    /// The option set by number is the purge delay: mimalloc 3's default for it is 1000 ms
    /// (its neighbours, eager_commit_delay and use_numa_nodes, are 1 and 0).
    #[test]
    fn the_option_set_is_mimallocs_purge_delay() {
        if std::env::var_os("MIMALLOC_PURGE_DELAY").is_some() {
            return;
        }
        // SAFETY: reading an option.
        let get = |o| unsafe { libmimalloc_sys::mi_option_get(o) };
        assert_eq!(get(MI_OPTION_PURGE_DELAY), 1000);
        assert_eq!(get(MI_OPTION_PURGE_DELAY - 1), 1);
        assert_eq!(get(MI_OPTION_PURGE_DELAY + 1), 0);
    }
}
