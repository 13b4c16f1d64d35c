//! POSIX operations that change the namespace and inodes: create (all file types), mkdir,
//! symlink, link, unlink, rmdir, rename, setattr, write, fallocate and xattrs. Each runs in
//! the running transaction after reserving the space it may need (`space`), so a full
//! filesystem fails it with ENOSPC before anything changed.

use crate::error::{Error, Result};
use crate::inode::acl::{self, Acl};
use crate::inode::dir_item::{xattr_entry, EntryTarget};
use crate::inode::inode_item::now;
use crate::transaction::fs::{Attr, FileKind, FsCore, InodeId, Timespec};
use crate::transaction::space::reservation::Reserve;
use crate::transaction::Transaction;
use oleo_format::csum::name_hash;
use oleo_format::items::{
    Compression, FileExtent, FileExtentBody, FileType, InodeItem, Timespec as DiskTime,
    INODE_FLAG_COMPRESS, INODE_FLAG_NOCOMPRESS, INODE_FLAG_NODATACOW, INODE_FLAG_NODATASUM,
};
use oleo_format::key::{item, Key};

const S_IFMT: u32 = 0o170000;
const S_IFDIR: u32 = 0o040000;
const S_IFCHR: u32 = 0o020000;
const S_IFREG: u32 = 0o100000;
const S_IFLNK: u32 = 0o120000;
const S_ISGID: u32 = 0o2000;
const S_ISUID: u32 = 0o4000;
/// The kernel refuses more links than this (BTRFS_LINK_MAX).
const LINK_MAX: u32 = 65535;

/// What to change in `setattr`; `None` leaves a field alone.
#[derive(Clone, Debug, Default)]
pub struct SetAttr {
    /// chmod: new permission bits (the type bits are kept); a POSIX access ACL is
    /// brought in line with them.
    pub mode: Option<u32>,
    /// chown's owner. A chown drops set-user-ID (and set-group-ID of a group-executable
    /// file), as chown(2) does, unless `mode` is set in the same call.
    pub uid: Option<u32>,
    /// chown's group (see `uid`).
    pub gid: Option<u32>,
    /// truncate: the new size of a regular file; data past it is freed, growth is a hole.
    /// mtime changes with it when the size does.
    pub size: Option<u64>,
    /// New access time.
    pub atime: Option<Timespec>,
    /// New modification time.
    pub mtime: Option<Timespec>,
    /// New change time; None stamps the time of the call, as every setattr changes ctime.
    pub ctime: Option<Timespec>,
}

/// rename(2)'s RENAME_* flags (renameat2); the default is a plain rename that replaces
/// an existing target.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RenameFlags {
    /// Fail with EEXIST if the target exists (RENAME_NOREPLACE).
    pub noreplace: bool,
    /// Swap source and target, which must both exist (RENAME_EXCHANGE).
    pub exchange: bool,
    /// Leave a whiteout, the 0:0 character device overlayfs uses, owned by (uid, gid) at
    /// the source name (RENAME_WHITEOUT).
    pub whiteout: Option<(u32, u32)>,
}

/// How `fallocate` changes the range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FallocMode {
    /// Allocate (prealloc extents over holes); grows the size unless `keep_size`.
    Allocate {
        /// FALLOC_FL_KEEP_SIZE: the file size stays even if the range ends past it.
        keep_size: bool,
    },
    /// Deallocate (FALLOC_FL_PUNCH_HOLE): the range reads as zeros, the size stays.
    PunchHole,
    /// Zeros over the range, allocated (FALLOC_FL_ZERO_RANGE); grows the size unless
    /// `keep_size`.
    ZeroRange {
        /// FALLOC_FL_KEEP_SIZE: the file size stays even if the range ends past it.
        keep_size: bool,
    },
}

/// xattr set semantics (XATTR_CREATE / XATTR_REPLACE).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum XattrSet {
    /// Create the xattr or replace its value (flags 0).
    #[default]
    Either,
    /// XATTR_CREATE: fail with `Error::AlreadyExists` if it exists.
    Create,
    /// XATTR_REPLACE: fail with `Error::NoXattr` if it does not exist.
    Replace,
}

fn disk_time(t: Timespec) -> DiskTime {
    DiskTime {
        sec: t.sec,
        nsec: t.nsec,
    }
}

/// A directory's size counts every name twice (DIR_ITEM and DIR_INDEX); an entry going in
/// stamps its times.
pub(crate) fn grow_dir(dir: &mut InodeItem, name: &[u8]) {
    dir.size += 2 * name.len() as u64;
    let t = now();
    dir.mtime = t;
    dir.ctime = t;
}

pub(crate) fn check_name(name: &[u8]) -> Result<()> {
    if name == b"." || name == b".." {
        return Err(Error::AlreadyExists);
    }
    if name.is_empty() || name.contains(&b'/') || name.contains(&0) {
        return Err(Error::InvalidArgument("bad file name".into()));
    }
    if name.len() > 255 {
        return Err(Error::NameTooLong);
    }
    Ok(())
}

pub(crate) fn file_type_of(mode: u32) -> Result<u8> {
    let kind = FileKind::from_mode(mode)
        .ok_or_else(|| Error::InvalidArgument(format!("bad file type in mode {mode:o}")))?;
    Ok(match kind {
        FileKind::File => FileType::RegFile,
        FileKind::Dir => FileType::Dir,
        FileKind::Symlink => FileType::Symlink,
        FileKind::CharDev => FileType::ChrDev,
        FileKind::BlockDev => FileType::BlkDev,
        FileKind::Fifo => FileType::Fifo,
        FileKind::Socket => FileType::Sock,
    }
    .raw())
}

