//! `oleo subvolume create | snapshot | list`: `btrfs subvolume`, with btrfs's arguments and
//! output, on a mounted oleo filesystem (paths on the mount; the daemon does the work, see
//! `on_mount`) or with `--image` on an image or device nothing has mounted (paths inside the
//! filesystem, from its top-level subvolume).

use crate::common::on_mount;
use oleo::{Filesystem, InodeId, OpenOptions};
use oleo_fuse::subvol_ioctl::{SubvolInfo, RO};
use std::path::{Path, PathBuf};

/// A host path's directory and last name (for a new subvolume or snapshot on a mount).
fn host_parent_and_name(path: &str) -> Result<(PathBuf, String), String> {
    let p = Path::new(path.trim_end_matches('/'));
    let name = p
        .file_name()
        .ok_or_else(|| format!("'{path}': no name for the new subvolume"))?
        .to_string_lossy()
        .into_owned();
    let dir = match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    Ok((dir, name))
}

#[derive(clap::Args)]
pub struct SubvolumeArgs {
    #[command(subcommand)]
    verb: Verb,
}

#[derive(clap::Subcommand)]
enum Verb {
    /// Create an empty subvolume at PATH.
    Create {
        /// Image file or block device (not mounted) to work on instead of a mount; once per
        /// device of a multi-device filesystem.
        #[arg(long)]
        image: Vec<PathBuf>,
        /// Path of the new subvolume, from the top level.
        path: String,
    },
    /// Snapshot subvolume SOURCE as DEST (or into DEST, if it is a directory).
    Snapshot {
        #[arg(long)]
        image: Vec<PathBuf>,
        /// Make the snapshot read-only.
        #[arg(short = 'r')]
        readonly: bool,
        source: String,
        dest: String,
    },
    /// Delete subvolumes (their space returns once their trees are dropped).
    Delete {
        #[arg(long)]
        image: Vec<PathBuf>,
        #[arg(required = true)]
        paths: Vec<String>,
    },
    /// Print what is known of the subvolume at PATH, as `btrfs subvolume show`.
    Show {
        #[arg(long)]
        image: Vec<PathBuf>,
        path: String,
    },
    /// Print the default subvolume (the one a mount without subvol= shows).
    GetDefault {
        #[arg(long)]
        image: Vec<PathBuf>,
        /// A path on the mounted filesystem (without --image).
        path: Option<String>,
    },
    /// Make a subvolume the default: `set-default SUBVOLUME` or `set-default ID PATH`.
    SetDefault {
        #[arg(long)]
        image: Vec<PathBuf>,
        #[arg(required = true, num_args = 1..=2)]
        args: Vec<String>,
    },
    /// List the subvolumes and snapshots.
    List {
        #[arg(long)]
        image: Vec<PathBuf>,
        /// Print the parent subvolume's id.
        #[arg(short = 'p')]
        parent: bool,
        /// (btrfs's -a: every subvolume of the filesystem, which is what is always listed,
        /// paths from the top level.)
        #[arg(short = 'a')]
        all: bool,
        /// Print the generation each was created in.
        #[arg(short = 'c')]
        cgen: bool,
        /// (btrfs's -g: the generation, which is always printed.)
        #[arg(short = 'g')]
        generation: bool,
        /// Print each one's uuid.
        #[arg(short = 'u')]
        uuid: bool,
        /// Print the uuid of the subvolume each was snapshotted from.
        #[arg(short = 'q')]
        parent_uuid: bool,
        /// Print the uuid each was received as.
        #[arg(short = 'R')]
        received_uuid: bool,
        /// Only read-only ones.
        #[arg(short = 'r')]
        readonly: bool,
        /// Only snapshots (with their creation generation and time).
        #[arg(short = 's')]
        snapshots: bool,
        /// A path on the mounted filesystem (without --image).
        path: Option<String>,
    },
}

