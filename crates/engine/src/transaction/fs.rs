//! The open filesystem's state, `FsCore` (the kernel's fs_info), and the plain types the
//! public API hands out (re-exported at the crate root: front ends see those and the
//! `Filesystem` handle, never `FsCore`). The work is done in the modules named after each
//! btrfs concept (`dir`, `inode`, `file`, `xattr`, `subvolume`), which extend `FsCore`
//! with `impl` blocks of their own.

use crate::ctree::TreeRoot;
use crate::error::{Error, Result};
use crate::io::devices::DeviceSet;
use crate::io::disk_io::DiskIo;
use crate::io::volumes::ChunkMap;
use crate::transaction::options::OpenOptions;
use oleo_format::items::{block_group as bg, ChunkItem, DevItem, InodeItem, RootItem};
use oleo_format::key::{item, objectid, Key};
use oleo_format::superblock::{self, incompat, BackupRoot, Superblock};
use parking_lot::{Mutex, RwLock};
use quick_cache::sync::Cache;
use std::collections::HashMap;
use std::ops::ControlFlow;
use std::path::Path;
use std::sync::Arc;

/// One inode: which subvolume tree it lives in and its inode number there.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct InodeId {
    /// The subvolume's tree id (5 for the top-level subvolume, FS_TREE).
    pub subvol: u64,
    /// The inode number inside that tree (256 for a subvolume's root directory).
    pub ino: u64,
}

/// The type of an inode, from the S_IFMT bits of its mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileKind {
    /// A regular file (S_IFREG).
    File,
    /// A directory (S_IFDIR).
    Dir,
    /// A symbolic link (S_IFLNK); its target is the inline data of its one extent.
    Symlink,
    /// A character device (S_IFCHR).
    CharDev,
    /// A block device (S_IFBLK).
    BlockDev,
    /// A named pipe (S_IFIFO).
    Fifo,
    /// A unix socket (S_IFSOCK).
    Socket,
}

impl FileKind {
    pub(crate) fn from_mode(mode: u32) -> Option<FileKind> {
        Some(match mode & 0o170000 {
            0o100000 => FileKind::File,
            0o040000 => FileKind::Dir,
            0o120000 => FileKind::Symlink,
            0o020000 => FileKind::CharDev,
            0o060000 => FileKind::BlockDev,
            0o010000 => FileKind::Fifo,
            0o140000 => FileKind::Socket,
            _ => return None,
        })
    }
}

/// A point in time as btrfs stores it in inode and root items (btrfs_timespec).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Timespec {
    /// Seconds since the Unix epoch.
    pub sec: i64,
    /// Nanoseconds within the second (below 1 000 000 000).
    pub nsec: u32,
}

/// What stat(2) shows, with the kernel's btrfs conventions (blocks in 512-byte units,
/// blksize = sectorsize, rdev as a userspace dev_t).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attr {
    /// The inode these are the attributes of.
    pub id: InodeId,
    /// Its type (the S_IFMT bits of `mode`).
    pub kind: FileKind,
    /// Full st_mode, type bits included.
    pub mode: u32,
    /// Hard links: the names the inode has (a directory has 1).
    pub nlink: u32,
    /// Owner user id.
    pub uid: u32,
    /// Owner group id.
    pub gid: u32,
    /// Size in bytes (for a directory, btrfs's: twice the length of its names).
    pub size: u64,
    /// Space the file's extents take (the inode item's nbytes), in 512-byte units.
    pub blocks: u64,
    /// The preferred IO size: the filesystem's sectorsize.
    pub blksize: u32,
    /// For a device node, its device number as a userspace dev_t; 0 otherwise.
    pub rdev: u64,
    /// Last access.
    pub atime: Timespec,
    /// Last change of the contents.
    pub mtime: Timespec,
    /// Last change of the inode (contents, names, attributes).
    pub ctime: Timespec,
    /// Creation (the inode item's otime; statx's btime).
    pub crtime: Timespec,
    /// The transaction (generation) that created the inode (INODE_ITEM generation).
    pub generation: u64,
    /// The btrfs inode flags (BTRFS_INODE_NODATACOW, _IMMUTABLE, _APPEND, ...), as in
    /// the inode item; `oleo::fileattr` names the ones a caller checks, and
    /// `Filesystem::get_fs_flags` gives them as chattr's.
    pub flags: u64,
}

/// A directory entry. `next_offset` is the cookie that resumes the listing after it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry {
    /// The name, as bytes (btrfs names are not required to be UTF-8).
    pub name: Vec<u8>,
    /// The inode it names. For a subvolume's entry (one pointing at a ROOT_ITEM), that
    /// subvolume's root directory.
    pub id: InodeId,
    /// The inode's type, as the entry records it.
    pub kind: FileKind,
    /// Pass this as `from` to `Filesystem::readdir` to continue after this entry.
    pub next_offset: u64,
}