/// The on-disk rdev (major << 20 | minor) of a userspace dev_t.
fn user_rdev_to_disk(dev: u64) -> u64 {
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
    let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
    (major << 20) | (minor & 0xfffff)
}

impl Transaction<'_> {
    pub(crate) fn dir_inode(&mut self, dir: InodeId) -> Result<InodeItem> {
        let inode = self.read_inode(dir)?;
        if inode.mode & S_IFMT != S_IFDIR {
            return Err(Error::NotDir);
        }
        Ok(inode)
    }

    /// Adds `name` -> `target` in `dir` and its back reference; grows the directory.
    fn link_name(
        &mut self,
        dir: InodeId,
        dir_inode: &mut InodeItem,
        name: &[u8],
        target: InodeId,
        file_type: u8,
    ) -> Result<()> {
        let index = self.next_dir_index(dir)?;
        self.add_inode_ref(target, dir.ino, name, index)?;
        self.enter_name(dir, dir_inode, name, target, file_type, index)
    }

    /// Adds the entry `name` -> `target` at `index` in `dir` (its back reference is the
    /// caller's); grows the directory.
    fn enter_name(
        &mut self,
        dir: InodeId,
        dir_inode: &mut InodeItem,
        name: &[u8],
        target: InodeId,
        file_type: u8,
        index: u64,
    ) -> Result<()> {
        let entry = EntryTarget {
            location: Key::new(target.ino, item::INODE_ITEM, 0),
            file_type,
        };
        self.add_dir_entry(dir, name, entry, index)?;
        grow_dir(dir_inode, name);
        Ok(())
    }

    /// Removes `name` -> `target` from `dir` and its back reference; shrinks the directory.
    fn unlink_name(
        &mut self,
        dir: InodeId,
        dir_inode: &mut InodeItem,
        name: &[u8],
        target: InodeId,
    ) -> Result<()> {
        let index = self.remove_inode_ref(target, dir.ino, name)?;
        self.remove_dir_entry(dir, name, index, Some(target.ino))?;
        dir_inode.size = dir_inode.size.saturating_sub(2 * name.len() as u64);
        let t = now();
        dir_inode.mtime = t;
        dir_inode.ctime = t;
        Ok(())
    }

    /// An entry's target inode in this subvolume; subvolume entries are refused.
    fn entry_inode(&mut self, dir: InodeId, name: &[u8]) -> Result<Option<(InodeId, u8)>> {
        match self.find_dir_entry(dir, name)? {
            None => Ok(None),
            Some(e) if e.location.item_type == item::INODE_ITEM => Ok(Some((
                InodeId {
                    subvol: dir.subvol,
                    ino: e.location.objectid,
                },
                e.file_type,
            ))),
            Some(_) => Err(Error::Unsupported(
                "changing a subvolume's directory entry is not supported yet".into(),
            )),
        }
    }

    /// One link fewer for `id`; the last one deletes it, or orphans it while it is open.
    fn drop_link(&mut self, id: InodeId, inode: &mut InodeItem) -> Result<()> {
        let is_dir = inode.mode & S_IFMT == S_IFDIR;
        inode.nlink = if is_dir {
            0
        } else {
            inode.nlink.saturating_sub(1)
        };
        inode.ctime = now();
        if inode.nlink > 0 {
            return self.write_inode(id, inode);
        }
        if self.filesystem().is_open(id) {
            self.write_inode(id, inode)?;
            self.add_orphan(id)
        } else {
            self.delete_inode(id)
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn create_node(
        &mut self,
        parent: InodeId,
        name: &[u8],
        mode: u32,
        umask: u32,
        rdev: u64,
        uid: u32,
        gid: u32,
        symlink: Option<&[u8]>,
    ) -> Result<InodeId> {
        check_name(name)?;
        let mut dir = self.dir_inode(parent)?;
        let new = NewInode {
            mode,
            umask,
            rdev,
            uid,
            gid,
        };
        let id = InodeId {
            subvol: parent.subvol,
            ino: self.new_ino(parent.subvol)?,
        };
        // The DIR_ITEM first: a taken name fails there with nothing changed, so no
        // separate search for it (one descent less per create).
        let target = EntryTarget {
            location: Key::new(id.ino, item::INODE_ITEM, 0),
            file_type: file_type_of(mode)?,
        };
        let entry = match self.add_dir_item(parent, name, target) {
            Ok(entry) => entry,
            Err(e) => {
                self.give_back_ino(id);
                return Err(e);
            }
        };
        let index = self.next_dir_index(parent)?;
        self.new_inode(parent, id, &dir, &new, symlink, Some((name, index)))?;
        self.queue_dir_index(parent, index, entry)?;
        grow_dir(&mut dir, name);
        self.write_inode(parent, &mut dir)?;
        Ok(id)
    }

    /// An O_TMPFILE file: a regular file in `parent`'s subvolume with no name, an orphan
    /// until `link` names it (the kernel's btrfs_tmpfile).
    fn create_tmpfile(&mut self, parent: InodeId, new: &NewInode) -> Result<InodeId> {
        let dir = self.dir_inode(parent)?;
        let new = NewInode {
            mode: (new.mode & 0o7777) | S_IFREG,
            ..*new
        };
        let id = InodeId {
            subvol: parent.subvol,
            ino: self.new_ino(parent.subvol)?,
        };
        self.new_inode(parent, id, &dir, &new, None, None)?;
        self.add_orphan(id)?;
        Ok(id)
    }

    /// Inserts the items of new inode `id` (inode, its back reference as `name` at
    /// `index` in directory `parent` if named, symlink target, ACLs inherited from `dir`);
    /// the directory entry is the caller's. Without a name it has no link (O_TMPFILE).
    fn new_inode(
        &mut self,
        parent: InodeId,
        id: InodeId,
        dir: &InodeItem,
        new: &NewInode,
        symlink: Option<&[u8]>,
        name: Option<(&[u8], u64)>,
    ) -> Result<()> {
        let nlink = u32::from(name.is_some());
        let NewInode {
            mode,
            umask,
            rdev,
            uid,
            gid,
        } = *new;
        let ino = id.ino;
        let t = now();
        let mut mode = mode;
        let mut gid = gid;
        // A set-group-ID directory hands its group (and, to directories, the bit) down.
        if dir.mode & S_ISGID != 0 {
            gid = dir.gid;
            if mode & S_IFMT == S_IFDIR {
                mode |= S_ISGID;
            }
        }
        // A default ACL on the parent replaces the umask (and is inherited by directories).
        let default_acl = if symlink.is_some() {
            None
        } else {
            self.filesystem().default_acl(parent)?
        };
        let mut access_acl = None;
        match default_acl.as_deref().map(Acl::parse).transpose() {
            Ok(Some(d)) => {
                let (m, access) = d.inherit(mode);
                mode = m;
                access_acl = access;
            }
            // An unreadable default ACL is ignored, as if absent.
            Ok(None) | Err(_) => mode &= !(umask & 0o777),
        }
        // The kernel's btrfs_inherit_iflags, then the mount's data options.
        let regular = mode & S_IFMT == S_IFREG;
        let mut flags = 0;
        if dir.flags & INODE_FLAG_NOCOMPRESS != 0 {
            flags |= INODE_FLAG_NOCOMPRESS;
        } else if dir.flags & INODE_FLAG_COMPRESS != 0 {
            flags |= INODE_FLAG_COMPRESS;
        }
        if dir.flags & INODE_FLAG_NODATACOW != 0 {
            flags |= INODE_FLAG_NODATACOW;
            if regular {
                flags |= INODE_FLAG_NODATASUM;
            }
        }
        if regular && self.filesystem().mount_nodatasum {
            flags |= INODE_FLAG_NODATASUM;
        }
        if regular && self.filesystem().mount_nodatacow {
            flags |= INODE_FLAG_NODATACOW | INODE_FLAG_NODATASUM;
        }
        // btrfs_inode_inherit_props: files and directories that may compress take their
        // directory's algorithm (not its "no"), which the kernel marks COMPRESS.
        let inherited = if (regular || mode & S_IFMT == S_IFDIR)
            && flags & INODE_FLAG_NODATACOW == 0
            && dir.flags & INODE_FLAG_COMPRESS != 0
        {
            match self
                .filesystem()
                .getxattr(parent, crate::inode::props::PROPERTY)
            {
                Ok(v) => crate::inode::props::property_type(&v),
                Err(Error::NoXattr) => None,
                Err(e) => return Err(e),
            }
        } else {
            None
        };
        if inherited.is_some() {
            flags = (flags & !INODE_FLAG_NOCOMPRESS) | INODE_FLAG_COMPRESS;
        }
        let mut inode = InodeItem {
            generation: self.transid,
            transid: self.transid,
            nlink,
            uid,
            gid,
            mode,
            rdev: if matches!(mode & S_IFMT, 0o020000 | 0o060000) {
                user_rdev_to_disk(rdev)
            } else {
                0
            },
            flags,
            atime: t,
            ctime: t,
            mtime: t,
            otime: t,
            ..InodeItem::default()
        };
        if let Some(target) = symlink {
            inode.size = target.len() as u64;
            inode.nbytes = target.len() as u64;
        }
        match name {
            // The inode item and its reference share a leaf: one insertion (as the
            // kernel's btrfs_create_new_inode).
            Some((name, index)) => self.insert_named_inode(id, &inode, parent.ino, name, index)?,
            None => self.insert_inode(id, &inode)?,
        }
        if let Some(target) = symlink {
            let body = FileExtent {
                generation: self.transid,
                ram_bytes: target.len() as u64,
                compression: Compression::None,
                body: FileExtentBody::Inline { data: target },
            }
            .to_bytes();
            self.insert_item(id.subvol, Key::new(ino, item::EXTENT_DATA, 0), &body)?;
        }
        if let (Some(d), true) = (&default_acl, mode & S_IFMT == S_IFDIR) {
            self.add_new_xattr(id, acl::DEFAULT, d)?;
        }
        if let Some(kind) = inherited {
            let value = crate::transaction::options::type_name(kind).as_bytes();
            self.add_new_xattr(id, crate::inode::props::PROPERTY, value)?;
            self.incompat_needed |= crate::inode::props::incompat_bit(kind);
        }
        if let Some(a) = access_acl {
            self.add_new_xattr(id, acl::ACCESS, &a.to_bytes())?;
        }
        Ok(())
    }

    /// An xattr of an inode made in this operation (no entry of that name yet).
    fn add_new_xattr(&mut self, id: InodeId, name: &[u8], value: &[u8]) -> Result<()> {
        let entry = xattr_entry(self.transid, name, value)?;
        let key = Key::new(id.ino, item::XATTR_ITEM, name_hash(name));
        self.add_hashed_entry(id.subvol, key, &entry, name)
    }

    fn link(&mut self, id: InodeId, parent: InodeId, name: &[u8]) -> Result<()> {
        check_name(name)?;
        if id.subvol != parent.subvol {
            return Err(Error::CrossDevice);
        }
        let mut inode = self.read_inode(id)?;
        if inode.mode & S_IFMT == S_IFDIR {
            return Err(Error::IsDir);
        }
        if inode.nlink >= LINK_MAX {
            return Err(Error::TooManyLinks);
        }
        let mut dir = self.dir_inode(parent)?;
        if self.find_dir_entry(parent, name)?.is_some() {
            return Err(Error::AlreadyExists);
        }
        let file_type = file_type_of(inode.mode)?;
        self.link_name(parent, &mut dir, name, id, file_type)?;
        self.write_inode(parent, &mut dir)?;
        inode.nlink += 1;
        inode.ctime = now();
        // A linked orphan (O_TMPFILE style) is no longer one.
        if inode.nlink == 1 {
            match self.delete_item(
                id.subvol,
                &Key::new(
                    oleo_format::key::objectid::ORPHAN,
                    item::ORPHAN_ITEM,
                    id.ino,
                ),
            ) {
                Err(Error::NotFound) => {}
                r => r?,
            }
        }
        self.write_inode(id, &mut inode)
    }

    fn remove(&mut self, parent: InodeId, name: &[u8], want_dir: bool) -> Result<()> {
        let mut dir = self.dir_inode(parent)?;
        let (target, _) = self.entry_inode(parent, name)?.ok_or(Error::NotFound)?;
        let mut inode = self.read_inode(target)?;
        let is_dir = inode.mode & S_IFMT == S_IFDIR;
        match (want_dir, is_dir) {
            (false, true) => return Err(Error::IsDir),
            (true, false) => return Err(Error::NotDir),
            (true, true) if inode.size != 0 => return Err(Error::NotEmpty),
            _ => {}
        }
        self.unlink_name(parent, &mut dir, name, target)?;
        self.write_inode(parent, &mut dir)?;
        self.drop_link(target, &mut inode)
    }

    fn rename(
        &mut self,
        sp: InodeId,
        sname: &[u8],
        dp: InodeId,
        dname: &[u8],
        flags: RenameFlags,
    ) -> Result<()> {
        check_name(dname)?;
        if sp.subvol != dp.subvol {
            return Err(Error::CrossDevice);
        }
        let (src, stype) = self.entry_inode(sp, sname)?.ok_or(Error::NotFound)?;
        let dst = self.entry_inode(dp, dname)?;
        if flags.exchange {
            let (dst, dtype) = dst.ok_or(Error::NotFound)?;
            if src == dst {
                return Ok(());
            }
            let mut sdir = self.dir_inode(sp)?;
            self.unlink_name(sp, &mut sdir, sname, src)?;
            self.write_inode(sp, &mut sdir)?;
            let mut ddir = self.dir_inode(dp)?;
            self.unlink_name(dp, &mut ddir, dname, dst)?;
            self.link_name(dp, &mut ddir, dname, src, stype)?;
            self.write_inode(dp, &mut ddir)?;
            let mut sdir = self.dir_inode(sp)?;
            self.link_name(sp, &mut sdir, sname, dst, dtype)?;
            self.write_inode(sp, &mut sdir)?;
            for id in [src, dst] {
                let mut i = self.read_inode(id)?;
                i.ctime = now();
                self.write_inode(id, &mut i)?;
            }
            return Ok(());
        }
        if let Some((dst, _)) = dst {
            if flags.noreplace {
                return Err(Error::AlreadyExists);
            }
            if dst == src {
                // Two names of one inode: POSIX says do nothing.
                return Ok(());
            }
            let dinode = self.read_inode(dst)?;
            let src_dir = stype == FileType::Dir.raw();
            let dst_dir = dinode.mode & S_IFMT == S_IFDIR;
            match (src_dir, dst_dir) {
                (true, false) => return Err(Error::NotDir),
                (false, true) => return Err(Error::IsDir),
                (true, true) if dinode.size != 0 => return Err(Error::NotEmpty),
                _ => {}
            }
            self.remove(dp, dname, dst_dir)?;
        }
        let mut sdir = self.dir_inode(sp)?;
        self.unlink_name(sp, &mut sdir, sname, src)?;
        self.write_inode(sp, &mut sdir)?;
        let mut ddir = self.dir_inode(dp)?;
        self.link_name(dp, &mut ddir, dname, src, stype)?;
        self.write_inode(dp, &mut ddir)?;
        let mut inode = self.read_inode(src)?;
        inode.ctime = now();
        self.write_inode(src, &mut inode)
    }

    fn setattr(&mut self, id: InodeId, set: &SetAttr) -> Result<()> {
        let mut inode = self.read_inode(id)?;
        let t = now();
        if let Some(size) = set.size {
            if inode.mode & S_IFMT != S_IFREG {
                return Err(if inode.mode & S_IFMT == S_IFDIR {
                    Error::IsDir
                } else {
                    Error::InvalidArgument("not a regular file".into())
                });
            }
            // Times change with the size (POSIX); ftruncate's own time update arrives as
            // explicit mtime/ctime.
            let changed = size != inode.size;
            self.truncate_file(id, &mut inode, size)?;
            if changed {
                inode.mtime = t;
            }
        }
        if let Some(mode) = set.mode {
            inode.mode = (inode.mode & S_IFMT) | (mode & !S_IFMT);
            // An access ACL follows the new permission bits.
            if let Ok(raw) = self.filesystem().getxattr(id, acl::ACCESS) {
                if let Ok(mut a) = Acl::parse(&raw) {
                    a.chmod(inode.mode);
                    let key = Key::new(id.ino, item::XATTR_ITEM, name_hash(acl::ACCESS));
                    self.remove_hashed_entry(id.subvol, key, acl::ACCESS)?;
                    let entry = xattr_entry(self.transid, acl::ACCESS, &a.to_bytes())?;
                    self.add_hashed_entry(id.subvol, key, &entry, acl::ACCESS)?;
                }
            }
        }
        if set.uid.is_some() || set.gid.is_some() {
            // chown drops set-user-ID (and set-group-ID on group-executables), as chown(2)
            // does even when the owner stays, unless the caller set the mode in the same call.
            if set.mode.is_none() && inode.mode & S_IFMT != S_IFDIR {
                inode.mode &= !S_ISUID;
                if inode.mode & 0o010 != 0 {
                    inode.mode &= !S_ISGID;
                }
            }
        }
        if let Some(uid) = set.uid {
            inode.uid = uid;
        }
        if let Some(gid) = set.gid {
            inode.gid = gid;
        }
        if let Some(a) = set.atime {
            inode.atime = disk_time(a);
        }
        if let Some(m) = set.mtime {
            inode.mtime = disk_time(m);
        }
        inode.ctime = set.ctime.map_or(t, disk_time);
        self.write_inode(id, &mut inode)
    }

    fn fallocate(
        &mut self,
        id: InodeId,
        offset: u64,
        len: u64,
        mode: FallocMode,
        keep_times: bool,
    ) -> Result<()> {
        let mut inode = self.read_inode(id)?;
        if inode.mode & S_IFMT != S_IFREG {
            return Err(if inode.mode & S_IFMT == S_IFDIR {
                Error::IsDir
            } else {
                Error::NoDevice
            });
        }
        if len == 0 {
            return Err(Error::InvalidArgument("fallocate of zero bytes".into()));
        }
        match mode {
            FallocMode::Allocate { keep_size } => {
                self.preallocate(id, &mut inode, offset, len, keep_size)?
            }
            FallocMode::PunchHole => self.punch_hole(id, &mut inode, offset, len)?,
            FallocMode::ZeroRange { keep_size } => {
                self.punch_hole(id, &mut inode, offset, len)?;
                self.preallocate(id, &mut inode, offset, len, keep_size)?;
            }
        }
        // Like file_modified() in the kernel's fallocate paths: every mode stamps both.
        if !keep_times {
            let t = now();
            inode.ctime = t;
            inode.mtime = t;
        }
        self.write_inode(id, &mut inode)
    }

    pub(crate) fn set_xattr(
        &mut self,
        id: InodeId,
        name: &[u8],
        value: &[u8],
        how: XattrSet,
    ) -> Result<()> {
        if name.is_empty() {
            return Err(Error::InvalidArgument("empty xattr name".into()));
        }
        if name.len() > 255 {
            return Err(Error::NameTooLong);
        }
        let mut inode = self.read_inode(id)?;
        // The btrfs. namespace holds properties, checked and applied as the kernel does.
        if name.starts_with(b"btrfs.") {
            if name != crate::inode::props::PROPERTY {
                return Err(Error::InvalidArgument(format!(
                    "unknown property xattr {}",
                    String::from_utf8_lossy(name)
                )));
            }
            crate::inode::props::validate_property(inode.flags, value)?;
        }
        // One xattr must fit one leaf, as in the kernel (which says ENOSPC too, before it
        // looks for the name).
        let entry = xattr_entry(self.transid, name, value)?;
        if entry.len() > oleo_format::leaf_builder::max_item_size(self.filesystem().sb.nodesize) {
            return Err(Error::NoSpace);
        }
        self.filesystem().default_acls.lock().remove(&id);
        let exists = match self.filesystem().getxattr(id, name) {
            Ok(_) => true,
            Err(Error::NoXattr) => false,
            Err(e) => return Err(e),
        };
        match (how, exists) {
            (XattrSet::Create, true) => return Err(Error::AlreadyExists),
            (XattrSet::Replace, false) => return Err(Error::NoXattr),
            _ => {}
        }
        let key = Key::new(id.ino, item::XATTR_ITEM, name_hash(name));
        if exists {
            self.remove_hashed_entry(id.subvol, key, name)?;
        }
        if name == acl::ACCESS {
            // The mode carries the ACL's owner/group/other bits; an ACL that says no more
            // than the mode is not stored (as posix_acl_update_mode decides).
            let a = Acl::parse(value)?;
            let (bits, needed) = a.mode_bits();
            inode.mode = (inode.mode & !0o777) | bits;
            inode.ctime = now();
            if !needed {
                return self.write_inode(id, &mut inode);
            }
        }
        self.add_hashed_entry(id.subvol, key, &entry, name)?;
        if name == crate::inode::props::PROPERTY {
            let (flags, bit) = crate::inode::props::apply_property(inode.flags, Some(value));
            inode.flags = flags;
            self.incompat_needed |= bit;
        }
        inode.ctime = now();
        self.write_inode(id, &mut inode)
    }

    pub(crate) fn remove_xattr(&mut self, id: InodeId, name: &[u8]) -> Result<()> {
        let mut inode = self.read_inode(id)?;
        self.filesystem().default_acls.lock().remove(&id);
        let key = Key::new(id.ino, item::XATTR_ITEM, name_hash(name));
        match self.remove_hashed_entry(id.subvol, key, name) {
            // Removing an ACL that is not there succeeds in the kernel (set_acl(NULL)).
            Err(Error::NotFound) if name == acl::ACCESS || name == acl::DEFAULT => return Ok(()),
            Err(Error::NotFound) => return Err(Error::NoXattr),
            r => r?,
        }
        if name == crate::inode::props::PROPERTY {
            inode.flags = crate::inode::props::apply_property(inode.flags, None).0;
        }
        inode.ctime = now();
        self.write_inode(id, &mut inode)
    }
}

/// The type, permissions and owner of an inode that `mknod` or `mkdir` creates.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NewInode {
    /// Type and permission bits, e.g. `S_IFIFO | 0o644`.
    pub mode: u32,
    /// Cleared from `mode` unless the parent has a default ACL (inherited instead).
    pub umask: u32,
    /// Device number (userspace dev_t) of a character or block device.
    pub rdev: u64,
    /// Owner user id.
    pub uid: u32,
    /// Owner group id (a set-group-ID parent directory's group takes its place).
    pub gid: u32,
}

