//! Round trips: every serializer against its parser, and built blocks against the tree
//! checker. A writer is only as good as the reader that accepts its output.

use crate::csum::{name_hash, CsumType};
use crate::items::*;
use crate::key::{item, objectid, Key};
use crate::leaf_builder::{leaf_data_size, max_node_ptrs, LeafBuilder, NodeBuilder};
use crate::superblock::{BackupRoot, Superblock, MAGIC};
use crate::tree_block::{Header, KeyPtr, TreeBlock};
use crate::validate::{check_tree_block, Expect, FsContext};
use proptest::prelude::*;

fn ts(sec: i64, nsec: u32) -> Timespec {
    Timespec { sec, nsec }
}

fn sample_inode() -> InodeItem {
    InodeItem {
        generation: 3,
        transid: 7,
        size: 88,
        nbytes: 16384,
        block_group: 0,
        nlink: 1,
        uid: 1000,
        gid: 100,
        mode: 0o040755,
        rdev: 0,
        flags: INODE_FLAG_NODATASUM,
        sequence: 9,
        atime: ts(1, 2),
        ctime: ts(3, 4),
        mtime: ts(5, 6),
        otime: ts(-7, 8),
    }
}

#[test]
fn inode_item() {
    let i = sample_inode();
    let b = i.to_bytes();
    assert_eq!(b.len(), InodeItem::SIZE);
    assert_eq!(InodeItem::parse(&b).unwrap(), i);
}

#[test]
fn inode_refs() {
    let refs = vec![
        InodeRef {
            index: 3,
            name: b"big.bin".to_vec(),
        },
        InodeRef {
            index: 4,
            name: b"big-link.bin".to_vec(),
        },
    ];
    let b = InodeRef::to_bytes_all(&refs).unwrap();
    assert_eq!(b.len(), 39, "digest 4.2: two names in one item = 39 bytes");
    assert_eq!(InodeRef::parse_all(&b).unwrap(), refs);
    let ext = vec![InodeExtref {
        parent: 256,
        index: 5,
        name: b"x".to_vec(),
    }];
    let b = InodeExtref::to_bytes_all(&ext).unwrap();
    assert_eq!(InodeExtref::parse_all(&b).unwrap(), ext);
    let long = InodeRef {
        index: 0,
        name: vec![b'a'; 70000],
    };
    assert!(long.write_into(&mut Vec::new()).is_err());
}

#[test]
fn dir_entries() {
    let file = DirEntryItem {
        location: Key::new(257, item::INODE_ITEM, 0),
        transid: 7,
        file_type: FileType::RegFile.raw(),
        name: b"small.txt",
        data: &[],
    };
    let xattr = DirEntryItem {
        location: Key::MIN,
        transid: 7,
        file_type: FileType::Xattr.raw(),
        name: b"user.test",
        data: b"xattr-value",
    };
    assert_eq!(xattr.to_bytes().unwrap().len(), 50, "digest 4.4");
    // Two entries in one body, as a hash collision list.
    let mut body = file.to_bytes().unwrap();
    xattr.write_into(&mut body).unwrap();
    let parsed: Vec<_> = DirEntryIter::new(&body).map(|e| e.unwrap()).collect();
    assert_eq!(parsed, vec![file, xattr]);
}

#[test]
fn root_item_and_refs() {
    let r = RootItem {
        inode: InodeItem {
            generation: 1,
            size: 3,
            nlink: 1,
            nbytes: 16384,
            mode: 0o040755,
            flags: INODE_FLAG_ROOT_ITEM_INIT,
            ..Default::default()
        },
        generation: 7,
        root_dirid: 256,
        bytenr: 30703616,
        bytes_used: 16384,
        last_snapshot: 7,
        flags: ROOT_SUBVOL_RDONLY,
        refs: 1,
        drop_progress: Key::new(1, 2, 3),
        drop_level: 1,
        level: 2,
        generation_v2: 7,
        uuid: [1; 16],
        parent_uuid: [2; 16],
        received_uuid: [3; 16],
        ctransid: 7,
        otransid: 6,
        stransid: 5,
        rtransid: 4,
        ctime: ts(10, 1),
        otime: ts(11, 2),
        stime: ts(12, 3),
        rtime: ts(13, 4),
    };
    let b = r.to_bytes();
    assert_eq!(b.len(), 439);
    assert_eq!(RootItem::parse(&b).unwrap(), r);
    let rr = RootRef {
        dirid: 256,
        sequence: 7,
        name: b"sub1".to_vec(),
    };
    let b = rr.to_bytes().unwrap();
    assert_eq!(b.len(), 22, "digest 4.9");
    assert_eq!(RootRef::parse(&b).unwrap(), rr);
}

