//! `oleo property get|set PATH ro [true|false]`: `btrfs property` for a subvolume's
//! read-only flag, on a mounted oleo filesystem or (`--image`) on an image or device that
//! is not mounted.

use crate::on_mount;
use crate::subvolume::{open, shown, subvolume_at};
use std::path::Path;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct PropertyArgs {
    #[command(subcommand)]
    verb: Verb,
}

#[derive(clap::Subcommand)]
enum Verb {
    /// Print a property of the subvolume at PATH (all of them without NAME).
    Get {
        /// Image file or block device (not mounted) to work on instead of a mount.
        #[arg(long)]
        image: Option<PathBuf>,
        path: String,
        name: Option<String>,
    },
    /// Set a property of the subvolume at PATH.
    Set {
        #[arg(long)]
        image: Option<PathBuf>,
        /// Make a received subvolume writable (clears its received_uuid).
        #[arg(short = 'f')]
        force: bool,
        path: String,
        name: String,
        value: String,
    },
}

fn check_name(name: &str) -> Result<(), String> {
    if name == "ro" {
        Ok(())
    } else {
        Err(format!("unknown property: {name} (oleo knows: ro)"))
    }
}

pub fn run(a: &PropertyArgs) -> Result<(), String> {
    match &a.verb {
        Verb::Get { image, path, name } => {
            if let Some(n) = name {
                check_name(n)?;
            }
            let ro = match image {
                None => {
                    let s = on_mount::subvol_of(Path::new(path))?;
                    s.flags & oleo_fuse::subvol_ioctl::RO != 0
                }
                Some(image) => {
                    let fs = open(image, true)?;
                    let id = subvolume_at(&fs, path)?;
                    fs.subvolume_readonly(id).map_err(|e| e.to_string())?
                }
            };
            println!("ro={ro}");
            Ok(())
        }
        Verb::Set {
            image,
            force,
            path,
            name,
            value,
        } => {
            check_name(name)?;
            let ro = match value.as_str() {
                "true" => true,
                "false" => false,
                v => return Err(format!("invalid value for property: {v} (true or false)")),
            };
            match image {
                None => on_mount::set_readonly(Path::new(path), ro, *force),
                Some(image) => {
                    let fs = open(image, false)?;
                    let id = subvolume_at(&fs, path)?;
                    fs.set_subvolume_readonly(id, ro, *force)
                        .map_err(|e| format!("{}: {e}", shown(path)))
                }
            }
        }
    }
}
