//! `oleo dump-tree`: tree blocks and their items, decoded.
//!
//! The layout follows `btrfs inspect-internal dump-tree` closely (block headers, `item N key
//! (OBJECTID TYPE OFFSET) itemoff O itemsize S`, then the decoded body indented by two tabs),
//! so that people used to that tool read it without effort and scripts can compare the two.
//! Differences: dates are printed in UTC, names that are not printable UTF-8 are escaped, and a
//! few items carry an extra detail (checksum counts, bitmap sizes).

use oleo::format::bytes::uuid_string;
use oleo::format::items::{
    block_group, BlockGroupItem, ChunkItem, Compression, DevExtent, DevItem, DirEntryIter,
    ExtentItem, FileExtent, FileExtentBody, FreeSpaceInfo, InlineRef, InodeExtref, InodeItem,
    InodeRef, RootItem, RootRef, Timespec, EXTENT_FLAG_DATA, EXTENT_FLAG_TREE_BLOCK,
    FILE_EXTENT_INLINE_HEADER,
};
use oleo::format::key::{item, objectid, Key};
use oleo::format::tree_block::{HEADER_SIZE, ITEM_SIZE, KEY_PTR_SIZE};
use oleo::format::TreeBlock;
use oleo::{Filesystem, OpenOptions, TreeRoot};
use std::cell::RefCell;
use std::fmt::Write as _;
use std::io::{self, BufWriter, Write};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct DumpTreeArgs {
    image: PathBuf,
    /// Only this tree (id, e.g. 5 or 256, or a name: root, extent, chunk, dev, fs, csum, quota,
    /// uuid, free-space, block-group, raid-stripe, data-reloc, log).
    #[arg(long, short = 't')]
    tree: Option<String>,
}

pub fn run(args: &DumpTreeArgs) -> Result<(), String> {
    // What is on disk, a pending log included: not what replaying it would give.
    let on_disk = OpenOptions {
        log_replay: false,
        ..OpenOptions::default()
    };
    let fs = Filesystem::open(&args.image, on_disk)
        .map_err(|e| format!("{}: {e}", args.image.display()))?;
    let sb = fs.superblock();
    let ctx = Ctx {
        nodesize: sb.nodesize,
        sectorsize: sb.sectorsize,
        csum_size: sb.csum_type().size(),
        csum_name: sb.csum_type().name(),
    };
    let out = RefCell::new(Out::new());
    let d = Dumper {
        fs: &fs,
        ctx,
        out: &out,
    };
    match &args.tree {
        None => d.dump_all(),
        Some(t) => d.dump_one(parse_tree_arg(t)?)?,
    }
    let mut o = out.into_inner();
    o.flush();
    match o.errors {
        0 => Ok(()),
        1 => Err("1 error while dumping (see ERROR: lines)".into()),
        n => Err(format!("{n} errors while dumping (see ERROR: lines)")),
    }
}

/// What `--tree` asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TreeSel {
    Id(u64),
    Log,
}

fn parse_tree_arg(s: &str) -> Result<TreeSel, String> {
    let t = s.trim();
    if let Ok(n) = t.parse::<u64>() {
        return Ok(if n == objectid::TREE_LOG {
            TreeSel::Log
        } else {
            TreeSel::Id(n)
        });
    }
    if let Ok(n) = t.parse::<i64>() {
        let n = n as u64;
        return Ok(if n == objectid::TREE_LOG {
            TreeSel::Log
        } else {
            TreeSel::Id(n)
        });
    }
    let norm = t.to_ascii_lowercase().replace('_', "-");
    let norm = norm.strip_suffix("-tree").unwrap_or(&norm);
    let id = match norm {
        "root" => objectid::ROOT_TREE,
        "extent" => objectid::EXTENT_TREE,
        "chunk" => objectid::CHUNK_TREE,
        "dev" | "device" => objectid::DEV_TREE,
        "fs" | "top" => objectid::FS_TREE,
        "csum" | "checksum" => objectid::CSUM_TREE,
        "quota" => objectid::QUOTA_TREE,
        "uuid" => objectid::UUID_TREE,
        "free-space" | "freespace" => objectid::FREE_SPACE_TREE,
        "block-group" | "blockgroup" => objectid::BLOCK_GROUP_TREE,
        "raid-stripe" => objectid::RAID_STRIPE_TREE,
        "data-reloc" => objectid::DATA_RELOC_TREE,
        "tree-reloc" | "reloc" => objectid::TREE_RELOC,
        "log" | "tree-log" | "log-root" => return Ok(TreeSel::Log),
        _ => {
            return Err(format!(
                "unknown tree {s:?}: give an id (e.g. 5, 256) or one of root, extent, chunk, \
                 dev, fs, csum, quota, uuid, free-space, block-group, raid-stripe, data-reloc, log"
            ))
        }
    };
    Ok(TreeSel::Id(id))
}

/// Facts about the filesystem that item decoding needs.
#[derive(Clone, Copy)]
struct Ctx {
    nodesize: u32,
    sectorsize: u32,
    csum_size: usize,
    csum_name: &'static str,
}

/// Buffered stdout. A closed pipe (`oleo dump-tree img | head`) ends the process quietly with
/// status 0, another write error with a message and status 1: `walk_tree` cannot be told to
/// stop, and reading the rest of a large tree for nobody would only waste time.
struct Out {
    w: BufWriter<io::Stdout>,
    errors: usize,
}

impl Out {
    fn new() -> Out {
        Out {
            w: BufWriter::with_capacity(1 << 16, io::stdout()),
            errors: 0,
        }
    }

    fn put(&mut self, s: &str) {
        if let Err(e) = self.w.write_all(s.as_bytes()) {
            write_failed(e);
        }
    }

    fn flush(&mut self) {
        if let Err(e) = self.w.flush() {
            write_failed(e);
        }
    }
}

fn write_failed(e: io::Error) -> ! {
    if e.kind() == io::ErrorKind::BrokenPipe {
        std::process::exit(0);
    }
    eprintln!("oleo: dump-tree: writing the output: {e}");
    std::process::exit(1);
}

/// A ROOT_ITEM seen in the root tree (or the log root tree): its key and the tree it points to.
struct RootEntry {
    key: Key,
    root: Result<TreeRoot, String>,
}

struct Dumper<'a> {
    fs: &'a Filesystem,
    ctx: Ctx,
    out: &'a RefCell<Out>,
}