impl NewInode {
    /// A regular file with permissions `perm`, owned by root.
    pub fn file(perm: u32) -> NewInode {
        NewInode::with_mode(S_IFREG | perm)
    }

    /// A directory with permissions `perm`, owned by root.
    pub fn dir(perm: u32) -> NewInode {
        NewInode::with_mode(S_IFDIR | perm)
    }

    /// Any type, from full mode bits.
    pub fn with_mode(mode: u32) -> NewInode {
        NewInode {
            mode,
            ..NewInode::default()
        }
    }

    /// The same, owned by `uid` and `gid` (the caller's, as the kernel gives them).
    pub fn owner(self, uid: u32, gid: u32) -> NewInode {
        NewInode { uid, gid, ..self }
    }

    /// The same, with the caller's umask applied at creation (see `umask`).
    pub fn umask(self, umask: u32) -> NewInode {
        NewInode { umask, ..self }
    }

    /// The same, as device number `rdev` (for a character or block device).
    pub fn rdev(self, rdev: u64) -> NewInode {
        NewInode { rdev, ..self }
    }
}

impl FsCore {
    /// Creates a file of any type but directory and symlink (regular, fifo, socket, device)
    /// named `name` in `parent`, as `new` describes (a mode without type bits is a regular
    /// file).
    pub(crate) fn mknod(&mut self, parent: InodeId, name: &[u8], new: &NewInode) -> Result<Attr> {
        let NewInode {
            mode,
            umask,
            rdev,
            uid,
            gid,
        } = *new;
        self.check_subvol_writable(parent.subvol)?;
        self.check_may_add_entry(parent)?;
        if matches!(mode & S_IFMT, S_IFDIR | S_IFLNK) {
            return Err(Error::InvalidArgument(
                "mknod cannot make directories or symlinks".into(),
            ));
        }
        let mode = if mode & S_IFMT == 0 {
            mode | S_IFREG
        } else {
            mode
        };
        let id = self.write_op(Reserve::items(8), |t| {
            t.create_node(parent, name, mode, umask, rdev, uid, gid, None)
        })?;
        self.getattr(id)
    }