/// One subvolume or snapshot, from its ROOT_ITEM and ROOT_BACKREF in the root tree, as
/// `btrfs subvolume list` and `show` print it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubvolumeInfo {
    /// Its tree id: 5 for the top-level subvolume (FS_TREE), 256 and up for the others.
    pub id: u64,
    /// Parent subvolume and the directory inode in it that holds this one's entry.
    pub parent: Option<(u64, u64)>,
    /// The name of its entry in the parent's directory.
    pub name: Vec<u8>,
    /// Path from the top-level subvolume (5), when reachable.
    pub path: Option<Vec<u8>>,
    /// Its own uuid.
    pub uuid: [u8; 16],
    /// For a snapshot, the uuid of the subvolume it was taken of; zeros otherwise.
    pub parent_uuid: [u8; 16],
    /// The transaction that last changed its tree (ROOT_ITEM generation).
    pub generation: u64,
    /// The transaction that last changed its files (ROOT_ITEM ctransid): what a send
    /// stream names the subvolume's state by.
    pub ctransid: u64,
    /// A read-only subvolume (BTRFS_ROOT_SUBVOL_RDONLY): every change is refused.
    pub readonly: bool,
    /// What `btrfs subvolume show` prints besides: the uuid it was received as, the
    /// transactions that created it, sent and received it, and when (seconds, nanoseconds).
    pub received_uuid: [u8; 16],
    /// Transaction that created it.
    pub otransid: u64,
    /// Transaction it was sent in (send/receive), 0 if never.
    pub stransid: u64,
    /// Transaction it was received in, 0 if never.
    pub rtransid: u64,
    /// When it was created.
    pub otime: (i64, u32),
    /// When it was sent.
    pub stime: (i64, u32),
    /// When it was received.
    pub rtime: (i64, u32),
}

/// What statfs(2) shows, in `block_size` units, computed from the block groups as the
/// kernel's btrfs does in spirit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StatFs {
    /// The unit of the counts below: the sectorsize.
    pub block_size: u32,
    /// The devices' size (the superblock's total_bytes), divided by the copies the data
    /// profile keeps, as btrfs_statfs counts.
    pub blocks: u64,
    /// What no block group uses (every copy counted, then divided as `blocks`), less the
    /// global block reserve.
    pub blocks_free: u64,
    /// What new file data can still get: free space in data block groups plus the data
    /// chunks unallocated space would give (never a device's first MiB); 0 once metadata
    /// can neither grow nor hold the global reserve.
    pub blocks_avail: u64,
    /// Total inodes: 0, as btrfs reports (inodes are not preallocated).
    pub files: u64,
    /// Free inodes: 0, as btrfs reports.
    pub files_free: u64,
    /// Longest name: 255 bytes.
    pub name_max: u32,
}

/// Decompressed extents are weighed by their size in the cache.
#[derive(Clone)]
pub struct ExtentWeight;

/// Decompressed extents by disk address (see `file_read`).
pub(crate) type ExtentCache = quick_cache::sync::Cache<u64, Arc<Vec<u8>>, ExtentWeight>;

impl quick_cache::Weighter<u64, Arc<Vec<u8>>> for ExtentWeight {
    fn weight(&self, _k: &u64, v: &Arc<Vec<u8>>) -> u64 {
        v.len() as u64 + 64
    }
}

/// An open btrfs filesystem's state (the kernel's fs_info). `Filesystem` holds it behind
/// its lock; a `Transaction` derefs to it.
pub(crate) struct FsCore {
    /// Shared with commits writing in the background.
    pub(crate) io: Arc<DiskIo>,
    pub(crate) sb: Superblock,
    pub(crate) root_tree: TreeRoot,
    pub(crate) csum_tree: Option<TreeRoot>,
    /// Subvolume trees by id (None: no such live subvolume). Read-only, so never stale.
    pub(crate) subvol_roots: RwLock<HashMap<u64, Option<TreeRoot>>>,
    /// Trees whose root comes from a backup slot rather than the root tree
    /// (`usebackuproot` with the newest root tree lost); read-only opens only.
    pub(crate) rescue_roots: HashMap<u64, TreeRoot>,
    pub(crate) inodes: Cache<InodeId, Arc<InodeItem>>,
    pub(crate) extents: Arc<ExtentCache>,
    pub(crate) top: InodeId,
    pub(crate) pending_log: bool,
    /// Why the pending log was not replayed (it keeps the filesystem read-only).
    pub(crate) log_not_replayed: Option<String>,
    /// The log is replayed into a running transaction that is never committed (a
    /// read-only open): nothing else may join it.
    pub(crate) log_in_memory: bool,
    /// The running transaction between operations (see `transaction`).
    pub(crate) running: Option<Box<crate::transaction::TxnState>>,
    /// Why writing stopped (an aborted transaction).
    pub(crate) aborted: Option<String>,
    /// Files up to this many bytes are stored inline (mount option max_inline).
    pub(crate) max_inline: u64,
    /// Mount options `nodatacow` and `nodatasum`: flags of new regular files.
    pub(crate) mount_nodatacow: bool,
    pub(crate) mount_nodatasum: bool,
    /// The mount's compress= or compress-force=.
    pub(crate) compress: Option<crate::transaction::options::Compress>,
    /// Dirty tree blocks beyond this many bytes force a commit.
    pub(crate) dirty_limit: u64,
    /// Next free inode number per subvolume, and next DIR_INDEX per directory (only we
    /// write, so they stay valid across commits).
    pub(crate) next_ino: Mutex<HashMap<u64, u64>>,
    pub(crate) next_index: Mutex<foldhash::HashMap<InodeId, u64>>,
    /// Directories' default ACLs (None: none), read on every create in them
    /// (`FsCore::default_acl`); forgotten when the directory's xattrs change.
    pub(crate) default_acls: Mutex<HashMap<InodeId, Option<Arc<[u8]>>>>,
    /// Whether each subvolume met so far is read-only (ROOT_ITEM flag; we never change it).
    pub(crate) readonly_subvols: Mutex<HashMap<u64, bool>>,
    /// The global reserve statfs subtracts, with the root tree it was read from (bytenr,
    /// generation): the ROOT_ITEMs it sums change only in a commit, which copies the root
    /// tree (`FsCore::global_reserve`).
    pub(crate) reserve_cache: Mutex<Option<(u64, u64, u64)>>,
    /// Direct-IO-aligned buffers reused by writes (see `ordered_extent`): one per writer
    /// at a time, so that concurrent writes do not each map and fault in a fresh one.
    pub(crate) staging: Mutex<Vec<crate::io::device::IoBuf>>,
    /// The names of directories made here, readable without the lock (`name_sets`).
    pub(crate) names: std::sync::Arc<super::name_sets::NameSets>,
    /// Open counts of inodes (see `pin_open`), shared with `Filesystem`, which pins and
    /// unpins without the filesystem's lock.
    pub(crate) open_inodes: std::sync::Arc<OpenInodes>,
    /// Block groups between transactions: loaded once, carried from each transaction to
    /// the next (with what commits still writing have freed kept pinned).
    pub(crate) block_groups: Option<crate::transaction::space::block_group::BlockGroups>,
    /// Commits writing in the background: their order and outcome (see `transaction`).
    pub(crate) pipe: Arc<crate::transaction::commit_pipe::CommitPipe>,
    /// What a drop runs (closing open files, then a commit), set by the layer that opened
    /// the filesystem: closing files belongs to the layers above this one.
    pub(crate) on_close: Option<fn(&mut FsCore) -> Result<()>>,
}