impl Dumper<'_> {
    fn put(&self, s: &str) {
        self.out.borrow_mut().put(s);
    }

    fn error(&self, msg: &str) {
        let mut o = self.out.borrow_mut();
        o.errors += 1;
        o.put(&format!("ERROR: {msg}\n"));
    }

    fn dump_all(&self) {
        let sb = self.fs.superblock();
        let root_entries = match self.fs.tree_root(objectid::ROOT_TREE) {
            Ok(Some(root)) => self.dump_tree("root tree", &root),
            Ok(None) => {
                self.error("the root tree has no root");
                Vec::new()
            }
            Err(e) => {
                self.error(&format!("root tree: {e}"));
                Vec::new()
            }
        };
        match self.fs.tree_root(objectid::CHUNK_TREE) {
            Ok(Some(root)) => {
                self.dump_tree("chunk tree", &root);
            }
            Ok(None) => self.error("the chunk tree has no root"),
            Err(e) => self.error(&format!("chunk tree: {e}")),
        }
        // Like btrfs-progs: the log root tree after the chunk tree, the log trees at the end.
        let log_entries = if sb.log_root != 0 {
            self.dump_log_root()
        } else {
            Vec::new()
        };
        // Every ROOT_ITEM, in root-tree order, then ids the engine knows of that the walk
        // above could not see (a damaged root tree).
        let mut seen = std::collections::HashSet::new();
        for (i, entry) in root_entries.iter().enumerate() {
            seen.insert(entry.key.objectid);
            self.dump_root_entry(&root_entries, i);
        }
        match self.fs.tree_ids() {
            Ok(ids) => {
                for id in ids {
                    if id == objectid::ROOT_TREE || id == objectid::CHUNK_TREE || seen.contains(&id)
                    {
                        continue;
                    }
                    self.dump_by_id(
                        id,
                        &format!("{} {}", tree_title(id), key_str(&root_key(id))),
                    );
                }
            }
            Err(e) => self.error(&format!("listing trees: {e}")),
        }
        self.dump_log_trees(&log_entries);
        self.put(&format!(
            "total bytes {}\nbytes used {}\nuuid {}\n",
            sb.total_bytes,
            sb.bytes_used,
            uuid_string(&sb.fsid)
        ));
    }

    fn dump_one(&self, sel: TreeSel) -> Result<(), String> {
        let id = match sel {
            TreeSel::Log => {
                if self.fs.superblock().log_root == 0 {
                    return Err("this filesystem has no log tree (superblock log_root is 0)".into());
                }
                self.dump_log();
                return Ok(());
            }
            TreeSel::Id(id) => id,
        };
        match id {
            objectid::ROOT_TREE | objectid::CHUNK_TREE => {
                let title = if id == objectid::ROOT_TREE {
                    "root tree"
                } else {
                    "chunk tree"
                };
                let root = self
                    .fs
                    .tree_root(id)
                    .map_err(|e| format!("{title}: {e}"))?
                    .ok_or_else(|| format!("{title}: no root"))?;
                self.dump_tree(title, &root);
                return Ok(());
            }
            _ => {}
        }
        // The ROOT_ITEM keys give the header its key (a snapshot's offset) and cover trees
        // with several ROOT_ITEMs (relocation trees).
        let entries = match self.fs.tree_root(objectid::ROOT_TREE) {
            Ok(Some(root)) => self.scan_root_items(&root),
            _ => Vec::new(),
        };
        let mine: Vec<usize> = (0..entries.len())
            .filter(|&i| entries[i].key.objectid == id)
            .collect();
        if mine.is_empty() {
            match self
                .fs
                .tree_root(id)
                .map_err(|e| format!("tree {id}: {e}"))?
            {
                Some(root) => {
                    self.dump_tree(
                        &format!("{} {}", tree_title(id), key_str(&root_key(id))),
                        &root,
                    );
                }
                None => return Err(format!("tree {} not found", objectid_str(id, 0))),
            }
        } else {
            for i in mine {
                self.dump_root_entry(&entries, i);
            }
        }
        Ok(())
    }

    /// Dumps the tree a ROOT_ITEM of the root tree points to. Entries are in key order, so
    /// the other ROOT_ITEMs of the same object id (relocation trees) are its neighbours.
    fn dump_root_entry(&self, all: &[RootEntry], index: usize) {
        let entry = &all[index];
        let id = entry.key.objectid;
        let title = format!("{} key {}", tree_title(id), key_str(&entry.key));
        let same = |i: Option<usize>| {
            i.and_then(|i| all.get(i))
                .is_some_and(|e| e.key.objectid == id)
        };
        let unique = !same(index.checked_sub(1)) && !same(Some(index + 1));
        if unique {
            self.dump_by_id(id, &title);
        } else {
            match &entry.root {
                Ok(root) => {
                    self.dump_tree(&title, root);
                }
                Err(e) => {
                    self.put(&format!("{title}\n"));
                    self.error(&format!("root item {}: {e}", key_str(&entry.key)));
                }
            }
        }
    }

    fn dump_by_id(&self, id: u64, title: &str) {
        match self.fs.tree_root(id) {
            Ok(Some(root)) => {
                self.dump_tree(title, &root);
            }
            Ok(None) => {
                self.put(&format!("{title}\n"));
                self.error(&format!("tree {}: no root", objectid_str(id, 0)));
            }
            Err(e) => {
                self.put(&format!("{title}\n"));
                self.error(&format!("tree {}: {e}", objectid_str(id, 0)));
            }
        }
    }

    /// The log root tree, then every log tree its ROOT_ITEMs point to.
    fn dump_log(&self) {
        let entries = self.dump_log_root();
        self.dump_log_trees(&entries);
    }

    /// The log root tree; returns its ROOT_ITEMs (one per subvolume with a log tree).
    fn dump_log_root(&self) -> Vec<RootEntry> {
        match self.fs.tree_root(objectid::TREE_LOG) {
            Ok(Some(root)) => self.dump_tree("log root tree", &root),
            Ok(None) => {
                self.error("the log root tree has no root");
                Vec::new()
            }
            Err(e) => {
                self.put("log root tree\n");
                self.error(&format!("log root tree: {e}"));
                Vec::new()
            }
        }
    }

    fn dump_log_trees(&self, entries: &[RootEntry]) {
        for e in entries {
            let title = format!("log tree key {}", key_str(&e.key));
            match &e.root {
                Ok(r) => {
                    self.dump_tree(&title, r);
                }
                Err(err) => {
                    self.put(&format!("{title}\n"));
                    self.error(&format!("root item {}: {err}", key_str(&e.key)));
                }
            }
        }
    }

    /// Prints `title` and every block of the tree; returns the ROOT_ITEMs found in its leaves.
    fn dump_tree(&self, title: &str, root: &TreeRoot) -> Vec<RootEntry> {
        self.put(&format!("{title}\n"));
        let mut entries = Vec::new();
        let mut s = String::new();
        let result = self.fs.walk_tree(
            root,
            &mut |block: TreeBlock| {
                s.clear();
                let errors = print_block(&mut s, &self.ctx, &block);
                collect_root_items(&block, &mut entries);
                let mut o = self.out.borrow_mut();
                o.errors += errors;
                o.put(&s);
            },
            &mut |err| self.error(&err.to_string()),
        );
        if let Err(e) = result {
            self.error(&format!(
                "{title}: cannot read its root block {} (level {}, generation {}): {e}",
                root.bytenr, root.level, root.generation
            ));
        }
        entries
    }

    /// The ROOT_ITEMs of a tree, without printing anything.
    fn scan_root_items(&self, root: &TreeRoot) -> Vec<RootEntry> {
        let mut entries = Vec::new();
        let _ = self.fs.walk_tree(
            root,
            &mut |block: TreeBlock| collect_root_items(&block, &mut entries),
            &mut |_| {},
        );
        entries
    }
}