pub fn run(a: &SubvolumeArgs) -> Result<(), String> {
    match &a.verb {
        Verb::Create { image, path } if image.is_empty() => {
            let (dir, name) = host_parent_and_name(path)?;
            println!("Create subvolume '{}'", dir.join(&name).display());
            on_mount::create(&dir, &name)
        }
        Verb::Snapshot {
            image,
            readonly,
            source,
            dest,
        } if image.is_empty() => {
            let src = Path::new(source);
            let (dir, name) = if Path::new(dest).is_dir() {
                let base = src
                    .file_name()
                    .ok_or_else(|| format!("cannot name a snapshot of '{source}' in '{dest}'"))?;
                (PathBuf::from(dest), base.to_string_lossy().into_owned())
            } else {
                host_parent_and_name(dest)?
            };
            println!(
                "Create {}snapshot of '{source}' in '{}'",
                if *readonly { "a readonly " } else { "a " },
                dir.join(&name).display()
            );
            on_mount::snapshot(src, &dir, &name, *readonly)
        }
        Verb::Delete { image, paths } if image.is_empty() => {
            for path in paths {
                let (dir, name) = host_parent_and_name(path)?;
                println!(
                    "Delete subvolume (no-commit): '{}'",
                    dir.join(&name).display()
                );
                on_mount::delete(&dir, &name)?;
            }
            Ok(())
        }
        Verb::Delete { image, paths } => {
            let fs = open(image, false)?;
            for path in paths {
                let (parent, name) = parent_and_name(&fs, path)?;
                println!("Delete subvolume: '{}'", shown(path));
                fs.delete_subvolume(parent, name.as_bytes())
                    .map_err(|e| format!("cannot delete '{}': {e}", shown(path)))?;
            }
            // No cleaner runs after this command: drop the trees now.
            fs.clean_all()
                .map_err(|e| format!("dropping the deleted trees: {e}"))?;
            Ok(())
        }
        Verb::Show { image, path } => {
            let (id, subs) = match image_set(image) {
                None => {
                    let p = Path::new(path);
                    (on_mount::subvolume_root(p)?.id, on_mount::list(p)?)
                }
                Some(image) => {
                    let fs = open(image, true)?;
                    (subvolume_at(&fs, path)?, image_subvolumes(&fs)?)
                }
            };
            let s = subs
                .iter()
                .find(|s| s.id == id)
                .ok_or_else(|| format!("subvolume {id} is not listed"))?;
            print!("{}", show_text(s, &subs));
            Ok(())
        }
        Verb::GetDefault { image, path } => {
            let (id, subs) = match image_set(image) {
                None => {
                    let p = Path::new(
                        path.as_deref()
                            .ok_or("give a path on a mounted oleo filesystem, or --image IMAGE")?,
                    );
                    (on_mount::get_default(p)?, on_mount::list(p)?)
                }
                Some(image) => {
                    let fs = open(image, true)?;
                    let id = fs.default_subvolume().map_err(|e| e.to_string())?;
                    (id, image_subvolumes(&fs)?)
                }
            };
            if id == oleo::format::key::objectid::FS_TREE {
                println!("ID 5 (FS_TREE)");
                return Ok(());
            }
            let s = subs
                .iter()
                .find(|s| s.id == id)
                .ok_or_else(|| format!("the default subvolume {id} does not exist"))?;
            println!(
                "ID {} gen {} top level {} path {}",
                s.id,
                s.generation,
                s.parent,
                String::from_utf8_lossy(&s.path)
            );
            Ok(())
        }
        Verb::SetDefault { image, args } => {
            let (id, path) = match args.as_slice() {
                [id, path] => (
                    Some(
                        id.parse::<u64>()
                            .map_err(|_| format!("not a subvolume id: {id}"))?,
                    ),
                    path,
                ),
                [path] => (None, path),
                _ => return Err("set-default SUBVOLUME, or set-default ID PATH".into()),
            };
            match image_set(image) {
                None => {
                    let p = Path::new(path);
                    let id = match id {
                        Some(id) => id,
                        None => on_mount::subvolume_root(p)?.id,
                    };
                    on_mount::set_default(p, id)
                }
                Some(image) => {
                    let fs = open(image, false)?;
                    let id = match id {
                        Some(id) => id,
                        None => subvolume_at(&fs, path)?,
                    };
                    let id = if id == 0 {
                        oleo::format::key::objectid::FS_TREE
                    } else {
                        id
                    };
                    fs.set_default_subvolume(id).map_err(|e| e.to_string())?;
                    fs.sync().map(drop).map_err(|e| format!("commit: {e}"))
                }
            }
        }
        Verb::Create { image, path } => {
            let fs = open(image, false)?;
            let (parent, name) = parent_and_name(&fs, path)?;
            println!("Create subvolume '{}'", shown(path));
            let (uid, gid) = owner();
            fs.create_subvolume(parent, name.as_bytes(), uid, gid)
                .map_err(|e| format!("cannot create subvolume '{}': {e}", shown(path)))?;
            fs.sync().map_err(|e| format!("commit: {e}"))?;
            Ok(())
        }
        Verb::Snapshot {
            image,
            readonly,
            source,
            dest,
        } => {
            let fs = open(image, false)?;
            let src = subvolume_at(&fs, source)?;
            // As btrfs: into an existing directory under the source's name, else as DEST.
            let (parent, name) = match resolve(&fs, dest) {
                Ok(dir) => {
                    let base = source
                        .trim_end_matches('/')
                        .rsplit('/')
                        .next()
                        .unwrap_or("");
                    if base.is_empty() {
                        return Err(format!(
                            "cannot name a snapshot of '{}' in '{}': give DEST a name",
                            shown(source),
                            shown(dest)
                        ));
                    }
                    (dir, base.to_string())
                }
                Err(_) => parent_and_name(&fs, dest)?,
            };
            println!(
                "Create {}snapshot of '{}' in '{}'",
                if *readonly { "a readonly " } else { "a " },
                shown(source),
                shown(&format!("{}/{name}", shown_dir(&fs, parent))),
            );
            fs.snapshot(src, parent, name.as_bytes(), *readonly)
                .map_err(|e| format!("cannot snapshot '{}': {e}", shown(source)))?;
            Ok(())
        }
        Verb::List {
            image,
            parent,
            all: _,
            cgen,
            generation: _,
            uuid,
            parent_uuid,
            received_uuid,
            readonly,
            snapshots,
            path,
        } => {
            let subs = match image_set(image) {
                None => {
                    let path = path
                        .as_deref()
                        .ok_or("give a path on a mounted oleo filesystem, or --image IMAGE")?;
                    on_mount::list(Path::new(path))?
                }
                Some(image) => image_subvolumes(&open(image, true)?)?,
            };
            let cols = ListColumns {
                parent: *parent,
                cgen: *cgen || *snapshots,
                otime: *snapshots,
                uuid: *uuid,
                parent_uuid: *parent_uuid,
                received_uuid: *received_uuid,
            };
            for s in subs.iter().filter(|s| {
                s.id != oleo::format::key::objectid::FS_TREE
                    && (!*readonly || s.flags & RO != 0)
                    && (!*snapshots || s.parent_uuid != [0; 16])
            }) {
                println!("{}", list_line(s, &cols));
            }
            Ok(())
        }
    }
}