    /// Creates directory `name` in `parent` (`new.mode`'s permission and sticky bits count).
    pub(crate) fn mkdir(&mut self, parent: InodeId, name: &[u8], new: &NewInode) -> Result<Attr> {
        let NewInode {
            mode,
            umask,
            uid,
            gid,
            ..
        } = *new;
        self.check_subvol_writable(parent.subvol)?;
        self.check_may_add_entry(parent)?;
        // As mkdir(2): only permission and sticky bits; set-group-ID comes from the parent.
        let mode = (mode & 0o1777) | S_IFDIR;
        let id = self.write_op(Reserve::items(8), |t| {
            t.create_node(parent, name, mode, umask, 0, uid, gid, None)
        })?;
        self.getattr(id)
    }

    /// Creates an unnamed regular file in `parent`'s subvolume (open(2) with O_TMPFILE),
    /// pinned as if open: `unpin_open` deletes it unless `link` gave it a name first.
    /// `parent` supplies what a new file inherits (set-group-ID, default ACL, NOCOW).
    pub(crate) fn tmpfile(&mut self, parent: InodeId, new: &NewInode) -> Result<Attr> {
        self.check_subvol_writable(parent.subvol)?;
        self.check_may_add_entry(parent)?;
        let id = self.write_op(Reserve::items(6), |t| t.create_tmpfile(parent, new))?;
        self.pin_open(id);
        self.getattr(id)
    }