fn collect_root_items(block: &TreeBlock, entries: &mut Vec<RootEntry>) {
    if !block.is_leaf() {
        return;
    }
    for slot in 0..block.nritems() {
        let Ok(key) = block.item_key(slot) else {
            break;
        };
        if key.item_type != item::ROOT_ITEM {
            continue;
        }
        let root = block
            .item_data(slot)
            .map_err(|e| e.to_string())
            .and_then(|d| RootItem::parse(d).map_err(|e| e.to_string()))
            .map(|ri| TreeRoot {
                id: key.objectid,
                bytenr: ri.bytenr,
                level: ri.level,
                generation: ri.generation,
            });
        entries.push(RootEntry { key, root });
    }
}

/// The key a tree's ROOT_ITEM has when it was not seen (offset 0).
fn root_key(id: u64) -> Key {
    Key::new(id, item::ROOT_ITEM, 0)
}

/// How a tree is introduced, as btrfs-progs does.
fn tree_title(id: u64) -> &'static str {
    match id {
        objectid::ROOT_TREE => "root tree",
        objectid::EXTENT_TREE => "extent tree",
        objectid::CHUNK_TREE => "chunk tree",
        objectid::DEV_TREE => "device tree",
        objectid::FS_TREE => "fs tree",
        objectid::CSUM_TREE => "checksum tree",
        objectid::QUOTA_TREE => "quota tree",
        objectid::UUID_TREE => "uuid tree",
        objectid::FREE_SPACE_TREE => "free space tree",
        objectid::BLOCK_GROUP_TREE => "block group tree",
        objectid::RAID_STRIPE_TREE => "raid stripe tree",
        objectid::TREE_LOG => "log tree",
        objectid::TREE_RELOC => "tree relocation tree",
        objectid::DATA_RELOC_TREE => "data reloc tree",
        id if objectid::is_fs_tree(id) => "file tree",
        _ => "tree",
    }
}

// ---------------------------------------------------------------------------------------------
// Names

/// An object id the way btrfs-progs prints it: well-known ids by name, some depending on the
/// item type (1 is DEV_ITEMS for a DEV_ITEM, 256 FIRST_CHUNK_TREE for a CHUNK_ITEM, ...).
fn objectid_str(id: u64, item_type: u8) -> String {
    match item_type {
        item::PERSISTENT_ITEM if id == objectid::DEV_STATS => return "DEV_STATS".into(),
        item::DEV_EXTENT => return id.to_string(),
        item::QGROUP_RELATION => return qgroup_str(id),
        item::UUID_KEY_SUBVOL | item::UUID_KEY_RECEIVED_SUBVOL => return format!("{id:#018x}"),
        item::DEV_ITEM if id == objectid::DEV_ITEMS => return "DEV_ITEMS".into(),
        item::CHUNK_ITEM if id == objectid::FIRST_CHUNK_TREE => return "FIRST_CHUNK_TREE".into(),
        _ => {}
    }
    let name = match id {
        objectid::ROOT_TREE => "ROOT_TREE",
        objectid::EXTENT_TREE => "EXTENT_TREE",
        objectid::CHUNK_TREE => "CHUNK_TREE",
        objectid::DEV_TREE => "DEV_TREE",
        objectid::FS_TREE => "FS_TREE",
        objectid::ROOT_TREE_DIR => "ROOT_TREE_DIR",
        objectid::CSUM_TREE => "CSUM_TREE",
        objectid::QUOTA_TREE => "QUOTA_TREE",
        objectid::UUID_TREE => "UUID_TREE",
        objectid::FREE_SPACE_TREE => "FREE_SPACE_TREE",
        objectid::BLOCK_GROUP_TREE => "BLOCK_GROUP_TREE",
        objectid::RAID_STRIPE_TREE => "RAID_STRIPE_TREE",
        objectid::BALANCE => "BALANCE",
        objectid::ORPHAN => "ORPHAN",
        objectid::TREE_LOG => "TREE_LOG",
        objectid::TREE_LOG_FIXUP => "TREE_LOG_FIXUP",
        objectid::TREE_RELOC => "TREE_RELOC",
        objectid::DATA_RELOC_TREE => "DATA_RELOC_TREE",
        objectid::EXTENT_CSUM => "EXTENT_CSUM",
        objectid::FREE_SPACE => "FREE_SPACE",
        objectid::FREE_INO => "FREE_INO",
        objectid::MULTIPLE => "MULTIPLE",
        u64::MAX => "-1",
        _ => return id.to_string(),
    };
    name.to_string()
}

/// A qgroup id as `level/id`.
fn qgroup_str(q: u64) -> String {
    format!("{}/{}", q >> 48, q & ((1u64 << 48) - 1))
}

fn key_offset_str(k: &Key) -> String {
    match k.item_type {
        item::QGROUP_INFO | item::QGROUP_LIMIT | item::QGROUP_RELATION => qgroup_str(k.offset),
        item::UUID_KEY_SUBVOL | item::UUID_KEY_RECEIVED_SUBVOL => format!("{:#018x}", k.offset),
        _ => k.offset.to_string(),
    }
}