/// Which of `btrfs subvolume list`'s optional columns to print.
struct ListColumns {
    parent: bool,
    cgen: bool,
    otime: bool,
    uuid: bool,
    parent_uuid: bool,
    received_uuid: bool,
}

/// One line of `btrfs subvolume list`, its columns in btrfs-progs' order.
fn list_line(s: &SubvolInfo, c: &ListColumns) -> String {
    let mut l = format!("ID {} gen {}", s.id, s.generation);
    if c.cgen {
        l += &format!(" cgen {}", s.otransid);
    }
    if c.parent {
        l += &format!(" parent {}", s.parent);
    }
    l += &format!(" top level {}", s.parent);
    if c.otime {
        let t = time_text(s.otime);
        // btrfs-progs prints this one without the zone.
        l += &format!(
            " otime {}",
            t.rsplit_once(' ').map_or(t.as_str(), |(a, _)| a)
        );
    }
    // An absent uuid is `-` padded to a uuid's width.
    if c.parent_uuid {
        l += &format!(" parent_uuid {:<36}", uuid_text(&s.parent_uuid));
    }
    if c.received_uuid {
        l += &format!(" received_uuid {:<36}", uuid_text(&s.received_uuid));
    }
    if c.uuid {
        l += &format!(" uuid {:<36}", uuid_text(&s.uuid));
    }
    let path = if s.path.is_empty() {
        "<unreachable>".into()
    } else {
        String::from_utf8_lossy(&s.path).into_owned()
    };
    l + &format!(" path {path}")
}

