//! `oleo scrub start | status`: `btrfs scrub`, with its output, on a mount (its server
//! scrubs in the background while it serves; `-B` waits) or on an unmounted image or
//! device set (`--image`, repeated for each device: in the foreground, its result kept in
//! a status file per filesystem uuid for `status`), with progress on a terminal.

use oleo::format::bytes::uuid_string;
use oleo::{Filesystem, OpenOptions, ScrubOptions, ScrubProgress};
use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};

#[derive(clap::Args)]
pub struct ScrubArgs {
    #[command(subcommand)]
    verb: Verb,
}

#[derive(clap::Subcommand)]
enum Verb {
    /// Read and verify every copy of every block; rewrite bad copies from good ones.
    Start {
        /// Image files or devices of the (unmounted) filesystem, one per --image.
        #[arg(long)]
        image: Vec<PathBuf>,
        /// A path on a mounted oleo filesystem (without --image): its server scrubs it in
        /// the background while it serves.
        #[arg(required_unless_present = "image", conflicts_with = "image")]
        path: Option<PathBuf>,
        /// Wait for the end and print the result (an image scrub always does).
        #[arg(short = 'B')]
        no_background: bool,
        /// Read-only: report errors, repair nothing.
        #[arg(short = 'r')]
        readonly: bool,
        /// Print the counters of each device.
        #[arg(short = 'd')]
        per_device: bool,
        /// Print the raw counters.
        #[arg(short = 'R')]
        raw: bool,
        /// Quiet: no summary.
        #[arg(short = 'q')]
        quiet: bool,
        /// Also print each bad or repaired range as it is found (an image scrub; otherwise
        /// those lines go to syslog, as the kernel's go to its log, and a mount's to the
        /// mount's log).
        #[arg(short = 'v')]
        verbose: bool,
        /// At most this many bytes per second (suffixes K, M, G).
        #[arg(long)]
        limit: Option<String>,
        /// Mount with a device missing, as -o degraded.
        #[arg(long)]
        degraded: bool,
    },
    /// Print the result of the last scrub of the filesystem.
    Status {
        #[arg(long)]
        image: Vec<PathBuf>,
        /// A path on a mounted oleo filesystem (without --image).
        #[arg(required_unless_present = "image", conflicts_with = "image")]
        path: Option<PathBuf>,
        #[arg(short = 'd')]
        per_device: bool,
        #[arg(short = 'R')]
        raw: bool,
    },
}

/// What a finished scrub leaves for `status`.
struct Record {
    fsid: String,
    started: i64,
    duration: u64,
    /// "finished", "running", "aborted".
    status: &'static str,
    devices: BTreeMap<u64, (String, ScrubProgress)>,
    /// Each device's allocated bytes (DEV_ITEM bytes_used): btrfs-progs' "Total to scrub"
    /// of a device, and summed over the devices, of the filesystem. Every copy counts.
    allocated: BTreeMap<u64, u64>,
}

/// A mount's scrub status as a record to print.
fn record_of(
    st: &oleo_fuse::subvol_ioctl::ScrubStatus,
    usage: &oleo_fuse::subvol_ioctl::FsUsage,
) -> Record {
    let path_of = |devid: u64| {
        usage
            .devices
            .iter()
            .find(|d| d.devid == devid)
            .and_then(|d| d.path.as_ref())
            .map_or_else(
                || "<missing disk>".to_string(),
                |p| String::from_utf8_lossy(p).into_owned(),
            )
    };
    Record {
        fsid: uuid_string(&usage.fsid),
        started: st.started as i64,
        duration: st.duration,
        status: match st.state {
            1 => "running",
            3 => "aborted",
            _ => "finished",
        },
        devices: st
            .devices
            .iter()
            .map(|(d, c)| {
                (
                    *d,
                    (path_of(*d), oleo_fuse::subvol_ioctl::scrub_progress(c)),
                )
            })
            .collect(),
        allocated: usage
            .devices
            .iter()
            .map(|d| (d.devid, d.bytes_used))
            .collect(),
    }
}