/// The type of a key by name; type 0 of a v1 free space cache header is `UNTYPED`.
fn type_str(k: &Key) -> String {
    if k.item_type == 0 && k.objectid == objectid::FREE_SPACE {
        return "UNTYPED".into();
    }
    oleo::format::key::item_type_name(k.item_type)
}

/// `(OBJECTID TYPE OFFSET)`, as btrfs-progs prints keys.
fn key_str(k: &Key) -> String {
    format!(
        "({} {} {})",
        objectid_str(k.objectid, k.item_type),
        type_str(k),
        key_offset_str(k)
    )
}

/// A tree id (block owner, backref root) by name.
fn root_str(id: u64) -> String {
    objectid_str(id, 0)
}

/// `0xVALUE(NAME|NAME)`, or `(none)` when no bit is set; unknown bits are shown as hex.
fn flags_str(v: u64, names: &[(u64, &str)]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut rest = v;
    for &(bit, name) in names {
        if v & bit != 0 {
            parts.push(name.to_string());
            rest &= !bit;
        }
    }
    if rest != 0 {
        parts.push(format!("{rest:#x}"));
    }
    if parts.is_empty() {
        format!("{v:#x}(none)")
    } else {
        format!("{v:#x}({})", parts.join("|"))
    }
}

const INODE_FLAG_NAMES: &[(u64, &str)] = &[
    (0x1, "NODATASUM"),
    (0x2, "NODATACOW"),
    (0x4, "READONLY"),
    (0x8, "NOCOMPRESS"),
    (0x10, "PREALLOC"),
    (0x20, "SYNC"),
    (0x40, "IMMUTABLE"),
    (0x80, "APPEND"),
    (0x100, "NODUMP"),
    (0x200, "NOATIME"),
    (0x400, "DIRSYNC"),
    (0x800, "COMPRESS"),
    (0x8000_0000, "ROOT_ITEM_INIT"),
    (1 << 32, "VERITY"),
];

const ROOT_FLAG_NAMES: &[(u64, &str)] = &[(1, "RDONLY"), (1 << 48, "DEAD")];

const HEADER_FLAG_NAMES: &[(u64, &str)] = &[(1, "WRITTEN"), (2, "RELOC")];

fn file_type_str(t: u8) -> String {
    let base = match t & 0x7f {
        0 => "UNKNOWN",
        1 => "FILE",
        2 => "DIR",
        3 => "CHRDEV",
        4 => "BLKDEV",
        5 => "FIFO",
        6 => "SOCK",
        7 => "SYMLINK",
        8 => "XATTR",
        _ => return format!("UNKNOWN.{t}"),
    };
    if t & 0x80 != 0 {
        format!("{base}|ENCRYPTED")
    } else {
        base.to_string()
    }
}

fn compression_raw(c: Compression) -> u8 {
    match c {
        Compression::None => 0,
        Compression::Zlib => 1,
        Compression::Lzo => 2,
        Compression::Zstd => 3,
    }
}

/// Bytes as text: printable UTF-8 as is, everything else as `\xNN`.
fn escaped(b: &[u8]) -> String {
    let mut s = String::with_capacity(b.len());
    for chunk in b.utf8_chunks() {
        for c in chunk.valid().chars() {
            if c.is_control() || c == '\\' {
                let mut buf = [0u8; 4];
                for byte in c.encode_utf8(&mut buf).bytes() {
                    let _ = write!(s, "\\x{byte:02x}");
                }
            } else {
                s.push(c);
            }
        }
        for byte in chunk.invalid() {
            let _ = write!(s, "\\x{byte:02x}");
        }
    }
    s
}

/// An xattr value: text when it is printable UTF-8 (a trailing NUL allowed), else hex.
fn value_str(b: &[u8]) -> String {
    let text = b.strip_suffix(b"\0").unwrap_or(b);
    match std::str::from_utf8(text) {
        Ok(t) if !t.chars().any(|c| c.is_control() && c != '\t') => escaped(b),
        _ => {
            let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
            format!("(hex) {hex}")
        }
    }
}

/// `sec.nsec (YYYY-MM-DD HH:MM:SS)`, the date in UTC.
fn time_str(t: &Timespec) -> String {
    format!("{}.{} ({})", t.sec, t.nsec, utc_date(t.sec))
}