    pub(crate) fn symlink(
        &mut self,
        parent: InodeId,
        name: &[u8],
        target: &[u8],
        uid: u32,
        gid: u32,
    ) -> Result<Attr> {
        self.check_subvol_writable(parent.subvol)?;
        self.check_may_add_entry(parent)?;
        let limit = oleo_format::leaf_builder::max_item_size(self.sb.nodesize)
            - oleo_format::items::FILE_EXTENT_INLINE_HEADER;
        if target.is_empty() || target.len() > limit.min(4095) {
            return Err(Error::NameTooLong);
        }
        let id = self.write_op(Reserve::items(7), |t| {
            t.create_node(parent, name, S_IFLNK | 0o777, 0, 0, uid, gid, Some(target))
        })?;
        self.getattr(id)
    }

    pub(crate) fn link(&mut self, id: InodeId, parent: InodeId, name: &[u8]) -> Result<Attr> {
        self.check_subvol_writable(parent.subvol)?;
        self.check_may_add_entry(parent)?;
        // The VFS's may_linkat: an immutable or append-only inode gets no new names.
        self.check_may_modify(id)?;
        self.write_op(Reserve::items(5), |t| t.link(id, parent, name))?;
        self.getattr(id)
    }

    pub(crate) fn unlink(&mut self, parent: InodeId, name: &[u8]) -> Result<()> {
        self.check_subvol_writable(parent.subvol)?;
        self.check_entry_may_go(parent, name)?;
        self.write_op(Reserve::items(8), |t| t.remove(parent, name, false))
    }

