//! `oleo mount-stats MOUNTPOINT`: how many requests of each FUSE opcode the kernel has sent
//! a running mount so far, from the FUSE_STATS ioctl on its root (root only), which the
//! transport answers for any server on it: an oleo mount or nullfs. Reading them costs the
//! mount a few requests of its own (an OPENDIR, the IOCTL, a RELEASEDIR), counted too.

use oleo_fuse::subvol_ioctl as cmd;
use oleo_fuse::transport::counts;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct MountStatsArgs {
    /// One line of `OPCODE=count` pairs (the non-zero ones) instead of a table.
    #[arg(long)]
    oneline: bool,
    /// The root of an oleo (or nullfs) mount.
    #[arg(value_name = "MOUNTPOINT")]
    path: PathBuf,
}

/// The mount's counts by opcode slot (`transport::counts`).
pub fn read(path: &std::path::Path) -> Result<[u64; counts::SLOTS], String> {
    let f =
        std::fs::File::open(path).map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    let mut b = vec![0u8; cmd::FUSE_STATS_SIZE];
    crate::common::on_mount::raw_ioctl(&f, cmd::FUSE_STATS, &mut b).map_err(|e| {
        match e.raw_os_error() {
            Some(libc::EPERM) => {
                format!("{}: only root may read the request counts", path.display())
            }
            Some(libc::ENOTTY) | Some(libc::EINVAL) => format!(
                "{} is not the root of a mount served by oleo's FUSE transport",
                path.display()
            ),
            _ => format!("{}: {e}", path.display()),
        }
    })?;
    Ok(counts::parse(&b))
}

pub fn run(args: &MountStatsArgs) -> Result<(), String> {
    let c = read(&args.path)?;
    let rows: Vec<(String, u64)> = (0..counts::SLOTS)
        .filter(|&i| c[i] > 0)
        .map(|i| (counts::opcode_name(i as u32).into_owned(), c[i]))
        .collect();
    if args.oneline {
        let pairs: Vec<String> = rows.iter().map(|(n, v)| format!("{n}={v}")).collect();
        println!("{}", pairs.join(" "));
        return Ok(());
    }
    println!("{:<16} {:>14}", "opcode", "requests");
    for (n, v) in &rows {
        println!("{n:<16} {v:>14}");
    }
    println!("{:<16} {:>14}", "total", c.iter().sum::<u64>());
    Ok(())
}