pub(crate) fn utc_date(sec: i64) -> String {
    let days = sec.div_euclid(86_400);
    let rem = sec.rem_euclid(86_400);
    // Days since 1970-01-01 to a proleptic Gregorian date (era-based, valid for all i64/86400).
    let z = days as i128 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + if month <= 2 { 1 } else { 0 };
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

fn hex_dump(s: &mut String, data: &[u8], limit: usize) {
    let shown = &data[..data.len().min(limit)];
    for (i, row) in shown.chunks(16).enumerate() {
        let hex: Vec<String> = row.iter().map(|b| format!("{b:02x}")).collect();
        let _ = writeln!(s, "\t\t{:04x}: {}", i * 16, hex.join(" "));
    }
    if data.len() > limit {
        let _ = writeln!(s, "\t\t... {} more bytes", data.len() - limit);
    }
}

// ---------------------------------------------------------------------------------------------
// Blocks

/// Appends one block (header, then pointers or items) to `s`; returns how many items failed
/// to decode.
fn print_block(s: &mut String, ctx: &Ctx, block: &TreeBlock) -> usize {
    let header = match block.header() {
        Ok(h) => h,
        Err(e) => {
            let _ = writeln!(s, "ERROR: block {}: bad header: {e}", block.bytenr());
            return 1;
        }
    };
    let nr = block.nritems();
    let kind = if block.is_leaf() { "leaf" } else { "node" };
    let body_size = ctx.nodesize as usize - HEADER_SIZE;
    if block.is_leaf() {
        let _ = writeln!(
            s,
            "leaf {} items {} free space {} generation {} owner {}",
            header.bytenr,
            nr,
            leaf_free_space(block, body_size),
            header.generation,
            root_str(header.owner)
        );
    } else {
        let free = (body_size / KEY_PTR_SIZE) as i64 - nr as i64;
        let _ = writeln!(
            s,
            "node {} level {} items {} free space {} generation {} owner {}",
            header.bytenr,
            header.level,
            nr,
            free,
            header.generation,
            root_str(header.owner)
        );
    }
    let flags = header.flags & ((1u64 << 56) - 1);
    let _ = writeln!(
        s,
        "{kind} {} flags {} backref revision {}",
        header.bytenr,
        flags_str(flags, HEADER_FLAG_NAMES),
        header.backref_rev()
    );
    let _ = writeln!(s, "fs uuid {}", uuid_string(&header.fsid));
    let _ = writeln!(s, "chunk uuid {}", uuid_string(&header.chunk_tree_uuid));
    let mut errors = 0;
    if !block.is_leaf() {
        for slot in 0..nr {
            match block.key_ptr(slot) {
                Ok(p) => {
                    let _ = writeln!(
                        s,
                        "\tkey {} block {} gen {}",
                        key_str(&p.key),
                        p.blockptr,
                        p.generation
                    );
                }
                Err(e) => {
                    let _ = writeln!(s, "\tERROR: pointer {slot}: {e}");
                    return errors + 1;
                }
            }
        }
        return errors;
    }
    for slot in 0..nr {
        let ih = match block.item(slot) {
            Ok(ih) => ih,
            Err(e) => {
                let _ = writeln!(s, "\tERROR: item {slot}: {e}");
                return errors + 1;
            }
        };
        let _ = writeln!(
            s,
            "\titem {slot} key {} itemoff {} itemsize {}",
            key_str(&ih.key),
            ih.offset,
            ih.size
        );
        let result = block
            .item_data(slot)
            .map_err(|e| e.to_string())
            .and_then(|data| print_item(s, ctx, &ih.key, data));
        if let Err(e) = result {
            let _ = writeln!(s, "\t\tERROR: {e}");
            errors += 1;
        }
    }
    errors
}

/// Free bytes between the item headers and the item bodies.
fn leaf_free_space(block: &TreeBlock, body_size: usize) -> i64 {
    let nr = block.nritems();
    if nr == 0 {
        return body_size as i64;
    }
    let (Ok(first), Ok(last)) = (block.item(0), block.item(nr - 1)) else {
        return 0;
    };
    let data_end = first.offset as i64 + first.size as i64;
    let used = data_end - last.offset as i64 + (nr * ITEM_SIZE) as i64;
    body_size as i64 - used
}

// ---------------------------------------------------------------------------------------------
// Items

type ItemResult = Result<(), String>;

/// Size of a current (non-legacy) ROOT_ITEM.
const ROOT_ITEM_SIZE: usize = 439;

fn u64s(data: &[u8]) -> impl Iterator<Item = u64> + '_ {
    data.chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("chunks_exact(8)")))
}

fn le64(data: &[u8], off: usize) -> Result<u64, String> {
    oleo::format::bytes::u64_at(data, off).map_err(|e| e.to_string())
}

fn le32(data: &[u8], off: usize) -> Result<u32, String> {
    oleo::format::bytes::u32_at(data, off).map_err(|e| e.to_string())
}

