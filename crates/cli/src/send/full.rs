//! A full stream: every inode of the snapshot made at its final path, parents first.

use super::{encode_dev, entry_path, show, Sender, Xattrs};
use oleo::format::send_stream::Command;
use oleo::{Attr, FileKind, InodeId};
use std::io::Write;

impl<W: Write> Sender<'_, W> {
    /// Directory `id` at `path` ("" for the snapshot's root, which the stream's SUBVOL
    /// makes): created, its xattrs, its entries, then its owner, mode and times.
    pub(super) fn directory(&mut self, id: InodeId, path: Vec<u8>) -> Result<(), String> {
        let attr = self.attr(id, &path)?;
        if attr.kind != FileKind::Dir {
            return Err(format!(
                "{}: its directory entry says it is a directory, its inode does not",
                show(&path)
            ));
        }
        if !path.is_empty() {
            let create = self.create(id, &attr, path.clone())?;
            self.cmd(&create)?;
        }
        self.xattrs(id, &path, Xattrs::First)?;
        let mut entries = Vec::new();
        self.fs
            .readdir(id, 0, &mut |e| {
                if e.name != b"." && e.name != b".." {
                    entries.push(e);
                }
                true
            })
            .map_err(|e| format!("{}: {e}", show(&path)))?;
        for e in entries {
            let Some(p) = entry_path(self.subvol, &path, &e)? else {
                continue;
            };
            if e.kind == FileKind::Dir {
                self.directory(e.id, p)?;
            } else {
                self.non_directory(e.id, p)?;
            }
        }
        self.finish(id, &path, &attr)
    }

    pub(super) fn non_directory(&mut self, id: InodeId, path: Vec<u8>) -> Result<(), String> {
        if let Some(first) = self.links.get(&id.ino) {
            let link = first.clone();
            return self.cmd(&Command::Link { path, link });
        }
        let attr = self.attr(id, &path)?;
        if attr.kind == FileKind::Dir {
            return Err(format!(
                "{}: its directory entry does not say it is a directory",
                show(&path)
            ));
        }
        if attr.nlink > 1 {
            self.links.insert(id.ino, path.clone());
        }
        let create = self.create(id, &attr, path.clone())?;
        self.cmd(&create)?;
        self.xattrs(id, &path, Xattrs::First)?;
        if attr.kind == FileKind::File {
            self.data(id, &path, attr.size)?;
        }
        self.finish(id, &path, &attr)
    }

    /// The command that makes inode `id` at `path`.
    pub(super) fn create(
        &self,
        id: InodeId,
        attr: &Attr,
        path: Vec<u8>,
    ) -> Result<Command, String> {
        let ino = id.ino;
        let mode = u64::from(attr.mode);
        Ok(match attr.kind {
            FileKind::Dir => Command::Mkdir { path, ino },
            FileKind::File => Command::Mkfile { path, ino },
            FileKind::Symlink => {
                let target = self
                    .fs
                    .readlink(id)
                    .map_err(|e| format!("{}: {e}", show(&path)))?;
                Command::Symlink { path, ino, target }
            }
            FileKind::CharDev | FileKind::BlockDev => Command::Mknod {
                path,
                ino,
                mode,
                rdev: encode_dev(attr.rdev),
            },
            FileKind::Fifo => Command::Mkfifo {
                path,
                ino,
                mode: Some(mode),
                rdev: Some(0),
            },
            FileKind::Socket => Command::Mksock {
                path,
                ino,
                mode: Some(mode),
                rdev: Some(0),
            },
        })
    }
}