/// A uuid as btrfs-progs prints it, `-` for none.
fn uuid_text(u: &[u8; 16]) -> String {
    if u.iter().all(|&b| b == 0) {
        return "-".into();
    }
    oleo::format::bytes::uuid_string(u)
}

/// A time as btrfs-progs prints it (local time), or `-` for none.
fn time_text((sec, _): (i64, u32)) -> String {
    if sec == 0 {
        return "-".into();
    }
    // SAFETY: a zeroed tm is a valid out-parameter; localtime_r and strftime write within
    // the buffers given.
    unsafe {
        let t = sec as libc::time_t;
        let mut tm: libc::tm = std::mem::zeroed();
        if libc::localtime_r(&t, &mut tm).is_null() {
            return "-".into();
        }
        let mut buf = [0u8; 64];
        let n = libc::strftime(
            buf.as_mut_ptr().cast(),
            buf.len(),
            c"%Y-%m-%d %H:%M:%S %z".as_ptr(),
            &tm,
        );
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }
}

/// `btrfs subvolume show`'s text for `s` (`all`: every subvolume, for its snapshots).
fn show_text(s: &SubvolInfo, all: &[SubvolInfo]) -> String {
    let path = String::from_utf8_lossy(&s.path).into_owned();
    let name = path.rsplit('/').next().unwrap_or_default();
    let mut t = String::new();
    t += &format!(
        "{}\n",
        if s.id == oleo::format::key::objectid::FS_TREE {
            "/"
        } else {
            &path
        }
    );
    t += &format!(
        "\tName: \t\t\t{}\n",
        if s.id == oleo::format::key::objectid::FS_TREE {
            "<FS_TREE>"
        } else {
            name
        }
    );
    t += &format!("\tUUID: \t\t\t{}\n", uuid_text(&s.uuid));
    t += &format!("\tParent UUID: \t\t{}\n", uuid_text(&s.parent_uuid));
    t += &format!("\tReceived UUID: \t\t{}\n", uuid_text(&s.received_uuid));
    t += &format!("\tCreation time: \t\t{}\n", time_text(s.otime));
    t += &format!("\tSubvolume ID: \t\t{}\n", s.id);
    t += &format!("\tGeneration: \t\t{}\n", s.generation);
    t += &format!("\tGen at creation: \t{}\n", s.otransid);
    t += &format!("\tParent ID: \t\t{}\n", s.parent);
    t += &format!("\tTop level ID: \t\t{}\n", s.parent);
    t += &format!(
        "\tFlags: \t\t\t{}\n",
        if s.flags & RO != 0 { "readonly" } else { "-" }
    );
    t += &format!("\tSend transid: \t\t{}\n", s.stransid);
    // btrfs-progs prints the creation time here when the subvolume was never sent.
    let sent = if s.stime.0 == 0 { s.otime } else { s.stime };
    t += &format!("\tSend time: \t\t{}\n", time_text(sent));
    t += &format!("\tReceive transid: \t{}\n", s.rtransid);
    t += &format!("\tReceive time: \t\t{}\n", time_text(s.rtime));
    t += "\tSnapshot(s):\n";
    for snap in all
        .iter()
        .filter(|o| o.parent_uuid == s.uuid && s.uuid != [0; 16])
    {
        t += &format!("\t\t\t\t{}\n", String::from_utf8_lossy(&snap.path));
    }
    // (btrfs-progs adds a quota group line only where quotas are on; oleo refuses those.)
    t
}