#[test]
fn extent_items() {
    let skinny = ExtentItem {
        refs: 1,
        generation: 6,
        flags: EXTENT_FLAG_TREE_BLOCK,
        tree_block_info: None,
        inline_refs: vec![InlineRef::TreeBlock { root: 3 }],
    };
    let b = skinny.to_bytes();
    assert_eq!(b.len(), 33, "digest 4.10: skinny tree block, one ref");
    assert_eq!(ExtentItem::parse(&b, true).unwrap(), skinny);

    let fat = ExtentItem {
        tree_block_info: Some((Key::new(256, item::INODE_ITEM, 0), 0)),
        ..skinny.clone()
    };
    assert_eq!(ExtentItem::parse(&fat.to_bytes(), false).unwrap(), fat);

    // Digest 4.10: the shared data extent lists root 257 before root 5.
    let mut data = ExtentItem {
        refs: 3,
        generation: 7,
        flags: EXTENT_FLAG_DATA,
        tree_block_info: None,
        inline_refs: vec![
            InlineRef::SharedData {
                parent: 4096,
                count: 1,
            },
            InlineRef::Data {
                root: 5,
                objectid: 258,
                offset: 0,
                count: 1,
            },
            InlineRef::Data {
                root: 257,
                objectid: 258,
                offset: 0,
                count: 1,
            },
        ],
    };
    data.sort_inline_refs();
    assert!(matches!(
        data.inline_refs[0],
        InlineRef::Data { root: 257, .. }
    ));
    assert!(matches!(data.inline_refs[2], InlineRef::SharedData { .. }));
    let b = data.to_bytes();
    assert_eq!(b.len(), data.encoded_len());
    assert_eq!(b.len(), 24 + 29 + 29 + 13);
    assert_eq!(ExtentItem::parse(&b, false).unwrap(), data);
    let refs: u64 = data.inline_refs.iter().map(InlineRef::count).sum();
    assert_eq!(refs, data.refs);
}

#[test]
fn file_extents() {
    let inline = FileExtent {
        generation: 7,
        ram_bytes: 19,
        compression: Compression::None,
        body: FileExtentBody::Inline {
            data: b"hello btrfs inline\n",
        },
    };
    let b = inline.to_bytes();
    assert_eq!(b.len(), 40, "digest 4.6");
    assert_eq!(FileExtent::parse(&b).unwrap(), inline);
    let reg = FileExtent {
        generation: 7,
        ram_bytes: 1 << 20,
        compression: Compression::Zstd,
        body: FileExtentBody::Extent {
            prealloc: true,
            disk_bytenr: 13631488,
            disk_num_bytes: 1 << 20,
            offset: 4096,
            num_bytes: 8192,
        },
    };
    let b = reg.to_bytes();
    assert_eq!(b.len(), FILE_EXTENT_REG_SIZE);
    assert_eq!(FileExtent::parse(&b).unwrap(), reg);
}

fn sample_chunk(stripes: usize) -> ChunkItem {
    ChunkItem {
        length: 8 << 20,
        owner: 2,
        stripe_len: 65536,
        chunk_type: block_group::SYSTEM | block_group::DUP,
        io_align: 65536,
        io_width: 65536,
        sector_size: 4096,
        num_stripes: stripes as u16,
        sub_stripes: 1,
        stripes: (0..stripes)
            .map(|i| Stripe {
                devid: 1,
                offset: (21 + 8 * i as u64) << 20,
                dev_uuid: [9; 16],
            })
            .collect(),
    }
}