    pub(crate) fn rmdir(&mut self, parent: InodeId, name: &[u8]) -> Result<()> {
        self.check_subvol_writable(parent.subvol)?;
        self.check_entry_may_go(parent, name)?;
        self.write_op(Reserve::items(8), |t| t.remove(parent, name, true))
    }

    pub(crate) fn rename(
        &mut self,
        parent: InodeId,
        name: &[u8],
        new_parent: InodeId,
        new_name: &[u8],
        flags: RenameFlags,
    ) -> Result<()> {
        // The VFS's first check (do_renameat2): "." or ".." on either side is busy, or
        // an existing target under RENAME_NOREPLACE.
        let dots = |n: &[u8]| n == b"." || n == b"..";
        if dots(name) || (dots(new_name) && !flags.noreplace) {
            return Err(Error::Busy("a rename of \".\" or \"..\"".into()));
        }
        if dots(new_name) {
            return Err(Error::AlreadyExists);
        }
        self.check_subvol_writable(parent.subvol)?;
        self.check_entry_may_go(parent, name)?;
        self.check_may_add_entry(new_parent)?;
        self.check_entry_may_go(new_parent, new_name)?;
        if flags.exchange && flags.whiteout.is_some() {
            return Err(Error::InvalidArgument(
                "a rename cannot both exchange and leave a whiteout".into(),
            ));
        }
        self.write_op(Reserve::items(24), |t| {
            t.rename(parent, name, new_parent, new_name, flags)?;
            if let Some((uid, gid)) = flags.whiteout {
                // In the same transaction: the source name never goes missing on disk.
                t.create_node(parent, name, S_IFCHR, 0, 0, uid, gid, None)?;
            }
            Ok(())
        })
    }

