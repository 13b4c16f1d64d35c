//! Making subvolumes and snapshots (the kernel's create_subvol and create_pending_snapshot).
//! A new subvolume is a tree of one leaf: its root directory, which names itself `..`. A
//! snapshot is a copy of its source's root block; everything below it is shared, each
//! child gaining a reference from the new tree. Both get a ROOT_ITEM, a ROOT_REF and
//! ROOT_BACKREF pair, an entry in the parent directory leading to the ROOT_ITEM (no
//! INODE_REF: the entry leads into another tree) and a uuid tree item.
//!
//! A snapshot is taken as the first change of a transaction, right after a commit, and is
//! committed at once (as the kernel, which takes it inside the commit): its source's blocks
//! are then all of earlier transactions, so every later change to either tree copies what
//! it touches instead of editing a block both reach.

use crate::ctree;
use crate::error::{Error, Result};
use crate::inode::dir_item::EntryTarget;
use crate::inode::inode_item::now;
use crate::transaction::fs::random_uuid;
use crate::transaction::fs::{FsCore, InodeId};
use crate::transaction::space::reservation::Reserve;
use crate::transaction::Transaction;
use crate::vfs::inode_ops::{check_name, grow_dir};
use oleo_format::items::{
    FileType, InodeItem, InodeRef, RootItem, RootRef, INODE_FLAG_ROOT_ITEM_INIT, ROOT_SUBVOL_RDONLY,
};
use oleo_format::key::{item, objectid, Key};

const DIR_MODE: u32 = 0o040755;

/// Items a snapshot changes beyond one reference per child of its source's root block.
pub(crate) const SNAPSHOT_ITEMS: u64 = 16;

/// What the children's new references may add to the extent tree: a root block has at
/// most a few hundred children, each reference an inline ref in an item already there.
pub(crate) const SNAPSHOT_REF_BYTES: u64 = 512 * 256;

impl FsCore {
    /// Creates the empty subvolume `name` in directory `parent`, its root directory owned
    /// by `uid`:`gid`; returns its id. As with the kernel, it reaches the disk with the
    /// next commit.
    pub(crate) fn create_subvolume(
        &mut self,
        parent: InodeId,
        name: &[u8],
        uid: u32,
        gid: u32,
    ) -> Result<u64> {
        self.check_subvol_writable(parent.subvol)?;
        check_name(name)?;
        let uuid = random_uuid()?;
        let id = self.write_op(Reserve::items(12), |t| {
            t.create_subvolume(parent, name, uid, gid, uuid)
        })?;
        self.subvol_roots.write().remove(&id);
        self.readonly_subvols.lock().insert(id, false);
        Ok(id)
    }
}