#[test]
fn volume_items() {
    let c = sample_chunk(2);
    let b = c.to_bytes().unwrap();
    assert_eq!(b.len(), 112);
    assert_eq!(ChunkItem::parse(&b).unwrap(), c);

    let d = DevItem {
        devid: 1,
        total_bytes: 1 << 28,
        bytes_used: 92274688,
        io_align: 4096,
        io_width: 4096,
        sector_size: 4096,
        dev_type: 0,
        generation: 0,
        start_offset: 0,
        dev_group: 0,
        seek_speed: 0,
        bandwidth: 0,
        uuid: [4; 16],
        fsid: [5; 16],
    };
    let b = d.to_bytes();
    assert_eq!(b.len(), DevItem::SIZE);
    assert_eq!(DevItem::parse(&b).unwrap(), d);

    let de = DevExtent {
        chunk_tree: 3,
        chunk_objectid: 256,
        chunk_offset: 22020096,
        length: 8 << 20,
        chunk_tree_uuid: [6; 16],
    };
    assert_eq!(DevExtent::parse(&de.to_bytes()).unwrap(), de);
    let bg = BlockGroupItem {
        used: 16384,
        chunk_objectid: 256,
        flags: block_group::METADATA | block_group::DUP,
    };
    assert_eq!(BlockGroupItem::parse(&bg.to_bytes()).unwrap(), bg);
    let fsi = FreeSpaceInfo {
        extent_count: 3,
        flags: FREE_SPACE_USING_BITMAPS,
    };
    assert_eq!(FreeSpaceInfo::parse(&fsi.to_bytes()).unwrap(), fsi);
}

#[test]
fn uuid_items() {
    // Digest 4.13.
    let uuid = [
        0x73, 0x95, 0x01, 0x1a, 0x84, 0x0c, 0x43, 0x2e, 0xa9, 0xfb, 0x26, 0x06, 0xa5, 0xee, 0xdf,
        0x83,
    ];
    let key = uuid_key(&uuid, item::UUID_KEY_SUBVOL);
    assert_eq!(key.objectid, 0x2e430c841a019573);
    assert_eq!(key.offset, 0x83dfeea50626fba9);
    let it = UuidItem {
        subvol_ids: vec![5, 256],
    };
    assert_eq!(UuidItem::parse(&it.to_bytes()).unwrap(), it);
    assert!(UuidItem::parse(&[0; 5]).is_err());
}

fn sample_superblock(csum: CsumType) -> Superblock {
    let dev_item = DevItem {
        devid: 1,
        total_bytes: 1 << 28,
        bytes_used: 1 << 26,
        io_align: 4096,
        io_width: 4096,
        sector_size: 4096,
        uuid: [4; 16],
        fsid: [5; 16],
        ..Default::default()
    };
    let sys = Superblock::encode_sys_chunks(&[(22020096, sample_chunk(2))]).unwrap();
    Superblock {
        csum: [0; 32],
        fsid: [5; 16],
        bytenr: 65536,
        flags: 1,
        magic: MAGIC,
        generation: 6,
        root: 30588928,
        chunk_root: 22036480,
        log_root: 0,
        total_bytes: 1 << 28,
        bytes_used: 147456,
        root_dir_objectid: 6,
        num_devices: 1,
        sectorsize: 4096,
        nodesize: 16384,
        leafsize: 16384,
        stripesize: 4096,
        sys_chunk_array_size: sys.len() as u32,
        chunk_root_generation: 6,
        compat_flags: 0,
        compat_ro_flags: 3,
        incompat_flags: 0x341,
        csum_type_raw: csum.raw(),
        root_level: 0,
        chunk_root_level: 0,
        log_root_level: 0,
        dev_item,
        label: b"a label".to_vec(),
        cache_generation: 0,
        uuid_tree_generation: 6,
        metadata_uuid: [0; 16],
        sys_chunk_array: sys,
        backup_roots: vec![
            BackupRoot {
                tree_root: 30588928,
                tree_root_gen: 6,
                chunk_root: 22036480,
                chunk_root_gen: 6,
                extent_root: 1,
                extent_root_gen: 2,
                fs_root: 3,
                fs_root_gen: 4,
                dev_root: 5,
                dev_root_gen: 6,
                csum_root: 7,
                csum_root_gen: 8,
                total_bytes: 9,
                bytes_used: 10,
                num_devices: 1,
                tree_root_level: 1,
                chunk_root_level: 2,
                extent_root_level: 3,
                fs_root_level: 4,
                dev_root_level: 5,
                csum_root_level: 6,
            },
            BackupRoot::default(),
            BackupRoot::default(),
            BackupRoot::default(),
        ],
    }
}