/// Every subvolume of an opened image, as a mount lists them.
fn image_subvolumes(fs: &Filesystem) -> Result<Vec<SubvolInfo>, String> {
    let mut v: Vec<SubvolInfo> = fs
        .list_subvolumes()
        .map_err(|e| e.to_string())?
        .into_iter()
        .map(SubvolInfo::from_engine)
        .collect();
    v.sort_by_key(|s| s.id);
    Ok(v)
}

/// `--image`s given, or None (a mount).
pub fn image_set(images: &[PathBuf]) -> Option<&[PathBuf]> {
    (!images.is_empty()).then_some(images)
}

/// Opens the filesystem on `images` (the first, then the other devices of a multi-device
/// one) at its top level.
pub fn open(images: &[PathBuf], read_only: bool) -> Result<Filesystem, String> {
    let opts = OpenOptions {
        read_only,
        subvolid: Some(oleo::format::key::objectid::FS_TREE),
        devices: images[1..].to_vec(),
        ..OpenOptions::default()
    };
    Filesystem::open(&images[0], opts).map_err(|e| format!("{}: {e}", images[0].display()))
}

pub fn resolve(fs: &Filesystem, path: &str) -> Result<InodeId, String> {
    fs.resolve_path(fs.root(), path.trim_matches('/').as_bytes())
        .map_err(|e| format!("{}: {e}", shown(path)))
}

/// The subvolume whose root directory `path` (inside the filesystem) is.
pub fn subvolume_at(fs: &Filesystem, path: &str) -> Result<u64, String> {
    let id = resolve(fs, path)?;
    if id.ino != oleo::format::key::objectid::FIRST_FREE {
        return Err(format!("Not a Btrfs subvolume: {}", shown(path)));
    }
    Ok(id.subvol)
}

/// The directory that holds `path` and the last name in it.
fn parent_and_name(fs: &Filesystem, path: &str) -> Result<(InodeId, String), String> {
    let trimmed = path.trim_matches('/');
    let (dir, name) = trimmed.rsplit_once('/').unwrap_or(("", trimmed));
    if name.is_empty() {
        return Err(format!("'{}': no name for the new subvolume", shown(path)));
    }
    Ok((resolve(fs, dir)?, name.to_string()))
}

pub fn shown(path: &str) -> String {
    format!("/{}", path.trim_matches('/'))
}

/// A directory's path from the top level, for messages.
fn shown_dir(fs: &Filesystem, dir: InodeId) -> String {
    let mut s = fs
        .inode_path(dir)
        .map(|p| String::from_utf8_lossy(&p).into_owned())
        .unwrap_or_default();
    if let Some(sub) = fs
        .list_subvolumes()
        .ok()
        .and_then(|l| l.into_iter().find(|s| s.id == dir.subvol))
        .and_then(|s| s.path)
    {
        let sub = String::from_utf8_lossy(&sub).into_owned();
        s = if s.is_empty() {
            sub
        } else {
            format!("{sub}/{s}")
        };
    }
    shown(&s).trim_end_matches('/').to_string()
}

/// Who runs the command owns a new subvolume's root directory, as with the kernel.
fn owner() -> (u32, u32) {
    // SAFETY: getuid and getgid cannot fail.
    unsafe { (libc::getuid(), libc::getgid()) }
}
