//! POSIX operations on the namespace (the kernel's inode_operations): create (all file
//! types), mkdir, symlink, link, unlink, rmdir, rename. Each runs in the running
//! transaction after reserving the space it may need (`space`), so a full filesystem fails
//! it with ENOSPC before anything changed. `setattr`, `file_ops` and `inode::xattr` hold
//! the rest of the operations.

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
use oleo_format::key::{item, objectid, Key};

pub(crate) const S_IFMT: u32 = 0o170000;
pub(crate) const S_IFDIR: u32 = 0o040000;
pub(crate) const S_IFCHR: u32 = 0o020000;
pub(crate) const S_IFREG: u32 = 0o100000;
pub(crate) const S_IFLNK: u32 = 0o120000;
pub(crate) const S_ISGID: u32 = 0o2000;
pub(crate) const S_ISUID: u32 = 0o4000;
/// The kernel refuses more links than this (BTRFS_LINK_MAX).
pub(crate) const LINK_MAX: u32 = 65535;

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

pub(crate) fn disk_time(t: Timespec) -> DiskTime {
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
        if self.filesystem().open_inodes.is_open(id) {
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
        if mode & S_IFMT == S_IFDIR {
            // Empty, and made here: its names are known from now on (`name_sets`).
            self.filesystem().names.made_empty(id);
        }
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
        // A number used before: a set of names kept for it is not this inode's.
        self.filesystem().names.forget(id);
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
        self.open_inodes.pin(id);
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

    /// True if `dir` is `ancestor` or below it, within `dir`'s subvolume: `..` followed
    /// up to the subvolume's root (a damaged image whose parents loop is corrupt).
    fn is_below(&self, dir: InodeId, ancestor: InodeId) -> Result<bool> {
        let mut cur = dir;
        for _ in 0..=u16::MAX {
            if cur == ancestor {
                return Ok(true);
            }
            if cur.ino == objectid::FIRST_FREE || cur == self.root() {
                return Ok(false);
            }
            cur = self.lookup(cur, b"..")?;
        }
        Err(Error::corrupt(
            0,
            format!("the parents of directory {} loop", dir.ino),
        ))
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
        // A directory never goes below itself (do_renameat2: "source should not be
        // ancestor of target", and for an exchange the target not above the source). The
        // VFS checks this before a FUSE request; library callers reach us directly.
        // Within one directory no name can be above the other.
        if parent != new_parent && parent.subvol == new_parent.subvol {
            let src = self.lookup(parent, name)?;
            if self.is_below(new_parent, src)? {
                return Err(Error::InvalidArgument(
                    "a directory cannot be moved below itself".into(),
                ));
            }
            if flags.exchange {
                if let Ok(dst) = self.lookup(new_parent, new_name) {
                    if self.is_below(parent, dst)? {
                        return Err(Error::InvalidArgument(
                            "a directory cannot be exchanged with one below it".into(),
                        ));
                    }
                }
            }
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
}