impl Transaction<'_> {
    /// The id a new subvolume gets: one above the highest in the root tree (as the kernel,
    /// which seeds its counter from it at mount).
    fn free_subvolume_id(&mut self) -> Result<u64> {
        let mut highest = objectid::FIRST_FREE - 1;
        self.for_each_in_range(
            objectid::ROOT_TREE,
            Key::new(objectid::FIRST_FREE, 0, 0),
            Key::new(objectid::LAST_FREE, u8::MAX, u64::MAX),
            |k, _| {
                highest = highest.max(k.objectid);
                Ok(std::ops::ControlFlow::Continue(()))
            },
        )?;
        if highest >= objectid::LAST_FREE {
            return Err(Error::NoSpace);
        }
        Ok(highest + 1)
    }

    /// Refuses a name `parent` already has, before anything changes.
    fn check_free_name(&mut self, parent: InodeId, name: &[u8]) -> Result<()> {
        self.dir_inode(parent)?;
        match self.find_dir_entry(parent, name)? {
            Some(_) => Err(Error::AlreadyExists),
            None => Ok(()),
        }
    }

    fn create_subvolume(
        &mut self,
        parent: InodeId,
        name: &[u8],
        uid: u32,
        gid: u32,
        uuid: [u8; 16],
    ) -> Result<u64> {
        self.check_free_name(parent, name)?;
        let id = self.free_subvolume_id()?;
        let transid = self.transid;
        let t = now();
        let root = ctree::new_tree(self, id)?;
        let item = RootItem {
            inode: root_item_inode(self.nodesize),
            generation: transid,
            generation_v2: transid,
            root_dirid: objectid::FIRST_FREE,
            bytenr: root.bytenr,
            level: 0,
            refs: 1,
            uuid,
            ctransid: transid,
            otransid: transid,
            ctime: t,
            otime: t,
            ..RootItem::default()
        };
        let key = Key::new(id, item::ROOT_ITEM, 0);
        self.insert_item(objectid::ROOT_TREE, key, &item.to_bytes())?;
        // bytes_used grows by the leaf at commit, as for any block the tree allocates.
        self.add_root(root, key, false);
        let dir = InodeItem {
            generation: transid,
            transid,
            nlink: 1,
            uid,
            gid,
            mode: DIR_MODE,
            atime: t,
            ctime: t,
            mtime: t,
            otime: t,
            ..InodeItem::default()
        };
        let dotdot = InodeRef {
            index: 0,
            name: b"..".to_vec(),
        };
        let ino = objectid::FIRST_FREE;
        self.insert_items(
            id,
            &[
                (Key::new(ino, item::INODE_ITEM, 0), &dir.to_bytes()),
                (
                    Key::new(ino, item::INODE_REF, ino),
                    &InodeRef::to_bytes_all(&[dotdot])
                        .map_err(|e| Error::InvalidArgument(e.to_string()))?,
                ),
            ],
        )?;
        self.link_subvolume(parent, name, id, 0)?;
        self.add_uuid(&uuid, item::UUID_KEY_SUBVOL, id)?;
        Ok(id)
    }

    /// Makes the snapshot; must be the transaction's first change (see the top).
    pub(crate) fn snapshot(
        &mut self,
        source: u64,
        parent: InodeId,
        name: &[u8],
        readonly: bool,
        uuid: [u8; 16],
    ) -> Result<u64> {
        self.check_free_name(parent, name)?;
        let id = self.free_subvolume_id()?;
        let transid = self.transid;
        let (source_key, source_item) = self.subvol_item(source)?;
        // As the kernel: the source's root is copied in this transaction, the snapshot's
        // root is a copy of that.
        let source_root = self.cow_tree_root(source)?;
        let root = ctree::copy_root(self, &source_root, id)?;
        let block = ctree::BlockSource::read_tree_block(&*self, root.bytenr, None, None, None)?;
        self.add_child_refs(&block, id)?;
        let mut updated = source_item.clone();
        updated.last_snapshot = transid;
        self.put_subvol_item(&source_key, &updated)?;
        self.note_snapshot_of(source);
        self.note_snapshot_of(id);
        let mut item = source_item;
        item.generation = transid;
        item.generation_v2 = transid;
        item.bytenr = root.bytenr;
        item.level = root.level;
        item.last_snapshot = transid;
        item.flags &= !ROOT_SUBVOL_RDONLY;
        if readonly {
            item.flags |= ROOT_SUBVOL_RDONLY;
        }
        item.refs = 1;
        item.drop_progress = Key::new(0, 0, 0);
        item.drop_level = 0;
        item.parent_uuid = item.uuid;
        item.uuid = uuid;
        item.otransid = transid;
        item.otime = now();
        if !readonly {
            // A writable snapshot is no longer what was received.
            item.received_uuid = [0; 16];
            item.stransid = 0;
            item.rtransid = 0;
            item.stime = Default::default();
            item.rtime = Default::default();
        }
        // ctransid and ctime stay the source's (bytes_used too: the kernel does not
        // recount it).
        let key = Key::new(id, item::ROOT_ITEM, transid);
        self.insert_item(objectid::ROOT_TREE, key, &item.to_bytes())?;
        self.add_root(root, key, true);
        self.link_subvolume(parent, name, id, u64::MAX)?;
        self.add_uuid(&uuid, item::UUID_KEY_SUBVOL, id)?;
        if item.received_uuid != [0; 16] {
            self.add_uuid(&item.received_uuid, item::UUID_KEY_RECEIVED_SUBVOL, id)?;
        }
        Ok(id)
    }

    /// Names subvolume `id` as `name` in directory `parent`: the entry (leading to
    /// `(id, ROOT_ITEM, offset)`), the directory's size and times, ROOT_REF and ROOT_BACKREF.
    fn link_subvolume(&mut self, parent: InodeId, name: &[u8], id: u64, offset: u64) -> Result<()> {
        let mut dir = self.dir_inode(parent)?;
        let target = EntryTarget {
            location: Key::new(id, item::ROOT_ITEM, offset),
            file_type: FileType::Dir.raw(),
        };
        let entry = self.add_dir_item(parent, name, target)?;
        let index = self.next_dir_index(parent)?;
        self.queue_dir_index(parent, index, entry)?;
        grow_dir(&mut dir, name);
        self.write_inode(parent, &mut dir)?;
        let r = RootRef {
            dirid: parent.ino,
            sequence: index,
            name: name.to_vec(),
        }
        .to_bytes()
        .map_err(|e| Error::InvalidArgument(e.to_string()))?;
        self.insert_item(
            objectid::ROOT_TREE,
            Key::new(parent.subvol, item::ROOT_REF, id),
            &r,
        )?;
        self.insert_item(
            objectid::ROOT_TREE,
            Key::new(id, item::ROOT_BACKREF, parent.subvol),
            &r,
        )?;
        // The log cannot describe an entry that leads into another tree.
        self.log
            .full_commit
            .get_or_insert_with(|| format!("subvolume {id} was created"));
        Ok(())
    }
}

/// The legacy inode embedded in a subvolume's ROOT_ITEM, as the kernel fills it.
fn root_item_inode(nodesize: u32) -> InodeItem {
    InodeItem {
        generation: 1,
        size: 3,
        nlink: 1,
        nbytes: u64::from(nodesize),
        mode: DIR_MODE,
        flags: INODE_FLAG_ROOT_ITEM_INIT,
        ..InodeItem::default()
    }
}
