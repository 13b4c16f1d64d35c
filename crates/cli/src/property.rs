//! `oleo property get|set PATH [NAME [VALUE]]`: `btrfs property` for a subvolume's
//! read-only flag (`ro`) and a file's or directory's compression (`compression`, the
//! btrfs.compression xattr the kernel honours too), on a mounted oleo filesystem or
//! (`--image`) on an image or device that is not mounted.

use crate::common::on_mount;
use crate::subvolume::{image_set, open, resolve, shown, subvolume_at};
use oleo::compression::PROPERTY;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct PropertyArgs {
    #[command(subcommand)]
    verb: Verb,
}

#[derive(clap::Subcommand)]
enum Verb {
    /// Print a property of PATH (all that apply without NAME).
    Get {
        /// Image file or block device (not mounted) to work on instead of a mount; once per
        /// device of a multi-device filesystem.
        #[arg(long)]
        image: Vec<PathBuf>,
        path: String,
        name: Option<String>,
    },
    /// Set a property of PATH: ro true|false (a subvolume), compression
    /// zlib|lzo|zstd|no|none, or "" to remove it.
    Set {
        #[arg(long)]
        image: Vec<PathBuf>,
        /// Make a received subvolume writable (clears its received_uuid).
        #[arg(short = 'f')]
        force: bool,
        path: String,
        name: String,
        value: String,
    },
}

fn check_name(name: &str) -> Result<(), String> {
    if name == "ro" || name == "compression" {
        Ok(())
    } else {
        Err(format!(
            "unknown property: {name} (oleo knows: ro, compression)"
        ))
    }
}

fn c_path(path: &Path) -> Result<CString, String> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| format!("{}: NUL in path", path.display()))
}

/// The compression property of `path` on a mount (None: not set).
fn mount_get_compression(path: &Path) -> Result<Option<Vec<u8>>, String> {
    let p = c_path(path)?;
    let n = CString::new(PROPERTY).expect("no NUL");
    let mut buf = vec![0u8; 256];
    // SAFETY: NUL-terminated strings, `buf` writable for its length.
    let len = unsafe { libc::getxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if len < 0 {
        let e = std::io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::ENODATA) => Ok(None),
            _ => Err(format!("{}: {e}", path.display())),
        };
    }
    buf.truncate(len as usize);
    Ok(Some(buf))
}

fn mount_set_compression(path: &Path, value: &str) -> Result<(), String> {
    let p = c_path(path)?;
    let n = CString::new(PROPERTY).expect("no NUL");
    // SAFETY: NUL-terminated strings, `value` readable for its length.
    let r = unsafe {
        if value.is_empty() {
            libc::removexattr(p.as_ptr(), n.as_ptr())
        } else {
            libc::setxattr(
                p.as_ptr(),
                n.as_ptr(),
                value.as_ptr().cast(),
                value.len(),
                0,
            )
        }
    };
    if r != 0 {
        let e = std::io::Error::last_os_error();
        if !(value.is_empty() && e.raw_os_error() == Some(libc::ENODATA)) {
            return Err(format!("{}: compression {value:?}: {e}", path.display()));
        }
    }
    Ok(())
}

fn get_compression(image: &[PathBuf], path: &str) -> Result<Option<Vec<u8>>, String> {
    match image_set(image) {
        None => mount_get_compression(Path::new(path)),
        Some(image) => {
            let fs = open(image, true)?;
            let id = resolve(&fs, path)?;
            match fs.getxattr(id, PROPERTY) {
                Ok(v) => Ok(Some(v)),
                Err(oleo::Error::NoXattr) => Ok(None),
                Err(e) => Err(format!("{}: {e}", shown(path))),
            }
        }
    }
}

fn set_compression(image: &[PathBuf], path: &str, value: &str) -> Result<(), String> {
    match image_set(image) {
        None => mount_set_compression(Path::new(path), value),
        Some(image) => {
            let fs = open(image, false)?;
            let id = resolve(&fs, path)?;
            let r = if value.is_empty() {
                match fs.removexattr(id, PROPERTY) {
                    Err(oleo::Error::NoXattr) => Ok(()),
                    r => r,
                }
            } else {
                fs.setxattr(id, PROPERTY, value.as_bytes(), oleo::XattrSet::Either)
            };
            r.and_then(|()| fs.sync().map(|_| ()))
                .map_err(|e| format!("{}: compression {value:?}: {e}", shown(path)))
        }
    }
}

/// The read-only flag of the subvolume `path` is the root of (`any`: or is in).
fn get_ro(image: &[PathBuf], path: &str, any: bool) -> Result<bool, String> {
    match image_set(image) {
        None => {
            let s = if any {
                on_mount::subvol_of(Path::new(path))?
            } else {
                on_mount::subvolume_root(Path::new(path))?
            };
            Ok(s.flags & oleo_fuse::subvol_ioctl::RO != 0)
        }
        Some(image) => {
            let fs = open(image, true)?;
            let id = subvolume_at(&fs, path)?;
            fs.subvolume_readonly(id).map_err(|e| e.to_string())
        }
    }
}

pub fn run(a: &PropertyArgs) -> Result<(), String> {
    match &a.verb {
        Verb::Get { image, path, name } => {
            if let Some(n) = name {
                check_name(n)?;
            }
            let want = |n: &str| name.as_deref().is_none_or(|x| x == n);
            if want("ro") {
                match get_ro(image, path, name.is_some()) {
                    Ok(ro) => println!("ro={ro}"),
                    // Without a name, ro is listed for subvolumes only.
                    Err(e) if name.is_some() => return Err(e),
                    Err(_) => {}
                }
            }
            if want("compression") {
                if let Some(v) = get_compression(image, path)? {
                    println!("compression={}", String::from_utf8_lossy(&v));
                }
            }
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
            if name == "compression" {
                return set_compression(image, path, value);
            }
            let ro = match value.as_str() {
                "true" => true,
                "false" => false,
                v => return Err(format!("invalid value for property: {v} (true or false)")),
            };
            match image_set(image) {
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
