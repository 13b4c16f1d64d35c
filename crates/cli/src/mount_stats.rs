//! `oleo mount-stats MOUNTPOINT`: how many requests of each FUSE opcode the kernel has sent
//! a running mount so far, and the server's mean time per request of each, from the
//! FUSE_STATS and FUSE_STATS_TIME ioctls on its root (root only), which the transport
//! answers for any server on it: an oleo mount or nullfs. Reading them costs the mount a
//! few requests of its own (an OPENDIR, the IOCTLs, a RELEASEDIR), counted too.

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

/// FUSE_STATS (counts) or FUSE_STATS_TIME (nanoseconds) by opcode slot
/// (`transport::counts`), on the mount's root `f` (at `path`).
fn read_slots(
    f: &std::fs::File,
    path: &std::path::Path,
    ioctl: u32,
) -> Result<[u64; counts::SLOTS], String> {
    let mut b = vec![0u8; cmd::FUSE_STATS_SIZE];
    crate::common::on_mount::raw_ioctl(f, ioctl, &mut b).map_err(|e| match e.raw_os_error() {
        Some(libc::EPERM) => {
            format!("{}: only root may read the request counts", path.display())
        }
        Some(libc::ENOTTY) | Some(libc::EINVAL) => format!(
            "{} is not the root of a mount served by oleo's FUSE transport",
            path.display()
        ),
        _ => format!("{}: {e}", path.display()),
    })?;
    Ok(counts::parse(&b))
}

pub fn run(args: &MountStatsArgs) -> Result<(), String> {
    let path = &args.path;
    let f =
        std::fs::File::open(path).map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    let c = read_slots(&f, path, cmd::FUSE_STATS)?;
    // None from a server that does not answer FUSE_STATS_TIME.
    let nanos = read_slots(&f, path, cmd::FUSE_STATS_TIME).ok();
    let rows: Vec<(String, u64, Option<u64>)> = (0..counts::SLOTS)
        .filter(|&i| c[i] > 0)
        .map(|i| {
            let name = counts::opcode_name(i as u32).into_owned();
            (name, c[i], nanos.map(|t| t[i]))
        })
        .collect();
    if args.oneline {
        let pairs: Vec<String> = rows.iter().map(|(n, v, _)| format!("{n}={v}")).collect();
        println!("{}", pairs.join(" "));
        return Ok(());
    }
    // The mean server time per request, in microseconds.
    let mean = |n: u64, ns: Option<u64>| match ns {
        Some(ns) if n > 0 => format!("{:.1}", ns as f64 / n as f64 / 1000.0),
        _ => "-".to_string(),
    };
    println!(
        "{:<20} {:>14} {:>16}",
        "opcode", "requests", "us per request"
    );
    for (n, v, ns) in &rows {
        println!("{n:<20} {v:>14} {:>16}", mean(*v, *ns));
    }
    let total_ns = nanos.map(|t| t.iter().sum::<u64>());
    let total = c.iter().sum::<u64>();
    println!("{:<20} {total:>14} {:>16}", "total", mean(total, total_ns));
    Ok(())
}
