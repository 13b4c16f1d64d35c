//! `oleo receive`: `btrfs receive`. `--dump` prints a send stream (`dump`); `--image IMAGE
//! DIR` applies it to an image or device nothing has mounted, through the engine (`apply`);
//! DIR alone is a directory on an oleo mount, whose server applies it with the same code
//! (`crate::daemon::streams`).

mod apply;
mod data;
mod dump;

pub use apply::{receive_into, Options};
use oleo_fuse::Note;
use std::io::Read;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct ReceiveArgs {
    /// Print the stream's commands, one line each, as `btrfs receive --dump` does.
    #[arg(long)]
    dump: bool,
    /// Read the stream from FILE instead of standard input.
    #[arg(short = 'f', value_name = "FILE")]
    file: Option<PathBuf>,
    /// Image file or block device (not mounted) to receive into; DIR is then a directory
    /// inside it, from its top level. Without it DIR is a directory on an oleo mount.
    #[arg(long, value_name = "IMAGE")]
    image: Option<PathBuf>,
    /// Stop after the first END command. Without it every stream of the input is received
    /// (`btrfs send A B` writes one after the other).
    #[arg(short = 'e')]
    end: bool,
    /// Accepted for btrfs's -C (chroot into DIR) and ignored: the stream's paths never
    /// leave the subvolume they build, and parents and clone sources are found anywhere in
    /// the filesystem, as btrfs finds them after its chroot.
    #[arg(short = 'C', long = "chroot")]
    chroot: bool,
    /// Print nothing but errors (and no progress line on a terminal).
    #[arg(short = 'q', long)]
    quiet: bool,
    /// Where the received subvolumes go: a directory on an oleo mount, or inside IMAGE with
    /// --image.
    #[arg(value_name = "DIR")]
    target: Option<PathBuf>,
}

pub fn run(a: &ReceiveArgs) -> Result<(), String> {
    if a.dump {
        if let Some(t) = &a.target {
            return Err(format!("--dump takes no destination ({})", t.display()));
        }
        if a.image.is_some() {
            return Err("--dump takes no --image".into());
        }
        let (input, name) = open_input(a)?;
        return dump::run(input, &name);
    }
    let Some(target) = &a.target else {
        return Err("give the directory to receive into (DIR), or --dump".into());
    };
    let (input, name) = open_input(a)?;
    let Some(image) = &a.image else {
        return crate::daemon::streams::receive(target, input, &name, a.end, a.quiet);
    };
    let dir = target
        .to_str()
        .ok_or_else(|| format!("{}: DIR must be valid UTF-8", target.display()))?;
    let opts = apply::Options {
        honor_end: a.end,
        quiet: a.quiet,
    };
    let meter = crate::common::progress::Meter::new(a.quiet);
    let mut input = meter.reader(input);
    let mut note = |n: Note| match n {
        Note::Stdout(s) => {
            meter.clear();
            println!("{s}");
        }
        Note::Stderr(s) => {
            meter.clear();
            eprintln!("{s}");
        }
        Note::Made { .. } => {}
    };
    apply::run(image, dir, &mut input, &name, &opts, &mut note)
}

/// The stream and how errors name it ("FILE: ", nothing for standard input).
fn open_input(a: &ReceiveArgs) -> Result<(Box<dyn Read + Send>, String), String> {
    Ok(match &a.file {
        Some(f) => {
            let file = std::fs::File::open(f).map_err(|e| format!("{}: {e}", f.display()))?;
            (Box::new(file), format!("{}: ", f.display()))
        }
        None => (Box::new(std::io::stdin()), String::new()),
    })
}