/// Waits for the mount's scrub to end (`start -B`), progress on a terminal.
fn wait_on_mount(path: &Path, usage: &oleo_fuse::subvol_ioctl::FsUsage) -> Result<Record, String> {
    let tty = std::io::stderr().is_terminal();
    loop {
        let st = crate::common::on_mount::scrub_status(path)?;
        if st.state != 1 {
            if tty {
                eprint!("\r\x1b[K");
            }
            if st.state == 3 {
                return Err(format!(
                    "{}: the scrub failed (see the mount's log)",
                    path.display()
                ));
            }
            return Ok(record_of(&st, usage));
        }
        if tty {
            let done: u64 = st.devices.iter().map(|(_, c)| c[2] + c[3]).sum();
            eprint!("\rscrubbed {}", pretty(done));
            let _ = std::io::stderr().flush();
        }
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
}

/// What btrfs-progs says after a scrub's report; true when errors were uncorrectable (the
/// exit status is then 3, as btrfs scrub's).
fn finished(rec: &Record) -> bool {
    let total = total(rec);
    if total.uncorrectable_errors > 0 {
        eprintln!(
            "ERROR: there are uncorrectable errors ({} sectors)",
            total.uncorrectable_errors
        );
        return true;
    }
    if total.corrected_errors > 0 || total.unverified_errors > 0 {
        eprintln!("WARNING: errors detected during scrubbing, corrected");
    }
    false
}

const FIELDS: &[&str] = &[
    "data_extents_scrubbed",
    "tree_extents_scrubbed",
    "data_bytes_scrubbed",
    "tree_bytes_scrubbed",
    "read_errors",
    "csum_errors",
    "verify_errors",
    "no_csum",
    "csum_discards",
    "super_errors",
    "malloc_errors",
    "uncorrectable_errors",
    "unverified_errors",
    "corrected_errors",
    "last_physical",
];

fn get(p: &ScrubProgress, f: &str) -> u64 {
    match f {
        "data_extents_scrubbed" => p.data_extents_scrubbed,
        "tree_extents_scrubbed" => p.tree_extents_scrubbed,
        "data_bytes_scrubbed" => p.data_bytes_scrubbed,
        "tree_bytes_scrubbed" => p.tree_bytes_scrubbed,
        "read_errors" => p.read_errors,
        "csum_errors" => p.csum_errors,
        "verify_errors" => p.verify_errors,
        "no_csum" => p.no_csum,
        "csum_discards" => p.csum_discards,
        "super_errors" => p.super_errors,
        "malloc_errors" => p.malloc_errors,
        "uncorrectable_errors" => p.uncorrectable_errors,
        "unverified_errors" => p.unverified_errors,
        "corrected_errors" => p.corrected_errors,
        "last_physical" => p.last_physical,
        _ => 0,
    }
}

fn set(p: &mut ScrubProgress, f: &str, v: u64) {
    let slot = match f {
        "data_extents_scrubbed" => &mut p.data_extents_scrubbed,
        "tree_extents_scrubbed" => &mut p.tree_extents_scrubbed,
        "data_bytes_scrubbed" => &mut p.data_bytes_scrubbed,
        "tree_bytes_scrubbed" => &mut p.tree_bytes_scrubbed,
        "read_errors" => &mut p.read_errors,
        "csum_errors" => &mut p.csum_errors,
        "verify_errors" => &mut p.verify_errors,
        "no_csum" => &mut p.no_csum,
        "csum_discards" => &mut p.csum_discards,
        "super_errors" => &mut p.super_errors,
        "malloc_errors" => &mut p.malloc_errors,
        "uncorrectable_errors" => &mut p.uncorrectable_errors,
        "unverified_errors" => &mut p.unverified_errors,
        "corrected_errors" => &mut p.corrected_errors,
        "last_physical" => &mut p.last_physical,
        _ => return,
    };
    *slot = v;
}

/// Runs the command; Ok(true) when a scrub found uncorrectable errors (exit status 3).
pub fn run(args: &ScrubArgs) -> Result<bool, String> {
    match &args.verb {
        Verb::Start {
            path: Some(path),
            readonly,
            per_device,
            raw,
            quiet,
            limit,
            no_background,
            ..
        } => {
            let limit = limit.as_deref().map(parse_limit).transpose()?.unwrap_or(0);
            crate::common::on_mount::scrub_start(path, *readonly, limit)?;
            let usage = crate::common::on_mount::fs_usage(path)?;
            if !*no_background {
                if !*quiet {
                    println!(
                        "scrub started on {}, fsid {} (in the server of the mount)",
                        path.display(),
                        uuid_string(&usage.fsid)
                    );
                }
                return Ok(false);
            }
            let rec = wait_on_mount(path, &usage)?;
            if !*quiet {
                print_record(&rec, *per_device, *raw, true);
            }
            Ok(finished(&rec))
        }
        Verb::Start {
            image,
            readonly,
            per_device,
            raw,
            quiet,
            verbose,
            limit,
            degraded,
            ..
        } => {
            if !*verbose {
                // The engine's lines: a bad copy found, a range repaired (its target is
                // `oleo::...`, as this binary's own, which prints with eprintln here).
                crate::common::logging::details_off_terminal("oleo::");
            }
            start(
                image,
                *readonly,
                *per_device,
                *raw,
                *quiet,
                limit.as_deref(),
                *degraded,
            )
        }
        Verb::Status {
            path: Some(path),
            per_device,
            raw,
            ..
        } => {
            let usage = crate::common::on_mount::fs_usage(path)?;
            let st = crate::common::on_mount::scrub_status(path)?;
            if st.state == 0 {
                return Err(format!(
                    "no scrub of {} since it was mounted",
                    path.display()
                ));
            }
            print_record(&record_of(&st, &usage), *per_device, *raw, false);
            Ok(false)
        }
        Verb::Status {
            image,
            per_device,
            raw,
            ..
        } => {
            let fsid = fsid_of(&image[0])?;
            let rec =
                load(&fsid)?.ok_or_else(|| format!("no scrub of filesystem {fsid} recorded"))?;
            print_record(&rec, *per_device, *raw, false);
            Ok(false)
        }
    }
}

fn parse_limit(s: &str) -> Result<u64, String> {
    let (num, mul) = match s.chars().last() {
        Some('k' | 'K') => (&s[..s.len() - 1], 1u64 << 10),
        Some('m' | 'M') => (&s[..s.len() - 1], 1 << 20),
        Some('g' | 'G') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<u64>()
        .map(|n| n * mul)
        .map_err(|_| format!("--limit {s}: a number of bytes per second (K, M, G suffixes)"))
}

fn start(
    images: &[PathBuf],
    readonly: bool,
    per_device: bool,
    raw: bool,
    quiet: bool,
    limit: Option<&str>,
    degraded: bool,
) -> Result<bool, String> {
    let rate_limit = limit.map(parse_limit).transpose()?;
    let opts = OpenOptions {
        read_only: readonly,
        devices: images[1..].to_vec(),
        degraded,
        ..OpenOptions::default()
    };
    let show = |e: oleo::Error| format!("{}: {e}", images[0].display());
    let fs = if readonly {
        Filesystem::open(&images[0], opts)
    } else {
        Filesystem::open_rw(&images[0], opts)
    }
    .map_err(show)?;
    let sb = fs.superblock();
    let fsid = uuid_string(&sb.fsid);
    let devices = fs.devices().map_err(show)?;
    let allocated: BTreeMap<u64, u64> = devices.iter().map(|d| (d.devid, d.bytes_used)).collect();
    let paths: BTreeMap<u64, String> = devices
        .into_iter()
        .map(|d| {
            let p = d
                .path
                .map_or("<missing disk>".into(), |p| p.display().to_string());
            (d.devid, p)
        })
        .collect();
    let started = now();
    let t0 = std::time::Instant::now();
    let tty = std::io::stderr().is_terminal();
    let mut last = std::time::Instant::now();
    let result = fs.scrub(
        &ScrubOptions {
            readonly,
            rate_limit,
        },
        &mut |p| {
            if tty && last.elapsed().as_millis() >= 200 {
                last = std::time::Instant::now();
                let done: u64 = p
                    .values()
                    .map(|s| s.data_bytes_scrubbed + s.tree_bytes_scrubbed)
                    .sum();
                eprint!("\rscrubbed {}", pretty(done));
                let _ = std::io::stderr().flush();
            }
        },
    );
    if tty {
        eprint!("\r\x1b[K");
    }
    let stats = result.map_err(show)?;
    if !readonly {
        fs.close().map_err(show)?;
    }
    let rec = Record {
        fsid: fsid.clone(),
        started,
        duration: t0.elapsed().as_secs(),
        status: "finished",
        devices: stats
            .into_iter()
            .map(|(d, s)| (d, (paths.get(&d).cloned().unwrap_or_default(), s)))
            .collect(),
        allocated,
    };
    if let Err(e) = save(&rec) {
        eprintln!("oleo: could not keep the scrub's result for `oleo scrub status`: {e}");
    }
    if !quiet {
        print_record(&rec, per_device, raw, true);
    }
    Ok(finished(&rec))
}

fn total(rec: &Record) -> ScrubProgress {
    let mut t = ScrubProgress::default();
    for (_, s) in rec.devices.values() {
        t.add(s);
    }
    t
}

/// The report `btrfs scrub start -B` / `btrfs scrub status` prints.
/// "Total to scrub" as btrfs-progs 6.2 gives it: a device's allocated bytes, and for the
/// filesystem after `start` their sum (every copy counts). `status` of the filesystem gives
/// the bytes in use times their copies, which for a finished scrub is what it read.
fn print_record(rec: &Record, per_device: bool, raw: bool, done: bool) {
    if !done {
        println!("UUID:             {}", rec.fsid);
    } else if !per_device {
        println!("scrub done for {}", rec.fsid);
    }
    let header = |rec: &Record| {
        println!("Scrub started:    {}", ctime(rec.started));
        println!("Status:           {}", rec.status);
        let d = rec.duration;
        println!(
            "Duration:         {}:{:02}:{:02}",
            d / 3600,
            d / 60 % 60,
            d % 60
        );
    };
    let body = |p: &ScrubProgress, to_scrub: Option<u64>| {
        if raw {
            for f in FIELDS {
                println!("\t{f}: {}", get(p, f));
            }
            return;
        }
        let bytes = p.data_bytes_scrubbed + p.tree_bytes_scrubbed;
        println!("Total to scrub:   {}", pretty(to_scrub.unwrap_or(bytes)));
        let rate = bytes.checked_div(rec.duration).unwrap_or(0);
        println!("Rate:             {}/s", pretty(rate));
        summary(p);
    };
    if per_device {
        for (devid, (path, s)) in &rec.devices {
            println!();
            let what = if done { "done" } else { "history" };
            println!("Scrub device {path} (id {devid}) {what}");
            header(rec);
            body(s, rec.allocated.get(devid).copied());
        }
    } else {
        header(rec);
        let allocated = (done && !rec.allocated.is_empty()).then(|| rec.allocated.values().sum());
        body(&total(rec), allocated);
    }
}

fn summary(p: &ScrubProgress) {
    let mut parts = Vec::new();
    for (name, v) in [
        ("read", p.read_errors),
        ("super", p.super_errors),
        ("verify", p.verify_errors),
        ("csum", p.csum_errors),
    ] {
        if v > 0 {
            parts.push(format!("{name}={v}"));
        }
    }
    if parts.is_empty() && p.uncorrectable_errors == 0 && p.corrected_errors == 0 {
        println!("Error summary:    no errors found");
        return;
    }
    println!("Error summary:    {}", parts.join(" "));
    println!("  Corrected:      {}", p.corrected_errors);
    println!("  Uncorrectable:  {}", p.uncorrectable_errors);
    println!("  Unverified:     {}", p.unverified_errors);
}

/// A size as btrfs-progs prints it by default: binary units, two decimals.
fn pretty(n: u64) -> String {
    const UNITS: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let mut v = n as f64;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < UNITS.len() {
        v /= 1024.0;
        i += 1;
    }
    format!("{v:.2}{}", UNITS[i])
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// A time as ctime(3) prints it, in local time.
fn ctime(t: i64) -> String {
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    let tt = t as libc::time_t;
    // SAFETY: both pointers are valid for the call.
    unsafe { libc::localtime_r(&tt, &mut tm) };
    let mut buf = [0u8; 64];
    let fmt = c"%a %b %e %H:%M:%S %Y";
    // SAFETY: buf is writable for its length; fmt is NUL-terminated; tm was filled above.
    let n = unsafe { libc::strftime(buf.as_mut_ptr().cast(), buf.len(), fmt.as_ptr(), &tm) };
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

fn fsid_of(image: &Path) -> Result<String, String> {
    let mut f = std::fs::File::open(image).map_err(|e| format!("{}: {e}", image.display()))?;
    let mut buf = vec![0u8; oleo::format::superblock::SUPER_INFO_SIZE];
    use std::io::{Read, Seek, SeekFrom};
    f.seek(SeekFrom::Start(
        oleo::format::superblock::SUPER_PRIMARY_OFFSET,
    ))
    .and_then(|_| f.read_exact(&mut buf))
    .map_err(|e| format!("{}: {e}", image.display()))?;
    let sb = oleo::format::Superblock::parse(&buf)
        .map_err(|e| format!("{}: not a btrfs filesystem: {e}", image.display()))?;
    Ok(uuid_string(&sb.fsid))
}

/// Where the result of the last scrub of `fsid` is kept.
fn status_file(fsid: &str) -> Result<PathBuf, String> {
    let base = std::env::var_os("XDG_STATE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/state")))
        .ok_or("no XDG_STATE_HOME or HOME to keep the scrub status in")?;
    Ok(base.join("oleo").join("scrub").join(fsid))
}

fn save(rec: &Record) -> Result<(), String> {
    let path = status_file(&rec.fsid)?;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    let mut text = format!("started {}\nduration {}\n", rec.started, rec.duration);
    for (devid, bytes) in &rec.allocated {
        text += &format!("allocated {devid} {bytes}\n");
    }
    for (devid, (p, s)) in &rec.devices {
        text += &format!("device {devid} {p}\n");
        for f in FIELDS {
            text += &format!("{devid} {f} {}\n", get(s, f));
        }
    }
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text)
        .and_then(|()| std::fs::rename(&tmp, &path))
        .map_err(|e| format!("{}: {e}", path.display()))
}

fn load(fsid: &str) -> Result<Option<Record>, String> {
    let path = status_file(fsid)?;
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    let mut rec = Record {
        fsid: fsid.to_string(),
        started: 0,
        duration: 0,
        status: "finished",
        devices: BTreeMap::new(),
        allocated: BTreeMap::new(),
    };
    for line in text.lines() {
        let w: Vec<&str> = line.splitn(3, ' ').collect();
        match w.as_slice() {
            ["started", v] => rec.started = v.parse().unwrap_or(0),
            ["duration", v] => rec.duration = v.parse().unwrap_or(0),
            ["allocated", id, v] => {
                if let (Ok(id), Ok(v)) = (id.parse(), v.parse()) {
                    rec.allocated.insert(id, v);
                }
            }
            ["device", id, p] => {
                if let Ok(id) = id.parse() {
                    rec.devices
                        .insert(id, (p.to_string(), ScrubProgress::default()));
                }
            }
            [id, f, v] => {
                if let (Ok(id), Ok(v)) = (id.parse::<u64>(), v.parse()) {
                    if let Some((_, s)) = rec.devices.get_mut(&id) {
                        set(s, f, v);
                    }
                }
            }
            _ => {}
        }
    }
    Ok(Some(rec))
}