/// Appends the decoded body of one item (lines indented by two tabs).
fn print_item(s: &mut String, ctx: &Ctx, key: &Key, data: &[u8]) -> ItemResult {
    let e = |e: oleo::format::FormatError| e.to_string();
    match key.item_type {
        item::INODE_ITEM => print_inode(s, &InodeItem::parse(data).map_err(e)?),
        item::INODE_REF => {
            for r in InodeRef::parse_all(data).map_err(e)? {
                let _ = writeln!(
                    s,
                    "\t\tindex {} namelen {} name: {}",
                    r.index,
                    r.name.len(),
                    escaped(&r.name)
                );
            }
        }
        item::INODE_EXTREF => {
            for r in InodeExtref::parse_all(data).map_err(e)? {
                let _ = writeln!(
                    s,
                    "\t\tindex {} parent {} namelen {} name: {}",
                    r.index,
                    r.parent,
                    r.name.len(),
                    escaped(&r.name)
                );
            }
        }
        item::DIR_ITEM | item::DIR_INDEX | item::XATTR_ITEM => {
            for entry in DirEntryIter::new(data) {
                let d = entry.map_err(e)?;
                let _ = writeln!(
                    s,
                    "\t\tlocation key {} type {}",
                    key_str(&d.location),
                    file_type_str(d.file_type)
                );
                let _ = writeln!(
                    s,
                    "\t\ttransid {} data_len {} name_len {}",
                    d.transid,
                    d.data.len(),
                    d.name.len()
                );
                let _ = writeln!(s, "\t\tname: {}", escaped(d.name));
                if !d.data.is_empty() {
                    let _ = writeln!(s, "\t\tdata {}", value_str(d.data));
                }
            }
        }
        item::EXTENT_DATA => print_file_extent(s, data)?,
        item::EXTENT_CSUM => {
            if ctx.csum_size == 0 || !data.chunks_exact(ctx.csum_size).remainder().is_empty() {
                return Err(format!(
                    "csum item of {} bytes is not a multiple of the {}-byte {} checksum",
                    data.len(),
                    ctx.csum_size,
                    ctx.csum_name
                ));
            }
            let n = (data.len() / ctx.csum_size) as u64;
            let len = n * ctx.sectorsize as u64;
            let _ = writeln!(
                s,
                "\t\trange start {} end {} length {}",
                key.offset,
                key.offset.wrapping_add(len),
                len
            );
            let _ = writeln!(s, "\t\tcsums {n} ({})", ctx.csum_name);
        }
        item::ROOT_ITEM => print_root_item(s, data)?,
        item::ROOT_REF | item::ROOT_BACKREF => {
            let r = RootRef::parse(data).map_err(e)?;
            let what = if key.item_type == item::ROOT_REF {
                "root ref"
            } else {
                "root backref"
            };
            let _ = writeln!(
                s,
                "\t\t{what} key dirid {} sequence {} name {}",
                r.dirid,
                r.sequence,
                escaped(&r.name)
            );
        }
        item::EXTENT_ITEM | item::METADATA_ITEM => print_extent_item(s, key, data)?,
        // Keyed backrefs carry the root (tree block) or parent (shared) in the key offset.
        item::TREE_BLOCK_REF => {
            let _ = writeln!(s, "\t\ttree block backref");
        }
        item::SHARED_BLOCK_REF => {
            let _ = writeln!(s, "\t\tshared block backref");
        }
        item::EXTENT_DATA_REF => {
            if data.is_empty() || !data.chunks_exact(28).remainder().is_empty() {
                return Err(format!(
                    "extent data ref item of {} bytes is not a multiple of 28",
                    data.len()
                ));
            }
            for r in data.chunks_exact(28) {
                let _ = writeln!(
                    s,
                    "\t\textent data backref root {} objectid {} offset {} count {}",
                    root_str(le64(r, 0)?),
                    le64(r, 8)?,
                    le64(r, 16)?,
                    le32(r, 24)?
                );
            }
        }
        item::SHARED_DATA_REF => {
            // The parent block is the key offset.
            let _ = writeln!(s, "\t\tshared data backref count {}", le32(data, 0)?);
        }
        item::BLOCK_GROUP_ITEM => {
            let b = BlockGroupItem::parse(data).map_err(e)?;
            let _ = writeln!(
                s,
                "\t\tblock group used {} chunk_objectid {} flags {}",
                b.used,
                b.chunk_objectid,
                block_group::describe(b.flags)
            );
        }
        item::FREE_SPACE_INFO => {
            let f = FreeSpaceInfo::parse(data).map_err(e)?;
            let _ = writeln!(
                s,
                "\t\tfree space info extent count {} flags {}",
                f.extent_count, f.flags
            );
        }
        item::FREE_SPACE_EXTENT => {
            let _ = writeln!(s, "\t\tfree space extent");
        }
        item::FREE_SPACE_BITMAP => {
            let free: u32 = data.iter().map(|b| b.count_ones()).sum();
            let _ = writeln!(s, "\t\tfree space bitmap");
            let _ = writeln!(
                s,
                "\t\tlength {} bitmap bytes {} free sectors {free}",
                key.offset,
                data.len()
            );
        }
        item::DEV_EXTENT => {
            let d = DevExtent::parse(data).map_err(e)?;
            let _ = writeln!(s, "\t\tdev extent chunk_tree {}", d.chunk_tree);
            let _ = writeln!(
                s,
                "\t\tchunk_objectid {} chunk_offset {} length {}",
                d.chunk_objectid, d.chunk_offset, d.length
            );
            let _ = writeln!(s, "\t\tchunk_tree_uuid {}", uuid_string(&d.chunk_tree_uuid));
        }
        item::DEV_ITEM => {
            let d = DevItem::parse(data).map_err(e)?;
            let _ = writeln!(
                s,
                "\t\tdevid {} total_bytes {} bytes_used {}",
                d.devid, d.total_bytes, d.bytes_used
            );
            let _ = writeln!(
                s,
                "\t\tio_align {} io_width {} sector_size {} type {}",
                d.io_align, d.io_width, d.sector_size, d.dev_type
            );
            let _ = writeln!(
                s,
                "\t\tgeneration {} start_offset {} dev_group {}",
                d.generation, d.start_offset, d.dev_group
            );
            let _ = writeln!(
                s,
                "\t\tseek_speed {} bandwidth {}",
                d.seek_speed, d.bandwidth
            );
            let _ = writeln!(s, "\t\tuuid {}", uuid_string(&d.uuid));
            let _ = writeln!(s, "\t\tfsid {}", uuid_string(&d.fsid));
        }
        item::CHUNK_ITEM => {
            let c = ChunkItem::parse(data).map_err(e)?;
            let _ = writeln!(
                s,
                "\t\tlength {} owner {} stripe_len {} type {}",
                c.length,
                c.owner,
                c.stripe_len,
                block_group::describe(c.chunk_type)
            );
            let _ = writeln!(
                s,
                "\t\tio_align {} io_width {} sector_size {}",
                c.io_align, c.io_width, c.sector_size
            );
            let _ = writeln!(
                s,
                "\t\tnum_stripes {} sub_stripes {}",
                c.num_stripes, c.sub_stripes
            );
            for (i, st) in c.stripes.iter().enumerate() {
                let _ = writeln!(
                    s,
                    "\t\t\tstripe {i} devid {} offset {}",
                    st.devid, st.offset
                );
                let _ = writeln!(s, "\t\t\tdev_uuid {}", uuid_string(&st.dev_uuid));
            }
        }
        item::ORPHAN_ITEM => {
            let _ = writeln!(s, "\t\torphan item");
        }
        item::UUID_KEY_SUBVOL | item::UUID_KEY_RECEIVED_SUBVOL => {
            if data.is_empty() || !data.chunks_exact(8).remainder().is_empty() {
                return Err(format!(
                    "uuid item of {} bytes is not a list of u64 subvolume ids",
                    data.len()
                ));
            }
            for id in u64s(data) {
                let _ = writeln!(s, "\t\tsubvol_id {id}");
            }
        }
        item::PERSISTENT_ITEM => {
            let _ = writeln!(
                s,
                "\t\tpersistent item objectid {} offset {}",
                objectid_str(key.objectid, key.item_type),
                key.offset
            );
            if key.objectid == objectid::DEV_STATS {
                let _ = writeln!(s, "\t\tdevice stats");
                const NAMES: [&str; 5] = [
                    "write_errs",
                    "read_errs",
                    "flush_errs",
                    "corruption_errs",
                    "generation",
                ];
                let parts: Vec<String> = u64s(data)
                    .enumerate()
                    .map(|(i, v)| match NAMES.get(i) {
                        Some(n) => format!("{n} {v}"),
                        None => format!("value[{i}] {v}"),
                    })
                    .collect();
                let _ = writeln!(s, "\t\t{}", parts.join(" "));
            } else {
                hex_dump(s, data, 64);
            }
        }
        item::QGROUP_STATUS => {
            let raw_flags = le64(data, 16)?;
            let flags = raw_flags;
            let names: Vec<&str> = [
                (1, "ON"),
                (2, "RESCAN"),
                (4, "INCONSISTENT"),
                (8, "SIMPLE_MODE"),
            ]
            .iter()
            .filter(|(b, _)| flags & b != 0)
            .map(|(_, n)| *n)
            .collect();
            let flags = if names.is_empty() {
                format!("{flags:#x}")
            } else {
                names.join("|")
            };
            let _ = write!(
                s,
                "\t\tversion {} generation {} flags {} scan {}",
                le64(data, 0)?,
                le64(data, 8)?,
                flags,
                le64(data, 24)?
            );
            // enable_gen only means something for simple quotas.
            if raw_flags & 8 != 0 && data.len() >= 40 {
                let _ = write!(s, " enable_gen {}", le64(data, 32)?);
            }
            s.push('\n');
        }
        item::QGROUP_INFO => {
            let _ = writeln!(s, "\t\tgeneration {}", le64(data, 0)?);
            let _ = writeln!(
                s,
                "\t\treferenced {} referenced_compressed {}",
                le64(data, 8)?,
                le64(data, 16)?
            );
            let _ = writeln!(
                s,
                "\t\texclusive {} exclusive_compressed {}",
                le64(data, 24)?,
                le64(data, 32)?
            );
        }
        item::QGROUP_LIMIT => {
            let _ = writeln!(s, "\t\tflags {}", le64(data, 0)?);
            let _ = writeln!(
                s,
                "\t\tmax_referenced {} max_exclusive {}",
                le64(data, 8)?,
                le64(data, 16)?
            );
            let _ = writeln!(
                s,
                "\t\trsv_referenced {} rsv_exclusive {}",
                le64(data, 24)?,
                le64(data, 32)?
            );
        }
        item::QGROUP_RELATION => {
            let _ = writeln!(
                s,
                "\t\tqgroup relation {} {}",
                qgroup_str(key.objectid),
                qgroup_str(key.offset)
            );
        }
        item::DIR_LOG_INDEX | item::DIR_LOG_ITEM => {
            let _ = writeln!(s, "\t\tdir log end {}", le64(data, 0)?);
        }
        item::DEV_REPLACE => {
            let _ = writeln!(
                s,
                "\t\tsrc devid {} cursor left {} cursor right {} mode {}",
                le64(data, 0)?,
                le64(data, 8)?,
                le64(data, 16)?,
                le64(data, 24)?
            );
            let _ = writeln!(
                s,
                "\t\tstate {} started {} stopped {}",
                le64(data, 32)?,
                le64(data, 40)?,
                le64(data, 48)?
            );
            let _ = writeln!(
                s,
                "\t\twrite errors {} uncorrectable read errors {}",
                le64(data, 56)?,
                le64(data, 64)?
            );
        }
        item::TEMPORARY_ITEM if key.objectid == objectid::BALANCE => {
            let _ = writeln!(s, "\t\tbalance status flags {:#x}", le64(data, 0)?);
            hex_dump(s, data, 64);
        }
        item::STRING_ITEM => {
            let _ = writeln!(s, "\t\tstring: {}", escaped(data));
        }
        // v1 free space cache header: (FREE_SPACE, 0, block group start) in the root tree.
        0 if key.objectid == objectid::FREE_SPACE => {
            let loc = Key::parse(data, 0).map_err(e)?;
            let _ = writeln!(s, "\t\tlocation key {}", key_str(&loc));
            let _ = writeln!(
                s,
                "\t\tcache generation {} entries {} bitmaps {}",
                le64(data, 17)?,
                le64(data, 25)?,
                le64(data, 33)?
            );
        }
        other => {
            let _ = writeln!(
                s,
                "\t\t{} item, {} bytes:",
                oleo::format::key::item_type_name(other),
                data.len()
            );
            hex_dump(s, data, 64);
        }
    }
    Ok(())
}