impl Drop for FsCore {
    /// Dropping a writable filesystem commits what it has, as an unmount does: writes must
    /// not vanish because a program forgot `sync` or `close`.
    fn drop(&mut self) {
        if std::thread::panicking() {
            return;
        }
        let Some(close) = self.on_close else {
            return;
        };
        if let Err(e) = close(self) {
            log::error!(
                "closing the filesystem: the final commit failed, changes since generation {} are lost: {e}",
                self.sb.generation
            );
        }
    }
}

/// Why a device of `size` bytes cannot hold the filesystem its superblock describes.
pub(crate) fn too_small(size: u64, sb: &Superblock) -> Option<String> {
    too_small_for(size, sb.dev_item.total_bytes)
}

fn too_small_for(size: u64, want: u64) -> Option<String> {
    (size < want).then(|| {
        format!(
            "the device is {size} bytes, smaller than the {want} bytes the filesystem spans \
             (a truncated image?)"
        )
    })
}

impl FsCore {
    /// Opens an image file or block device (read-only unless `options.read_only` is false):
    /// the device claimed, the superblock, chunk tree and root tree read. The rest of a
    /// mount (subvolume, log replay, orphans) is the layers' above (`filesystem::mount`).
    pub(crate) fn open(path: impl AsRef<Path>, options: OpenOptions) -> Result<FsCore> {
        let path = path.as_ref();
        let mut paths = vec![path.to_path_buf()];
        paths.extend(options.devices.iter().cloned());
        let rescue = options.rescue.clone();
        if rescue.any() && !options.read_only {
            return Err(Error::InvalidArgument(format!(
                "rescue={} and sb= need a read-only open",
                rescue.names().join(":")
            )));
        }
        let (mut devices, sb) =
            DeviceSet::open_copy(&paths, !options.read_only, false, rescue.super_copy)?;
        if options.write_behind && !options.read_only {
            devices.start_write_behind()?;
        }
        check_features(&sb)?;
        check_super_flags(&sb, &options)?;
        for (devid, m) in devices.members() {
            let want = devices.dev_item(devid).map_or(0, |d| d.total_bytes);
            if let Some(why) = too_small_for(m.device.size(), want) {
                if !options.read_only {
                    return Err(Error::Unsupported(format!(
                        "{}: {why}: refusing to write to it (the kernel refuses such a device too)",
                        m.path.display()
                    )));
                }
                log::warn!("{}: {why}: reading what it holds", m.path.display());
            }
        }
        let ctx = sb.fs_context();
        let mut sys = ChunkMap::default();
        for (logical, chunk) in sb
            .sys_chunks()
            .map_err(|e| Error::Unusable(format!("sys_chunk_array: {e}")))?
        {
            sys.insert(logical, chunk)?;
        }
        let cache_bytes = options.cache_bytes.max(1 << 20);
        let mut io = DiskIo::new(devices, sys, ctx, cache_bytes);
        io.set_rescue(rescue.clone());
        let backups = backup_slots(&sb, rescue.use_backup_root);
        let chunk_root = read_chunks(&io, &sb, &backups)?;
        check_devices(&mut io, &chunk_root, &options)?;
        let pending_log = sb.log_root != 0;
        let root_tree = TreeRoot {
            id: objectid::ROOT_TREE,
            bytenr: sb.root,
            level: sb.root_level,
            generation: sb.generation,
        };
        let entries = (cache_bytes / 8 / 256).max(1024) as usize;
        let extent_bytes = (cache_bytes / 8).max(4 << 20);
        let pipe = Arc::new(crate::transaction::commit_pipe::CommitPipe::new(
            sb.generation,
        ));
        let mut fs = FsCore {
            io: Arc::new(io),
            sb,
            root_tree,
            csum_tree: None,
            subvol_roots: RwLock::new(HashMap::new()),
            rescue_roots: HashMap::new(),
            inodes: Cache::new(entries),
            extents: Arc::new(Cache::with_weighter(entries, extent_bytes, ExtentWeight)),
            top: InodeId {
                subvol: objectid::FS_TREE,
                ino: objectid::FIRST_FREE,
            },
            pending_log,
            log_not_replayed: None,
            log_in_memory: false,
            running: None,
            aborted: None,
            max_inline: options.max_inline,
            mount_nodatacow: options.nodatacow,
            mount_nodatasum: options.nodatasum || options.nodatacow,
            compress: options.compress,
            dirty_limit: (cache_bytes / 2).max(4 << 20),
            next_ino: Mutex::new(HashMap::new()),
            next_index: Mutex::new(Default::default()),
            default_acls: Mutex::new(HashMap::new()),
            open_inodes: Default::default(),
            names: Default::default(),
            readonly_subvols: Mutex::new(HashMap::new()),
            reserve_cache: Mutex::new(None),
            staging: Mutex::new(Vec::new()),
            block_groups: None,
            pipe,
            on_close: None,
        };
        if let Some(bytenr) = rescue.tree_root {
            fs.use_root_block(bytenr)?;
            fs.load_roots(false)?;
            return Ok(fs);
        }
        let own = (fs.root_tree, fs.sb.clone(), fs.pending_log);
        let strict = !backups.is_empty();
        // The slot of the superblock's own commit still names that commit's tree 5 and
        // csum tree: with an older root tree for the rest, the newest files show.
        let newest = sb_slot(&fs.sb).filter(|_| strict);
        let mut tries = vec![(None, false)];
        for b in &backups {
            if newest.is_some() {
                tries.push((Some(b), true));
            }
            tries.push((Some(b), false));
        }
        let mut first_err = None;
        for (slot, newest_trees) in tries {
            fs.rescue_roots.clear();
            if let Some(b) = slot {
                let r = fs.root_tree;
                let why = first_err
                    .as_ref()
                    .map(|e: &Error| e.to_string())
                    .unwrap_or_default();
                fs.io.skips().note("usebackuproot", b.tree_root, || {
                    format!(
                        "root tree of generation {} at {} unusable ({why}); trying the backup root of generation {}",
                        r.generation, r.bytenr, b.tree_root_gen
                    )
                });
                fs.drop_running();
                fs.use_backup_root(b);
            }
            if let Some(n) = newest.as_ref().filter(|_| newest_trees) {
                fs.rescue_roots.insert(objectid::FS_TREE, n.0);
            }
            match fs.load_roots(strict) {
                Ok(()) => {
                    if let Some(n) = newest.as_ref().filter(|_| newest_trees) {
                        fs.use_newest_slot(n);
                    }
                    return Ok(fs);
                }
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        let e = first_err.expect("the superblock's own root is always tried");
        if !strict {
            return Err(e);
        }
        // No backup did better: the superblock's own root, showing what of it reads.
        fs.drop_running();
        fs.rescue_roots.clear();
        (fs.root_tree, fs.sb, fs.pending_log) = own;
        fs.load_roots(false).map_err(|_| e)?;
        Ok(fs)
    }

    /// Reads what every open needs from the root tree: the root block, the csum tree's
    /// root, the device stats and tree 5. Under `ignorebadroots` the csum and device trees
    /// may be left out.
    fn load_roots(&mut self, strict_top: bool) -> Result<()> {
        let rt = self.root_tree;
        // Reading the root tree's root block now turns a bad root into one clear refusal.
        self.io
            .read_tree_block(rt.bytenr, Some(rt.level), Some(rt.generation), None)
            .map_err(|e| Error::Unusable(format!("cannot read the root tree: {e}")))?;
        let bad_roots = self.io.rescue().ignore_bad_roots;
        let csum = self
            .read_root_item(objectid::CSUM_TREE)
            .and_then(|r| match r {
                Some((root, _)) if bad_roots => self
                    .io
                    .read_tree_block(root.bytenr, Some(root.level), Some(root.generation), None)
                    .map(|_| Some(root)),
                r => Ok(r.map(|(root, _)| root)),
            });
        self.csum_tree = match csum {
            Ok(c) => c,
            Err(e) if bad_roots && !matches!(e, Error::NotCached(_)) => {
                self.io
                    .skips()
                    .note("ignorebadroots", objectid::CSUM_TREE, || {
                        format!("the csum tree is unreadable ({e}): data is read unverified")
                    });
                None
            }
            Err(e) => return Err(e),
        };
        if let Err(e) = self.load_dev_stats() {
            if !bad_roots {
                return Err(e);
            }
            self.io
                .skips()
                .note("ignorebadroots", objectid::DEV_TREE, || {
                    format!("the device tree is unreadable ({e}): error counters start at zero")
                });
        }
        let Some(top) = self.subvol_root(objectid::FS_TREE)? else {
            return Err(Error::Unusable(
                "the top-level subvolume (tree 5) is missing".into(),
            ));
        };
        // With backups to go to, an unreadable tree 5 is a reason to (the kernel's mount
        // fails on it); without, what else reads is still worth showing.
        if strict_top {
            self.io
                .read_tree_block(top.bytenr, Some(top.level), Some(top.generation), None)
                .map_err(|e| Error::Unusable(format!("cannot read tree 5's root: {e}")))?;
        }
        Ok(())
    }

    /// Takes the csum tree of the superblock's own commit from its backup slot too (tree
    /// 5's is taken already), when it reads; says which trees are how old.
    fn use_newest_slot(&mut self, n: &(TreeRoot, Option<TreeRoot>)) {
        if let Some(c) = n.1 {
            if self
                .io
                .read_tree_block(c.bytenr, Some(c.level), Some(c.generation), None)
                .is_ok()
            {
                self.csum_tree = Some(c);
            }
        }
        let (newest, rest) = (n.0.generation, self.root_tree.generation);
        self.io.skips().note("usebackuproot", n.0.bytenr, || {
            format!(
                "tree 5 (and the csum tree) of generation {newest} from its backup slot; \
                 the root tree and other subvolumes as of generation {rest}"
            )
        });
    }

    /// Opens from the root tree block at `bytenr` (`Rescue::tree_root`): its level and
    /// generation are its header's, as nothing else points at it.
    fn use_root_block(&mut self, bytenr: u64) -> Result<()> {
        let block = self
            .io
            .read_tree_block(bytenr, None, None, None)
            .map_err(|e| Error::Unusable(format!("root tree block {bytenr}: {e}")))?;
        let tb = oleo_format::TreeBlock::new(&block)
            .map_err(|e| Error::corrupt(bytenr, e.to_string()))?;
        let owner = tb
            .header()
            .map_err(|e| Error::corrupt(bytenr, e.to_string()))?
            .owner;
        if owner != objectid::ROOT_TREE {
            return Err(Error::InvalidArgument(format!(
                "block {bytenr} belongs to tree {owner}, not to the root tree"
            )));
        }
        self.use_backup_root(&BackupRoot {
            tree_root: bytenr,
            tree_root_gen: tb.generation(),
            tree_root_level: tb.level(),
            ..BackupRoot::default()
        });
        Ok(())
    }

    /// Opens from an older root tree (`usebackuproot`): what was written after it, the
    /// log included, is not seen.
    fn use_backup_root(&mut self, b: &BackupRoot) {
        self.root_tree = TreeRoot {
            id: objectid::ROOT_TREE,
            bytenr: b.tree_root,
            level: b.tree_root_level,
            generation: b.tree_root_gen,
        };
        self.sb.root = b.tree_root;
        self.sb.root_level = b.tree_root_level;
        self.sb.log_root = 0;
        self.pending_log = false;
    }

    /// The root directory of the opened subvolume.
    pub(crate) fn root(&self) -> InodeId {
        self.top
    }

    pub(crate) fn superblock(&self) -> &Superblock {
        &self.sb
    }

    /// True when the image has a log tree that was not replayed.
    pub(crate) fn has_pending_log(&self) -> bool {
        self.pending_log
    }

    /// The ROOT_ITEM of tree `id` (any offset: snapshots carry their creation transid).
    pub(crate) fn read_root_item(&self, id: u64) -> Result<Option<(TreeRoot, RootItem)>> {
        let mut found = None;
        crate::ctree::for_each_in_range(
            self,
            &self.root_tree(),
            Key::new(id, item::ROOT_ITEM, 0),
            Key::new(id, item::ROOT_ITEM, u64::MAX),
            |key, data| {
                let ri = RootItem::parse(data)
                    .map_err(|e| Error::corrupt(0, format!("root item {key:?}: {e}")))?;
                found = Some((
                    TreeRoot {
                        id,
                        bytenr: ri.bytenr,
                        level: ri.level,
                        generation: ri.generation,
                    },
                    ri,
                ));
                Ok(ControlFlow::Break(()))
            },
        )?;
        Ok(found)
    }

    /// The root of tree `id` as the running transaction left it, if it changed it.
    pub(crate) fn running_root(&self, id: u64) -> Option<TreeRoot> {
        self.running
            .as_ref()
            .and_then(|t| t.roots.get(&id).copied())
    }

    /// The root tree as current reads see it.
    pub(crate) fn root_tree(&self) -> TreeRoot {
        self.running_root(objectid::ROOT_TREE)
            .unwrap_or(self.root_tree)
    }

    /// The checksum tree as current reads see it.
    pub(crate) fn csum_root(&self) -> Option<TreeRoot> {
        self.running_root(objectid::CSUM_TREE).or(self.csum_tree)
    }

    /// Forgets the running transaction and every cache that may hold its view.
    pub(crate) fn drop_running(&mut self) {
        self.running = None;
        self.block_groups = None;
        if self.aborted.is_some() {
            self.next_ino.lock().clear();
            self.next_index.lock().clear();
            self.names.clear();
        }
        self.subvol_roots.write().clear();
        self.default_acls.lock().clear();
        self.inodes.clear();
        self.extents.clear();
    }

    /// An aligned buffer of at least `len` bytes (contents undefined).
    pub(crate) fn take_staging(&self, len: usize) -> crate::io::device::IoBuf {
        let mut pool = self.staging.lock();
        match pool.iter().position(|b| b.len() >= len) {
            Some(i) => pool.swap_remove(i),
            None => crate::io::device::IoBuf::zeroed(len.next_multiple_of(1 << 20)),
        }
    }

    /// Keeps a buffer for a later write, unless it is too big or enough are kept.
    pub(crate) fn give_back_staging(&self, buf: crate::io::device::IoBuf) {
        const KEEP: usize = 32;
        let mut pool = self.staging.lock();
        if buf.len() <= 8 << 20 && pool.len() < KEEP {
            pool.push(buf);
        }
    }

    /// Memory held by the running transaction's dirty tree blocks.
    pub(crate) fn dirty_bytes(&self) -> u64 {
        self.running
            .as_ref()
            .map_or(0, |t| t.dirty.len() as u64 * u64::from(self.sb.nodesize))
    }

    /// True while changes are waiting for a commit.
    pub(crate) fn has_uncommitted_changes(&self) -> bool {
        self.running.as_deref().is_some_and(|t| !t.is_idle())
    }

    /// Makes a closed transaction's superblock the in-memory state (its blocks are served
    /// from memory until written): new roots, the block groups carried over to the next
    /// transaction with this one's freed space pinned until it is durable. Caches stay:
    /// they hold what the closed transaction showed, which is what it committed; only
    /// subvolume roots and decompressed extents (keyed by addresses that may be reused)
    /// go.
    pub(crate) fn committed(&mut self, mut sb: Superblock, root_tree: TreeRoot) -> Result<()> {
        sb.bytenr = superblock::SUPER_PRIMARY_OFFSET;
        self.io.set_super_generation(sb.generation);
        self.root_tree = root_tree;
        let transid = sb.generation;
        self.sb = sb;
        if let Some(st) = self.running.take() {
            let st = *st;
            let mut groups = st.block_groups;
            // The log is done with: its blocks stay pinned until this commit is durable.
            st.log.blocks.release(&mut groups, self.sb.nodesize);
            groups.carry_over(transid);
            self.block_groups = Some(groups);
        }
        self.subvol_roots.write().clear();
        self.extents.clear();
        self.csum_tree = self.read_root_item(objectid::CSUM_TREE)?.map(|(r, _)| r);
        Ok(())
    }

    /// (writes, flushes) issued to the device since it was opened.
    pub(crate) fn io_counts(&self) -> (u64, u64) {
        self.io.device().io_counts()
    }

    /// Records every device write and flush from now on (crash simulation).
    pub(crate) fn start_io_recording(&self) {
        self.io.device().start_recording();
    }

    /// The writes and flushes recorded so far (one device).
    pub(crate) fn take_io_recording(&self) -> Vec<crate::io::device::IoEvent> {
        self.take_io_recording_devices()
            .into_iter()
            .map(|(_, e)| e)
            .collect()
    }

    /// The writes and flushes recorded so far on every device, in order, with their devid.
    pub(crate) fn take_io_recording_devices(&self) -> Vec<(u64, crate::io::device::IoEvent)> {
        self.io.device().take_recording()
    }

    /// Makes every later write to the device fail after `writes` more (crash tests).
    pub(crate) fn fail_writes_after(&self, writes: u64) {
        self.io.device().fail_writes_after(writes);
    }
}

fn check_features(sb: &Superblock) -> Result<()> {
    let unknown = sb.incompat_flags & !incompat::READ_SUPPORTED;
    if unknown != 0 {
        let names = superblock::flag_names(unknown, incompat::NAMES).join(", ");
        return Err(Error::Unusable(format!(
            "the filesystem uses features oleo cannot read: {names}"
        )));
    }
    Ok(())
}

/// The superblock's `flags`, as the kernel's validate_super checks them: a bit it does not
/// mount with (an unknown one, or an interrupted btrfstune's CHANGING_*) refuses the open
/// unless `rescue=ignoresuperflags` (read-only); and a writable open needs the flags oleo
/// writes with (not ERROR, SEEDING or METADUMP; METADUMP_V2 is written, as the kernel does).
fn check_super_flags(sb: &Superblock, options: &OpenOptions) -> Result<()> {
    use superblock::super_flags;
    // Known bits by name, the others as "bit N".
    let names = |bits: u64| {
        (0..64)
            .map(|b| 1u64 << b)
            .filter(|bit| bits & bit != 0)
            .map(
                |bit| match super_flags::NAMES.iter().find(|(v, _)| *v == bit) {
                    Some((_, n)) => n.to_string(),
                    None => format!("bit {}", bit.trailing_zeros()),
                },
            )
            .collect::<Vec<_>>()
            .join(", ")
    };
    let unknown = sb.flags & !super_flags::KERNEL_MOUNTS;
    if unknown != 0 {
        if options.rescue.ignore_super_flags {
            log::warn!(
                "rescue: ignoresuperflags: superblock flags {} ({unknown:#x}) ignored, read-only",
                names(unknown)
            );
        } else {
            return Err(Error::Unusable(format!(
                "superblock flags {} ({unknown:#x}) are not supported (the kernel refuses to \
                 mount such a filesystem too); `-o ro,rescue=ignoresuperflags` reads it",
                names(unknown)
            )));
        }
    }
    let unwritable = sb.flags & !super_flags::WRITE_SUPPORTED & super_flags::KERNEL_MOUNTS;
    if !options.read_only && unwritable != 0 {
        return Err(Error::Unusable(format!(
            "superblock flag {} ({unwritable:#x}) is set: refusing to write (mount it read-only)",
            names(unwritable)
        )));
    }
    Ok(())
}

impl FsCore {
    /// The devices' error counters from the DEV_STATS items of the device tree.
    fn load_dev_stats(&self) -> Result<()> {
        let Some((root, _)) = self.read_root_item(objectid::DEV_TREE)? else {
            return Ok(());
        };
        let min = Key::new(objectid::DEV_STATS, item::PERSISTENT_ITEM, 0);
        let max = Key::new(objectid::DEV_STATS, item::PERSISTENT_ITEM, u64::MAX);
        crate::ctree::for_each_in_range(self, &root, min, max, |key, data| {
            // Shorter items (older kernels) count as zeros past their end.
            let mut v = [0u64; 5];
            for (i, c) in data.chunks_exact(8).take(5).enumerate() {
                v[i] = u64::from_le_bytes(c.try_into().expect("8 bytes"));
            }
            self.io.devices().load_stats(key.offset, v);
            Ok(ControlFlow::Continue(()))
        })?;
        Ok(())
    }
}

/// Matches the devices given against the chunk tree's DEV_ITEMs. A missing device is
/// refused unless `degraded`; then every chunk must keep enough copies to read, and to
/// write when the mount is writable (the kernel's btrfs_check_rw_degradable). RAID5/6
/// chunks are read only.
fn check_devices(io: &mut DiskIo, chunk_root: &TreeRoot, options: &OpenOptions) -> Result<()> {
    let mut items = Vec::new();
    let min = Key::new(objectid::DEV_ITEMS, item::DEV_ITEM, 0);
    let max = Key::new(objectid::DEV_ITEMS, item::DEV_ITEM, u64::MAX);
    crate::ctree::for_each_in_range(&*io, chunk_root, min, max, |key, data| {
        let d = DevItem::parse(data)
            .map_err(|e| Error::corrupt(0, format!("dev item {key:?}: {e}")))?;
        items.push(d);
        Ok(ControlFlow::Continue(()))
    })?;
    let missing = io.devices_mut().match_dev_items(&items)?;
    if let Some((devid, uuid)) = missing.first() {
        if !options.degraded {
            return Err(Error::Unusable(format!(
                "device {devid} (uuid {}) of the filesystem is missing: give it (-o device=PATH), or mount with -o degraded",
                oleo_format::bytes::uuid_string(uuid)
            )));
        }
        let ids: Vec<u64> = missing.iter().map(|(d, _)| *d).collect();
        log::warn!("mounting degraded: devices {ids:?} missing");
    }
    let chunks = io.chunks();
    let mut raid56 = false;
    for (logical, c) in chunks.chunks() {
        let profile = c.chunk_type & bg::PROFILE_MASK;
        raid56 |= profile & (bg::RAID5 | bg::RAID6) != 0;
        let lost = c
            .stripes
            .iter()
            .filter(|s| io.devices().is_missing(s.devid))
            .count();
        if lost == 0 {
            continue;
        }
        let tolerated = match profile {
            bg::RAID1 | bg::RAID10 | bg::RAID5 => 1,
            bg::RAID1C3 | bg::RAID6 => 2,
            bg::RAID1C4 => 3,
            _ => 0,
        };
        // RAID10 loses data only when both halves of one mirror pair are gone; writing
        // needs at most one device missing per chunk, as the kernel decides.
        let pair_lost = profile == bg::RAID10
            && c.stripes
                .chunks(2)
                .any(|p| p.iter().all(|s| io.devices().is_missing(s.devid)));
        let unreadable = if profile == bg::RAID10 {
            pair_lost
        } else {
            lost > tolerated
        };
        if !options.read_only && lost > tolerated {
            return Err(Error::Unusable(format!(
                "chunk at {logical} ({}) misses {lost} of its {} stripes, more than the {tolerated} a writable mount tolerates; a read-only degraded mount may still read it",
                bg::describe(c.chunk_type),
                c.stripes.len()
            )));
        }
        if unreadable {
            log::warn!(
                "chunk at {logical} ({}) lost {lost} of its {} stripes with the missing devices: its data cannot be read",
                bg::describe(c.chunk_type),
                c.stripes.len()
            );
        }
    }
    if raid56 && !options.read_only {
        return Err(Error::Unsupported(
            "the filesystem has RAID5/6 chunks, which oleo reads but does not write yet: mount it read-only (-o ro)".into(),
        ));
    }
    Ok(())
}

/// Tree 5's and the csum tree's roots as the backup slot of the superblock's own commit
/// records them.
fn sb_slot(sb: &Superblock) -> Option<(TreeRoot, Option<TreeRoot>)> {
    let b = sb
        .backup_roots
        .iter()
        .find(|b| b.tree_root_gen == sb.generation && b.fs_root != 0)?;
    let fs = TreeRoot {
        id: objectid::FS_TREE,
        bytenr: b.fs_root,
        level: b.fs_root_level,
        generation: b.fs_root_gen,
    };
    let csum = (b.csum_root != 0).then_some(TreeRoot {
        id: objectid::CSUM_TREE,
        bytenr: b.csum_root,
        level: b.csum_root_level,
        generation: b.csum_root_gen,
    });
    Some((fs, csum))
}

/// The backup roots to try after the superblock's own (`usebackuproot`), newest first:
/// only those older than the superblock (a newer one was never committed).
fn backup_slots(sb: &Superblock, wanted: bool) -> Vec<BackupRoot> {
    if !wanted {
        return Vec::new();
    }
    let mut v: Vec<BackupRoot> = sb
        .backup_roots
        .iter()
        .filter(|b| b.tree_root != 0 && b.tree_root_gen < sb.generation && b.tree_root != sb.root)
        .cloned()
        .collect();
    v.sort_by_key(|b| std::cmp::Reverse(b.tree_root_gen));
    v
}

/// Reads the chunk tree into the map; with backups (`usebackuproot`), an unreadable
/// chunk root falls back to theirs. Returns the root used.
fn read_chunks(io: &DiskIo, sb: &Superblock, backups: &[BackupRoot]) -> Result<TreeRoot> {
    let first = TreeRoot {
        id: objectid::CHUNK_TREE,
        bytenr: sb.chunk_root,
        level: sb.chunk_root_level,
        generation: sb.chunk_root_generation,
    };
    let mut tries = vec![first];
    for b in backups {
        if b.chunk_root != 0 && tries.iter().all(|t| t.bytenr != b.chunk_root) {
            tries.push(TreeRoot {
                id: objectid::CHUNK_TREE,
                bytenr: b.chunk_root,
                level: b.chunk_root_level,
                generation: b.chunk_root_gen,
            });
        }
    }
    let mut last = None;
    for root in tries {
        match read_chunk_tree(io, &root) {
            Ok(chunks) => {
                io.set_chunks(chunks);
                return Ok(root);
            }
            Err(e) => {
                if last.is_some() || backups.is_empty() {
                    log::warn!("chunk tree at {} unusable: {e}", root.bytenr);
                } else {
                    io.skips().note("usebackuproot", root.bytenr, || {
                        format!(
                            "chunk tree at {} unusable ({e}); trying the backup roots' chunk trees",
                            root.bytenr
                        )
                    });
                }
                last = Some(e);
            }
        }
    }
    Err(Error::Unusable(format!(
        "cannot read the chunk tree: {}",
        last.expect("one try at least")
    )))
}

fn read_chunk_tree(io: &DiskIo, chunk_root: &TreeRoot) -> Result<ChunkMap> {
    let mut map = ChunkMap::default();
    let min = Key::new(objectid::FIRST_CHUNK_TREE, item::CHUNK_ITEM, 0);
    let max = Key::new(objectid::FIRST_CHUNK_TREE, item::CHUNK_ITEM, u64::MAX);
    crate::ctree::for_each_in_range(io, chunk_root, min, max, |key, data| {
        let chunk =
            ChunkItem::parse(data).map_err(|e| Error::corrupt(0, format!("chunk {key:?}: {e}")))?;
        map.insert(key.offset, chunk)?;
        Ok(ControlFlow::Continue(()))
    })?;
    if map.chunks().next().is_none() {
        return Err(Error::Unusable("the chunk tree has no chunks".into()));
    }
    Ok(map)
}

/// Reads see the running transaction's blocks before the disk's.
impl crate::ctree::BlockSource for FsCore {
    fn read_tree_block(
        &self,
        bytenr: u64,
        level: Option<u8>,
        generation: Option<u64>,
        first_key: Option<Key>,
    ) -> Result<crate::io::disk_io::Block> {
        if let Some(block) = self.running.as_ref().and_then(|t| t.dirty.get(&bytenr)) {
            crate::transaction::transaction::check_promises(
                block, bytenr, level, generation, first_key,
            )?;
            return Ok(block.clone());
        }
        self.io
            .read_tree_block(bytenr, level, generation, first_key)
    }

    fn skip_unreadable(&self, bytenr: u64, e: &Error) -> bool {
        self.io.skip_unreadable(bytenr, e)
    }
}

/// A random (version 4) UUID from the OS generator.
pub(crate) fn random_uuid() -> Result<[u8; 16]> {
    let mut u = [0u8; 16];
    getrandom::fill(&mut u).map_err(|e| {
        Error::Io(std::io::Error::other(format!(
            "no randomness for a UUID: {e}"
        )))
    })?;
    u[6] = (u[6] & 0x0f) | 0x40;
    u[8] = (u[8] & 0x3f) | 0x80;
    Ok(u)
}

/// How many users hold each open inode. A leaf lock of its own: pinning and unpinning
/// need not take the filesystem's lock (a file's RELEASE would otherwise wait for another
/// thread's create to finish). What depends on the count is decided under the
/// filesystem's write lock, which reads it again: an unlink that finds the inode open
/// makes it an orphan, and `delete_if_unlinked` deletes only what is neither named nor
/// open. A pin that races an unlink of the last name is no different from one that comes
/// just after it: the lookup that found the inode was already done.
#[derive(Default)]
pub(crate) struct OpenInodes(parking_lot::Mutex<foldhash::HashMap<InodeId, u32>>);

impl OpenInodes {
    pub(crate) fn lock(&self) -> parking_lot::MutexGuard<'_, foldhash::HashMap<InodeId, u32>> {
        self.0.lock()
    }

    /// One more user of `id`.
    pub(crate) fn pin(&self, id: InodeId) {
        *self.lock().entry(id).or_insert(0) += 1;
    }

    /// Whether anyone holds `id`.
    pub(crate) fn is_open(&self, id: InodeId) -> bool {
        self.lock().contains_key(&id)
    }

    /// One user fewer; true if that was the last.
    pub(crate) fn unpin(&self, id: InodeId) -> bool {
        let mut open = self.lock();
        match open.get_mut(&id) {
            Some(n) if *n > 1 => {
                *n -= 1;
                false
            }
            Some(_) => {
                open.remove(&id);
                true
            }
            None => false,
        }
    }
}
