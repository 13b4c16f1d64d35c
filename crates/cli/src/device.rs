//! `oleo device stats`: the devices' error counters (DEV_STATS items), as `btrfs device
//! stats` prints them, on an unmounted image or device set (`--image`, one per device).

use oleo::{Filesystem, OpenOptions};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct DeviceArgs {
    #[command(subcommand)]
    verb: Verb,
}

#[derive(clap::Subcommand)]
enum Verb {
    /// Print the error counters of each device.
    Stats {
        /// Image files or devices of the (unmounted) filesystem, one per --image.
        #[arg(long)]
        image: Vec<PathBuf>,
        /// A path on a mounted oleo filesystem (without --image).
        #[arg(required_unless_present = "image", conflicts_with = "image")]
        path: Option<PathBuf>,
        /// Exit with status 64 when a counter is not zero.
        #[arg(short = 'c', long = "check")]
        check: bool,
        /// Print the counters, then zero them.
        #[arg(short = 'z', long = "reset")]
        reset: bool,
        /// A table instead of one line per counter.
        #[arg(short = 'T')]
        table: bool,
        /// Open with a device missing, as -o degraded.
        #[arg(long)]
        degraded: bool,
    },
}

const NAMES: [&str; 5] = [
    "write_io_errs",
    "read_io_errs",
    "flush_io_errs",
    "corruption_errs",
    "generation_errs",
];

/// Runs the command; Ok(true) when `-c` found a non-zero counter (exit status 64).
pub fn run(args: &DeviceArgs) -> Result<bool, String> {
    let Verb::Stats {
        image,
        path,
        check,
        reset,
        table,
        degraded,
    } = &args.verb;
    if let Some(path) = path {
        let usage = crate::common::on_mount::fs_usage(path)?;
        let stats = crate::common::on_mount::dev_stats(path, *reset)?;
        let rows: Vec<(u64, String, [u64; 5])> = stats
            .devices
            .into_iter()
            .map(|(devid, v)| {
                let p = usage
                    .devices
                    .iter()
                    .find(|d| d.devid == devid)
                    .and_then(|d| d.path.as_ref())
                    .map_or_else(
                        || "<missing disk>".to_string(),
                        |p| String::from_utf8_lossy(p).into_owned(),
                    );
                (devid, p, v)
            })
            .collect();
        print(&rows, *table);
        return Ok(*check && rows.iter().any(|r| r.2.iter().any(|&x| x > 0)));
    }
    let opts = OpenOptions {
        read_only: !reset,
        devices: image[1..].to_vec(),
        degraded: *degraded,
        ..OpenOptions::default()
    };
    let show = |e: oleo::Error| format!("{}: {e}", image[0].display());
    let fs = if *reset {
        Filesystem::open_rw(&image[0], opts)
    } else {
        Filesystem::open(&image[0], opts)
    }
    .map_err(show)?;
    let stats = fs.device_stats().map_err(show)?;
    let rows: Vec<(u64, String, [u64; 5])> = stats
        .into_iter()
        .map(|(d, v)| {
            let path = d
                .path
                .map_or_else(|| "<missing disk>".into(), |p| p.display().to_string());
            (d.devid, path, v)
        })
        .collect();
    print(&rows, *table);
    let nonzero = rows.iter().any(|r| r.2.iter().any(|&x| x > 0));
    if *reset {
        fs.reset_device_stats().map_err(show)?;
        fs.close().map_err(show)?;
    }
    Ok(*check && nonzero)
}

/// The counters as `btrfs device stats` prints them (`-T`: a table).
fn print(rows: &[(u64, String, [u64; 5])], table: bool) {
    if table {
        let heads = [
            "Write errors",
            "Read errors",
            "Flush errors",
            "Corruption errors",
            "Generation errors",
        ];
        let pw = rows.iter().map(|r| r.1.len()).max().unwrap_or(0).max(4);
        let iw = rows
            .iter()
            .map(|r| r.0.to_string().len())
            .max()
            .unwrap_or(0)
            .max(2);
        let mut line = format!("{:>iw$} {:<pw$}", "Id", "Path");
        let mut rule = format!("{} {}", "-".repeat(iw), "-".repeat(pw));
        for h in heads {
            line += &format!(" {h}");
            rule += &format!(" {}", "-".repeat(h.len()));
        }
        println!("{line}");
        println!("{rule}");
        for (id, path, v) in rows {
            let mut l = format!("{id:>iw$} {path:<pw$}");
            for (h, x) in heads.iter().zip(v) {
                l += &format!(" {x:>w$}", w = h.len());
            }
            println!("{l}");
        }
    } else {
        for (_, path, v) in rows {
            for (n, x) in NAMES.iter().zip(v) {
                println!("[{path}].{n:<16} {x}");
            }
        }
    }
}