fn print_inode(s: &mut String, i: &InodeItem) {
    let _ = writeln!(
        s,
        "\t\tgeneration {} transid {} size {} nbytes {}",
        i.generation, i.transid, i.size, i.nbytes
    );
    let _ = writeln!(
        s,
        "\t\tblock group {} mode {:o} links {} uid {} gid {} rdev {}",
        i.block_group, i.mode, i.nlink, i.uid, i.gid, i.rdev
    );
    let _ = writeln!(
        s,
        "\t\tsequence {} flags {}",
        i.sequence,
        flags_str(i.flags, INODE_FLAG_NAMES)
    );
    let _ = writeln!(s, "\t\tatime {}", time_str(&i.atime));
    let _ = writeln!(s, "\t\tctime {}", time_str(&i.ctime));
    let _ = writeln!(s, "\t\tmtime {}", time_str(&i.mtime));
    let _ = writeln!(s, "\t\totime {}", time_str(&i.otime));
}

fn print_file_extent(s: &mut String, data: &[u8]) -> ItemResult {
    let fe = FileExtent::parse(data).map_err(|e| e.to_string())?;
    let comp = compression_raw(fe.compression);
    match fe.body {
        FileExtentBody::Inline { data: inline } => {
            let _ = writeln!(s, "\t\tgeneration {} type 0 (inline)", fe.generation);
            let _ = writeln!(
                s,
                "\t\tinline extent data size {} ram_bytes {} compression {} ({})",
                inline.len(),
                fe.ram_bytes,
                comp,
                fe.compression.name()
            );
            debug_assert_eq!(inline.len(), data.len() - FILE_EXTENT_INLINE_HEADER);
        }
        FileExtentBody::Extent {
            prealloc,
            disk_bytenr,
            disk_num_bytes,
            offset,
            num_bytes,
        } => {
            if prealloc {
                let _ = writeln!(s, "\t\tgeneration {} type 2 (prealloc)", fe.generation);
                let _ = writeln!(
                    s,
                    "\t\tprealloc data disk byte {disk_bytenr} nr {disk_num_bytes}"
                );
                let _ = writeln!(s, "\t\tprealloc data offset {offset} nr {num_bytes}");
            } else {
                let _ = writeln!(s, "\t\tgeneration {} type 1 (regular)", fe.generation);
                let _ = writeln!(
                    s,
                    "\t\textent data disk byte {disk_bytenr} nr {disk_num_bytes}"
                );
                let _ = writeln!(
                    s,
                    "\t\textent data offset {offset} nr {num_bytes} ram {}",
                    fe.ram_bytes
                );
                let _ = writeln!(
                    s,
                    "\t\textent compression {comp} ({})",
                    fe.compression.name()
                );
            }
        }
    }
    Ok(())
}