    pub(crate) fn setattr(&mut self, id: InodeId, set: &SetAttr) -> Result<Attr> {
        self.check_subvol_writable(id.subvol)?;
        // Times alone may change on an append-only file (its writes move them).
        if set.size.is_some() || set.mode.is_some() || set.uid.is_some() || set.gid.is_some() {
            self.check_may_modify(id)?;
        } else {
            self.check_not_immutable(id)?;
        }
        // Growing a file rewrites its partial last sector (or its inline extent) as data.
        // Only a size change reads the inode here: chmod and utimens stay one lookup.
        let grows = match set.size {
            Some(to) => {
                let size = self.getattr(id)?.size;
                to > size && size > 0
            }
            None => false,
        };
        let need = if grows {
            Reserve::items(8)
                .bulk(256)
                .data(u64::from(self.sb.sectorsize))
        } else {
            Reserve::items(8)
        };
        self.write_op(need, |t| t.setattr(id, set))?;
        self.getattr(id)
    }

    /// Writes `data` at `offset`; returns the bytes written (all of them).
    pub(crate) fn write(
        &mut self,
        id: InodeId,
        offset: u64,
        data: &[u8],
        keep_times: bool,
    ) -> Result<usize> {
        self.check_subvol_writable(id.subvol)?;
        self.check_not_immutable(id)?;
        let need = self.write_reserve(id, offset, data.len() as u64)?;
        self.write_op(need, |t| t.write_file(id, offset, data, keep_times))?;
        Ok(data.len())
    }

    /// What writing `len` bytes at `offset` may take: the sectors it covers, the sector
    /// at the old end of file (rewritten with zeros past it), per-extent items and csums.
    fn write_reserve(&self, id: InodeId, offset: u64, len: u64) -> Result<Reserve> {
        let sector = u64::from(self.sb.sectorsize);
        let size = self.getattr(id)?.size;
        let end = offset.saturating_add(len);
        let mut data = end.next_multiple_of(sector) - (offset - offset % sector);
        // The sector at the old end is rewritten with zeros past it, and an inline extent
        // turns into a regular one (inline files are at most a sector: a compressed one
        // may hold a whole sector).
        if end > size && size % sector != 0 && size - size % sector < offset - offset % sector
            || size > 0 && size <= sector
        {
            data += sector;
        }
        // Small inline files still get a sector in case they turn regular.
        data = data.max(sector);
        let csums = data / sector * self.sb.csum_type().size() as u64;
        let extents = data / (1 << 20) + 2;
        Ok(Reserve::items(10).bulk(csums + extents * 200).data(data))
    }

    pub(crate) fn fallocate(
        &mut self,
        id: InodeId,
        offset: u64,
        len: u64,
        mode: FallocMode,
        keep_times: bool,
    ) -> Result<()> {
        self.check_subvol_writable(id.subvol)?;
        // Allocating is appending's business; punching and zeroing change data.
        match mode {
            FallocMode::Allocate { .. } => self.check_not_immutable(id)?,
            _ => self.check_may_modify(id)?,
        }
        // Punching zeroes the partial sectors at both ends; allocating fills the holes of
        // the sector-rounded range (two sectors more than `len`), after the sector at the
        // old end of file is rewritten (`prepare_extend`); zeroing does both.
        let sector = u64::from(self.sb.sectorsize);
        let data = match mode {
            FallocMode::PunchHole => 2 * sector,
            FallocMode::Allocate { .. } => len.saturating_add(3 * sector),
            FallocMode::ZeroRange { .. } => len.saturating_add(5 * sector),
        };
        let extents = len / (1 << 20) + 2;
        self.write_op(Reserve::items(10).bulk(extents * 200).data(data), |t| {
            t.fallocate(id, offset, len, mode, keep_times)
        })
    }