#[test]
fn superblock_round_trip_every_csum() {
    for csum in [
        CsumType::Crc32c,
        CsumType::Xxhash64,
        CsumType::Sha256,
        CsumType::Blake2b,
    ] {
        let sb = sample_superblock(csum);
        let b = sb.to_bytes().unwrap();
        assert_eq!(b.len(), 4096);
        assert_eq!(sb.sys_chunk_array.len(), 129, "digest 1.6: one DUP chunk");
        let p = Superblock::parse(&b).unwrap();
        assert_eq!(p.to_bytes().unwrap(), b, "re-serializing is stable");
        assert_eq!(p.csum_type(), csum);
        assert_eq!(p.label, sb.label);
        assert_eq!(p.dev_item, sb.dev_item);
        assert_eq!(p.backup_roots, sb.backup_roots);
        assert_eq!(p.sys_chunks().unwrap(), vec![(22020096, sample_chunk(2))]);
        assert_eq!(p.generation, sb.generation);
        assert_eq!(p.incompat_flags, 0x341);
    }
    let mut bad = sample_superblock(CsumType::Crc32c);
    bad.label = vec![b'x'; 256];
    assert!(bad.to_bytes().is_err());
}

#[test]
fn a_bad_superblock_field_is_named_and_mended_from_the_backup_roots() {
    let mut good = sample_superblock(CsumType::Crc32c);
    good.backup_roots[0].tree_root_level = good.root_level;
    let mut sb = good.clone();
    sb.generation = 0;
    let b = sb.to_bytes().unwrap();
    let e = Superblock::parse(&b).unwrap_err().to_string();
    assert!(e.contains("field generation is 0"), "{e}");
    let mut p = Superblock::parse_unchecked(&b).unwrap();
    assert_eq!(p.problems(), ["field generation is 0"]);
    let mended = p.mend_from_backups().unwrap();
    assert_eq!(p.generation, 6);
    assert!(mended[0].starts_with("generation 6 (was 0)"), "{mended:?}");
    assert!(p.problems().is_empty());

    // num_devices and the root from the slot of the superblock's generation.
    let mut q = good.clone();
    (q.num_devices, q.root) = (0, 0);
    assert_eq!(q.problems().len(), 2, "{:?}", q.problems());
    q.mend_from_backups().unwrap();
    assert_eq!((q.num_devices, q.root), (1, good.root));

    // No slot vouches for a generation: nothing is guessed.
    let mut r = good;
    r.generation = 0;
    r.backup_roots[0].tree_root += 4096;
    let left = r.mend_from_backups().unwrap_err();
    assert_eq!(left, ["field generation is 0"]);
}

fn ctx(nodesize: u32) -> FsContext {
    FsContext {
        nodesize,
        sectorsize: 4096,
        csum_type: CsumType::Crc32c,
        metadata_fsid: [5; 16],
        super_generation: 1,
    }
}

fn header(bytenr: u64, owner: u64) -> Header {
    Header {
        csum: [0; 32],
        fsid: [5; 16],
        bytenr,
        flags: Header::new_block_flags(),
        chunk_tree_uuid: [6; 16],
        generation: 1,
        owner,
        nritems: 0,
        level: 0,
    }
}

#[test]
fn leaf_matches_real_layout() {
    let mut leaf = LeafBuilder::new(16384).unwrap();
    assert_eq!(leaf.free_space(), 16283);
    let inode = InodeItem {
        generation: 1,
        transid: 1,
        ..sample_inode()
    };
    leaf.push(Key::new(256, item::INODE_ITEM, 0), &inode.to_bytes())
        .unwrap();
    let dotdot = InodeRef::to_bytes_all(&[InodeRef {
        index: 0,
        name: b"..".to_vec(),
    }])
    .unwrap();
    leaf.push(Key::new(256, item::INODE_REF, 256), &dotdot)
        .unwrap();
    // Out of order and duplicate keys are refused.
    assert!(leaf.push(Key::new(256, item::INODE_REF, 256), &[]).is_err());
    assert!(leaf.push(Key::new(1, 1, 0), &[]).is_err());
    let entry = DirEntryItem {
        location: Key::new(257, item::INODE_ITEM, 0),
        transid: 1,
        file_type: FileType::RegFile.raw(),
        name: b"f",
        data: &[],
    };
    leaf.push(
        Key::new(256, item::DIR_ITEM, name_hash(b"f")),
        &entry.to_bytes().unwrap(),
    )
    .unwrap();
    // Zero-size bodies are legal.
    leaf.push(Key::new(objectid::ORPHAN, item::ORPHAN_ITEM, 300), &[])
        .unwrap();
    let block = leaf.finish(&header(30425088, 5), CsumType::Crc32c).unwrap();
    check_tree_block(
        &block,
        &ctx(16384),
        &Expect {
            bytenr: 30425088,
            level: Some(0),
            generation: Some(1),
            first_key: Some(Key::new(256, item::INODE_ITEM, 0)),
        },
    )
    .unwrap();
    let tb = TreeBlock::new(&block).unwrap();
    assert_eq!(tb.nritems(), 4);
    // Digest 2.3: the inode item in slot 0 sits at itemoff 16123.
    assert_eq!(tb.item(0).unwrap().offset, 16123);
    assert_eq!(tb.item(1).unwrap().offset, 16111);
    assert_eq!(tb.item(3).unwrap().size, 0);
    assert_eq!(tb.item(3).unwrap().offset, tb.item(2).unwrap().offset);
    assert_eq!(InodeItem::parse(tb.item_data(0).unwrap()).unwrap(), inode);
    let h = tb.header().unwrap();
    assert_eq!(h.flags, 0x0100_0000_0000_0001, "digest 2.1");
    assert_eq!((h.owner, h.generation, h.nritems), (5, 1, 4));
}