fn print_root_item(s: &mut String, data: &[u8]) -> ItemResult {
    let r = RootItem::parse(data).map_err(|e| e.to_string())?;
    let _ = writeln!(
        s,
        "\t\tgeneration {} root_dirid {} bytenr {} byte_limit {} bytes_used {}",
        r.generation,
        r.root_dirid,
        r.bytenr,
        le64(data, 184)?,
        r.bytes_used
    );
    let _ = writeln!(
        s,
        "\t\tlast_snapshot {} flags {} refs {}",
        r.last_snapshot,
        flags_str(r.flags, ROOT_FLAG_NAMES),
        r.refs
    );
    let _ = writeln!(
        s,
        "\t\tdrop_progress key {} drop_level {}",
        key_str(&r.drop_progress),
        r.drop_level
    );
    if data.len() < ROOT_ITEM_SIZE {
        let _ = writeln!(s, "\t\tlevel {}", r.level);
        return Ok(());
    }
    let _ = writeln!(s, "\t\tlevel {} generation_v2 {}", r.level, r.generation_v2);
    // The fields past the legacy size, as stored (RootItem zeroes them when generation_v2 does
    // not match, which is what a reader should trust, but a dump shows the bytes).
    let uuid = |off: usize| -> Result<String, String> {
        oleo::format::bytes::array::<16>(data, off)
            .map(|u| uuid_string(&u))
            .map_err(|e| e.to_string())
    };
    let ts = |off: usize| -> Result<String, String> {
        Timespec::parse(data, off)
            .map(|t| time_str(&t))
            .map_err(|e| e.to_string())
    };
    let _ = writeln!(s, "\t\tuuid {}", uuid(247)?);
    let _ = writeln!(s, "\t\tparent_uuid {}", uuid(263)?);
    let _ = writeln!(s, "\t\treceived_uuid {}", uuid(279)?);
    let _ = writeln!(
        s,
        "\t\tctransid {} otransid {} stransid {} rtransid {}",
        le64(data, 295)?,
        le64(data, 303)?,
        le64(data, 311)?,
        le64(data, 319)?
    );
    let _ = writeln!(s, "\t\tctime {}", ts(327)?);
    let _ = writeln!(s, "\t\totime {}", ts(339)?);
    let _ = writeln!(s, "\t\tstime {}", ts(351)?);
    let _ = writeln!(s, "\t\trtime {}", ts(363)?);
    Ok(())
}

fn print_extent_item(s: &mut String, key: &Key, data: &[u8]) -> ItemResult {
    let skinny = key.item_type == item::METADATA_ITEM;
    let x = ExtentItem::parse(data, skinny).map_err(|e| e.to_string())?;
    let mut names = Vec::new();
    if x.flags & EXTENT_FLAG_DATA != 0 {
        names.push("DATA".to_string());
    }
    if x.flags & EXTENT_FLAG_TREE_BLOCK != 0 {
        names.push("TREE_BLOCK".to_string());
    }
    if x.flags & (1 << 8) != 0 {
        names.push("FULL_BACKREF".to_string());
    }
    let rest = x.flags & !(EXTENT_FLAG_DATA | EXTENT_FLAG_TREE_BLOCK | (1 << 8));
    if rest != 0 {
        names.push(format!("{rest:#x}"));
    }
    let _ = writeln!(
        s,
        "\t\trefs {} gen {} flags {}",
        x.refs,
        x.generation,
        if names.is_empty() {
            "none".to_string()
        } else {
            names.join("|")
        }
    );
    if x.flags & EXTENT_FLAG_TREE_BLOCK != 0 {
        match (&x.tree_block_info, skinny) {
            (_, true) => {
                let _ = writeln!(s, "\t\ttree block skinny level {}", key.offset);
            }
            (Some((k, level)), false) => {
                let _ = writeln!(s, "\t\ttree block key {} level {level}", key_str(k));
            }
            (None, false) => {}
        }
    }
    for r in &x.inline_refs {
        let _ = match r {
            InlineRef::TreeBlock { root } => {
                writeln!(s, "\t\ttree block backref root {}", root_str(*root))
            }
            InlineRef::SharedBlock { parent } => {
                writeln!(s, "\t\tshared block backref parent {parent}")
            }
            InlineRef::Data {
                root,
                objectid,
                offset,
                count,
            } => writeln!(
                s,
                "\t\textent data backref root {} objectid {objectid} offset {offset} count {count}",
                root_str(*root)
            ),
            InlineRef::SharedData { parent, count } => {
                writeln!(s, "\t\tshared data backref parent {parent} count {count}")
            }
            InlineRef::Owner { root } => {
                writeln!(s, "\t\textent owner root {}", root_str(*root))
            }
        };
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates() {
        assert_eq!(utc_date(0), "1970-01-01 00:00:00");
        assert_eq!(utc_date(1_795_261_875), "2026-11-21 11:51:15");
        assert_eq!(utc_date(-1), "1969-12-31 23:59:59");
        assert_eq!(utc_date(951_782_400), "2000-02-29 00:00:00");
    }

    #[test]
    fn keys_like_progs() {
        assert_eq!(
            key_str(&Key::new(5, item::ROOT_ITEM, u64::MAX)),
            "(FS_TREE ROOT_ITEM 18446744073709551615)"
        );
        assert_eq!(
            key_str(&Key::new(1, item::DEV_EXTENT, 4096)),
            "(1 DEV_EXTENT 4096)"
        );
        assert_eq!(
            key_str(&Key::new(256, item::CHUNK_ITEM, 0)),
            "(FIRST_CHUNK_TREE CHUNK_ITEM 0)"
        );
        assert_eq!(
            key_str(&Key::new(0, item::QGROUP_INFO, 257)),
            "(0 QGROUP_INFO 0/257)"
        );
        assert_eq!(
            key_str(&Key::new(0x0540bddeb5c60fe6, item::UUID_KEY_SUBVOL, 1)),
            "(0x0540bddeb5c60fe6 UUID_KEY_SUBVOL 0x0000000000000001)"
        );
        assert_eq!(key_str(&Key::new(0, 0, 0)), "(0 UNKNOWN.0 0)");
    }

    #[test]
    fn tree_args() {
        assert_eq!(parse_tree_arg("5"), Ok(TreeSel::Id(5)));
        assert_eq!(parse_tree_arg("fs"), Ok(TreeSel::Id(5)));
        assert_eq!(parse_tree_arg("free-space"), Ok(TreeSel::Id(10)));
        assert_eq!(parse_tree_arg("FREE_SPACE_TREE"), Ok(TreeSel::Id(10)));
        assert_eq!(
            parse_tree_arg("data-reloc"),
            Ok(TreeSel::Id(objectid::DATA_RELOC_TREE))
        );
        assert_eq!(parse_tree_arg("log"), Ok(TreeSel::Log));
        assert_eq!(parse_tree_arg("-6"), Ok(TreeSel::Log));
        assert!(parse_tree_arg("nope").is_err());
    }

    #[test]
    fn escaping() {
        assert_eq!(escaped(b"plain"), "plain");
        assert_eq!(escaped(b"a\nb"), "a\\x0ab");
        assert_eq!(escaped(b"\xffz"), "\\xffz");
        assert_eq!(escaped("héllo".as_bytes()), "héllo");
    }
}