    pub(crate) fn setxattr(
        &mut self,
        id: InodeId,
        name: &[u8],
        value: &[u8],
        how: XattrSet,
    ) -> Result<()> {
        self.check_subvol_writable(id.subvol)?;
        self.check_may_modify(id)?;
        self.write_op(Reserve::items(4), |t| t.set_xattr(id, name, value, how))
    }

    pub(crate) fn removexattr(&mut self, id: InodeId, name: &[u8]) -> Result<()> {
        self.check_subvol_writable(id.subvol)?;
        self.check_may_modify(id)?;
        self.write_op(Reserve::items(4), |t| t.remove_xattr(id, name))
    }
}

impl FsCore {
    /// Copies up to `len` bytes (stopping at the source's end) and returns how many. Whole
    /// sectors share the source's extents (a reflink); the rest is copied.
    pub(crate) fn copy_file_range(
        &mut self,
        src: InodeId,
        src_off: u64,
        dst: InodeId,
        dst_off: u64,
        len: u64,
        keep_times: bool,
    ) -> Result<u64> {
        self.check_subvol_writable(dst.subvol)?;
        self.check_not_immutable(dst)?;
        let sa = self.getattr(src)?;
        let da = self.getattr(dst)?;
        if sa.kind != FileKind::File || da.kind != FileKind::File {
            return Err(if sa.kind == FileKind::Dir || da.kind == FileKind::Dir {
                Error::IsDir
            } else {
                Error::InvalidArgument("not a regular file".into())
            });
        }
        if src.subvol != dst.subvol {
            return Err(Error::CrossDevice);
        }
        let len = len.min(sa.size.saturating_sub(src_off));
        if len == 0 {
            return Ok(0);
        }
        if src == dst && src_off < dst_off + len && dst_off < src_off + len {
            return Err(Error::InvalidArgument(
                "overlapping copy within one file".into(),
            ));
        }
        let sector = u64::from(self.sb.sectorsize);
        let src_end = src_off + len;
        // A tail that ends at the source's EOF may be cloned whole when it also ends (or
        // lands past) the destination's EOF: the bytes past EOF are never visible.
        let tail_ok = src_end == sa.size && dst_off + len >= da.size;
        let aligned = src_off.is_multiple_of(sector)
            && dst_off.is_multiple_of(sector)
            && (len % sector == 0 || tail_ok);
        let inline = sa.size <= self.max_inline.min(sector - 1);
        // As the kernel's remap: never make the destination partly checksummed (a
        // NODATASUM source, NOCOW's, shares nothing with a checksummed file: it copies).
        let same_sums = (sa.flags ^ da.flags) & INODE_FLAG_NODATASUM == 0;
        if aligned && !inline && src != dst && same_sums {
            let clone_len = len.next_multiple_of(sector);
            let extents = clone_len / (1 << 20) + 2;
            self.write_op(
                Reserve::items(10).bulk(extents * 200).data(2 * sector),
                |t| t.clone_range(src, src_off, dst, dst_off, clone_len, keep_times),
            )?;
            if clone_len != len {
                // The clone covered whole sectors: the size ends where the data ends.
                let want = (dst_off + len).max(da.size);
                self.write_op(Reserve::items(2), |t| {
                    let mut i = t.read_inode(dst)?;
                    i.size = want;
                    t.write_inode(dst, &mut i)
                })?;
            }
            return Ok(len);
        }
        let mut done = 0u64;
        while done < len {
            let n = (len - done).min(8 << 20) as u32;
            let data = self.read(src, src_off + done, n)?;
            if data.is_empty() {
                break;
            }
            self.write(dst, dst_off + done, &data, keep_times)?;
            done += data.len() as u64;
        }
        Ok(done)
    }

    /// Drops every open pin (deleting orphans) and commits: the end of a mount.
    /// Closes a filesystem: open files are closed (unlinked ones deleted) and the running
    /// transaction committed. Returns the commit's result; dropping a `FsCore` does the
    /// same but can only log a failure.
    pub(crate) fn close(mut self) -> Result<()> {
        let r = self.finish();
        if let Err(e) = &r {
            // Nothing more to try in drop.
            self.aborted
                .get_or_insert_with(|| format!("close failed: {e}"));
        }
        r
    }

    /// What `close` and drop do; nothing for a read-only or aborted filesystem.
    pub(crate) fn finish(&mut self) -> Result<()> {
        self.pipe.write_deferred()?;
        let (syncs, fsyncs) = self.pipe.log.counts();
        if syncs > 0 {
            log::info!("{fsyncs} fsyncs went through the log tree, in {syncs} log syncs");
        }
        let idle = self.running.is_none() && self.open_inodes.lock().is_empty();
        if idle || self.aborted.is_some() || !self.io.device().is_writable() {
            return Ok(());
        }
        self.close_all_and_sync().map(|_| ())
    }

    pub(crate) fn close_all_and_sync(&mut self) -> Result<u64> {
        let open: Vec<InodeId> = self.open_inodes.lock().keys().copied().collect();
        for id in open {
            self.open_inodes.lock().insert(id, 1);
            self.unpin_open(id)?;
        }
        self.sync()
    }
}