#[test]
fn empty_leaf_and_full_leaf() {
    let empty = LeafBuilder::new(4096).unwrap();
    let block = empty.finish(&header(4096, 7), CsumType::Sha256).unwrap();
    let c = FsContext {
        csum_type: CsumType::Sha256,
        ..ctx(4096)
    };
    check_tree_block(
        &block,
        &c,
        &Expect {
            bytenr: 4096,
            ..Default::default()
        },
    )
    .unwrap();

    let mut leaf = LeafBuilder::new(4096).unwrap();
    let max = leaf_data_size(4096) - 25;
    assert!(!leaf.fits(max + 1));
    leaf.push(Key::new(1, 1, 0), &vec![0; max]).unwrap();
    assert_eq!(leaf.free_space(), 0);
    assert!(leaf.push(Key::new(2, 1, 0), &[]).is_err());
}

#[test]
fn node_builder() {
    let mut node = NodeBuilder::new(4096).unwrap();
    for i in 0..max_node_ptrs(4096) as u64 {
        node.push(KeyPtr {
            key: Key::new(i + 1, 1, 0),
            blockptr: (i + 10) * 4096,
            generation: 1,
        })
        .unwrap();
    }
    assert!(node.is_full());
    assert!(node
        .push(KeyPtr {
            key: Key::new(u64::MAX, 1, 0),
            blockptr: 4096,
            generation: 1
        })
        .is_err());
    let block = node
        .finish(&header(8192, 1), 1, CsumType::Xxhash64)
        .unwrap();
    let c = FsContext {
        csum_type: CsumType::Xxhash64,
        ..ctx(4096)
    };
    check_tree_block(
        &block,
        &c,
        &Expect {
            bytenr: 8192,
            level: Some(1),
            ..Default::default()
        },
    )
    .unwrap();
    let tb = TreeBlock::new(&block).unwrap();
    assert_eq!(tb.key_ptr(3).unwrap().blockptr, 13 * 4096);
    assert!(NodeBuilder::new(4096)
        .unwrap()
        .finish(&header(8192, 1), 1, CsumType::Crc32c)
        .is_err());
}

proptest! {
    /// Any run of items that fits packs into a leaf the checker accepts and reads back.
    #[test]
    fn leaves_round_trip(sizes in proptest::collection::vec(0usize..600, 0..40)) {
        let mut leaf = LeafBuilder::new(16384).unwrap();
        let mut pushed = Vec::new();
        for (i, n) in sizes.iter().enumerate() {
            if !leaf.fits(*n) {
                break;
            }
            let key = Key::new(1000 + i as u64, item::TEMPORARY_ITEM, 0);
            let body = vec![i as u8; *n];
            leaf.push(key, &body).unwrap();
            pushed.push((key, body));
        }
        let block = leaf.finish(&header(65536, 1), CsumType::Crc32c).unwrap();
        check_tree_block(&block, &ctx(16384), &Expect { bytenr: 65536, ..Default::default() }).unwrap();
        let tb = TreeBlock::new(&block).unwrap();
        prop_assert_eq!(tb.nritems(), pushed.len());
        for (slot, (key, body)) in pushed.iter().enumerate() {
            prop_assert_eq!(tb.item_key(slot).unwrap(), *key);
            prop_assert_eq!(tb.item_data(slot).unwrap(), &body[..]);
        }
    }
}
