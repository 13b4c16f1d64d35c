//! `LeafMut` / `NodeMut` against a `BTreeMap` model: after every operation the block holds
//! exactly the model and, once finalized, passes the tree checker.

use super::*;
use crate::key::item;
use crate::tree_block::{Header, TreeBlock};
use crate::validate::{check_tree_block, Expect, FsContext};
use proptest::prelude::*;
use std::collections::BTreeMap;

const FSID: [u8; 16] = [7; 16];
const BYTENR: u64 = 1 << 20;
const GEN: u64 = 5;

fn ctx(nodesize: u32) -> FsContext {
    FsContext {
        nodesize,
        sectorsize: 4096,
        csum_type: CsumType::Crc32c,
        metadata_fsid: FSID,
        super_generation: GEN,
    }
}

fn fresh(nodesize: u32, level: u8) -> Vec<u8> {
    let mut block = vec![0xAAu8; nodesize as usize];
    let header = Header {
        csum: [0; 32],
        fsid: FSID,
        bytenr: BYTENR,
        flags: Header::new_block_flags(),
        chunk_tree_uuid: [9; 16],
        generation: GEN,
        owner: 256,
        nritems: 0,
        level,
    };
    init_block(&mut block, &header).unwrap();
    block
}

/// A key type the checker has no per-item rules for, so any body is fine.
fn key(n: u32) -> Key {
    Key::new(u64::from(n), item::TEMPORARY_ITEM, u64::from(n) * 3)
}

type Model = BTreeMap<Key, Vec<u8>>;

fn assert_leaf_is(block: &mut [u8], model: &Model) {
    let nodesize = block.len() as u32;
    {
        let leaf = LeafMut::new(block).unwrap();
        assert_eq!(leaf.nritems(), model.len());
        for (slot, (k, body)) in model.iter().enumerate() {
            assert_eq!(leaf.key(slot).unwrap(), *k);
            assert_eq!(leaf.item_body(slot).unwrap(), &body[..]);
        }
        let used: usize = model.values().map(|b| ITEM_SIZE + b.len()).sum();
        assert_eq!(leaf.used(), used);
        assert_eq!(leaf.free_space(), leaf.data_size() - used);
    }
    let mut copy = block.to_vec();
    LeafMut::new(&mut copy)
        .unwrap()
        .finalize(CsumType::Crc32c)
        .unwrap();
    let expect = Expect {
        bytenr: BYTENR,
        level: Some(0),
        generation: Some(GEN),
        first_key: model.keys().next().copied(),
    };
    check_tree_block(&copy, &ctx(nodesize), &expect).unwrap();
}

fn body(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| seed.wrapping_add(i as u8)).collect()
}

#[derive(Clone, Debug)]
enum LeafOp {
    Insert { k: u16, len: u16 },
    Batch { k: u16, count: u8, len: u8 },
    Remove { idx: u16, count: u8 },
    Resize { idx: u16, len: u16 },
    SetKey { idx: u16, k: u16 },
    Write { idx: u16, seed: u8 },
}

fn leaf_op() -> impl Strategy<Value = LeafOp> {
    prop_oneof![
        4 => (0u16..400, 0u16..600).prop_map(|(k, len)| LeafOp::Insert { k, len }),
        1 => (0u16..400, 1u8..12, 0u8..60).prop_map(|(k, count, len)| LeafOp::Batch { k, count, len }),
        2 => (any::<u16>(), 1u8..4).prop_map(|(idx, count)| LeafOp::Remove { idx, count }),
        2 => (any::<u16>(), 0u16..900).prop_map(|(idx, len)| LeafOp::Resize { idx, len }),
        1 => (any::<u16>(), 0u16..400).prop_map(|(idx, k)| LeafOp::SetKey { idx, k }),
        1 => (any::<u16>(), any::<u8>()).prop_map(|(idx, seed)| LeafOp::Write { idx, seed }),
    ]
}

fn apply_leaf_op(block: &mut [u8], model: &mut Model, op: &LeafOp) {
    let before = block.to_vec();
    let mut leaf = LeafMut::new(block).unwrap();
    let free = leaf.free_space();
    let n = model.len();
    let ok = match op {
        LeafOp::Insert { k, len } => {
            let (k, len) = (key(u32::from(*k)), usize::from(*len));
            let slot = model.range(..k).count();
            let res = leaf
                .insert_item(slot, k, len)
                .map(|b| b.copy_from_slice(&body(len, 3)));
            let valid = !model.contains_key(&k) && ITEM_SIZE + len <= free;
            if valid {
                model.insert(k, body(len, 3));
            }
            assert_eq!(res.is_ok(), valid, "{op:?}");
            valid
        }
        LeafOp::Batch { k, count, len } => {
            let items: Vec<(Key, usize)> = (0..u32::from(*count))
                .map(|i| (key(u32::from(*k) * 16 + i), usize::from(*len)))
                .collect();
            let slot = model.range(..items[0].0).count();
            let need: usize = items.iter().map(|(_, l)| ITEM_SIZE + l).sum();
            // Valid only if no existing key falls inside the batch's key range.
            let clash = model
                .range(items[0].0..=items[items.len() - 1].0)
                .next()
                .is_some();
            let valid = !clash && need <= free;
            let res = leaf.insert_items(slot, &items);
            assert_eq!(res.is_ok(), valid, "{op:?}");
            if valid {
                for (k, l) in items {
                    model.insert(k, vec![0; l]);
                }
            }
            valid
        }
        LeafOp::Remove { idx, count } if n > 0 => {
            let slot = usize::from(*idx) % n;
            let count = usize::from(*count).min(n - slot);
            leaf.remove_items(slot, count).unwrap();
            let keys: Vec<Key> = model.keys().skip(slot).take(count).copied().collect();
            for k in keys {
                model.remove(&k);
            }
            true
        }
        LeafOp::Resize { idx, len } if n > 0 => {
            let slot = usize::from(*idx) % n;
            let len = usize::from(*len);
            let k = *model.keys().nth(slot).unwrap();
            let old = model[&k].len();
            let valid = len <= old || len - old <= free;
            assert_eq!(leaf.resize_item(slot, len).is_ok(), valid, "{op:?}");
            if valid {
                model.get_mut(&k).unwrap().resize(len, 0);
            }
            valid
        }
        LeafOp::SetKey { idx, k } if n > 0 => {
            let slot = usize::from(*idx) % n;
            let new = key(u32::from(*k));
            let old = *model.keys().nth(slot).unwrap();
            let prev_ok = model.range(..old).next_back().is_none_or(|(p, _)| *p < new);
            let next_ok = model.range(old..).nth(1).is_none_or(|(nx, _)| *nx > new);
            let valid = prev_ok && next_ok;
            assert_eq!(leaf.set_key(slot, new).is_ok(), valid, "{op:?}");
            if valid {
                let b = model.remove(&old).unwrap();
                model.insert(new, b);
            }
            valid
        }
        LeafOp::Write { idx, seed } if n > 0 => {
            let slot = usize::from(*idx) % n;
            let k = *model.keys().nth(slot).unwrap();
            let b = leaf.item_body_mut(slot).unwrap();
            let new = body(b.len(), *seed);
            b.copy_from_slice(&new);
            model.insert(k, new);
            true
        }
        _ => true,
    };
    if !ok {
        assert_eq!(block, &before[..], "a failed {op:?} changed the leaf");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn leaf_ops_match_model(nodesize in prop_oneof![Just(4096u32), Just(16384u32)],
                            ops in prop::collection::vec(leaf_op(), 1..160)) {
        let mut block = fresh(nodesize, 0);
        let mut model = Model::new();
        for op in &ops {
            apply_leaf_op(&mut block, &mut model, op);
            assert_leaf_is(&mut block, &model);
        }
    }

    #[test]
    fn leaf_split_and_merge(lens in prop::collection::vec(0usize..300, 0..40),
                            cut in any::<u16>(), keep in any::<u16>()) {
        let nodesize = 16384;
        let mut left = fresh(nodesize, 0);
        let mut model = Model::new();
        for (i, len) in lens.iter().enumerate() {
            let k = key(i as u32 * 2);
            let b = body(*len, i as u8);
            let mut leaf = LeafMut::new(&mut left).unwrap();
            let slot = leaf.nritems();
            leaf.insert_item(slot, k, *len).unwrap().copy_from_slice(&b);
            model.insert(k, b);
        }
        let n = model.len();
        let cut = usize::from(cut) % (n + 1);
        let mut right = fresh(nodesize, 0);
        {
            let mut l = LeafMut::new(&mut left).unwrap();
            let mut r = LeafMut::new(&mut right).unwrap();
            l.move_tail_to(cut, &mut r).unwrap();
        }
        let lm: Model = model.iter().take(cut).map(|(k, v)| (*k, v.clone())).collect();
        let rm: Model = model.iter().skip(cut).map(|(k, v)| (*k, v.clone())).collect();
        assert_leaf_is(&mut left, &lm);
        assert_leaf_is(&mut right, &rm);
        // Push part of the right leaf back, then merge the rest.
        let back = usize::from(keep) % (rm.len() + 1);
        {
            let mut l = LeafMut::new(&mut left).unwrap();
            let mut r = LeafMut::new(&mut right).unwrap();
            r.move_head_to(back, &mut l).unwrap();
        }
        let lm: Model = model.iter().take(cut + back).map(|(k, v)| (*k, v.clone())).collect();
        let rm: Model = model.iter().skip(cut + back).map(|(k, v)| (*k, v.clone())).collect();
        assert_leaf_is(&mut left, &lm);
        assert_leaf_is(&mut right, &rm);
        // And a partial push to the right.
        let give = usize::from(keep) % (lm.len() + 1);
        let from = lm.len() - give;
        {
            let mut l = LeafMut::new(&mut left).unwrap();
            let mut r = LeafMut::new(&mut right).unwrap();
            l.move_tail_to(from, &mut r).unwrap();
        }
        let lm: Model = model.iter().take(from).map(|(k, v)| (*k, v.clone())).collect();
        let rm: Model = model.iter().skip(from).map(|(k, v)| (*k, v.clone())).collect();
        assert_leaf_is(&mut left, &lm);
        assert_leaf_is(&mut right, &rm);
        {
            let mut l = LeafMut::new(&mut left).unwrap();
            let mut r = LeafMut::new(&mut right).unwrap();
            let rn = r.nritems();
            r.move_head_to(rn, &mut l).unwrap();
        }
        assert_leaf_is(&mut left, &model);
        assert_leaf_is(&mut right, &Model::new());
    }

    #[test]
    fn damaged_leaf_never_panics(lens in prop::collection::vec(0usize..200, 1..20),
                                 damage in prop::collection::vec((101usize..700, any::<u8>()), 1..6),
                                 slot in 0usize..25, len in 0usize..5000) {
        let mut block = fresh(4096, 0);
        for (i, l) in lens.iter().enumerate() {
            let mut leaf = LeafMut::new(&mut block).unwrap();
            let s = leaf.nritems();
            let _ = leaf.insert_item(s, key(i as u32), *l);
        }
        for (off, byte) in damage {
            block[off] = byte;
        }
        block[96] ^= (slot as u8) & 1;
        if let Ok(mut leaf) = LeafMut::new(&mut block) {
            let _ = leaf.insert_item(slot, key(1000), len);
            let _ = leaf.resize_item(slot, len);
            let _ = leaf.remove_items(slot, 2);
            let _ = leaf.set_key(slot, key(3));
            let _ = leaf.item_body_mut(slot).map(|b| b.fill(1));
            let mut other = fresh(4096, 0);
            let mut r = LeafMut::new(&mut other).unwrap();
            let _ = leaf.move_tail_to(slot, &mut r);
            let _ = r.move_head_to(1, &mut leaf);
        }
    }
}

type NodeModel = BTreeMap<Key, (u64, u64)>;

fn assert_node_is(block: &mut [u8], model: &NodeModel) {
    let node = NodeMut::new(block).unwrap();
    assert_eq!(node.nritems(), model.len());
    for (slot, (k, (ptr, gen))) in model.iter().enumerate() {
        let p = node.key_ptr(slot).unwrap();
        assert_eq!((p.key, p.blockptr, p.generation), (*k, *ptr, *gen));
    }
    if model.is_empty() {
        return;
    }
    let mut copy = block.to_vec();
    NodeMut::new(&mut copy)
        .unwrap()
        .finalize(CsumType::Crc32c)
        .unwrap();
    let expect = Expect {
        bytenr: BYTENR,
        level: Some(1),
        generation: Some(GEN),
        first_key: model.keys().next().copied(),
    };
    check_tree_block(&copy, &ctx(block.len() as u32), &expect).unwrap();
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn node_ops_match_model(ops in prop::collection::vec((0u8..4, 0u16..300, any::<u16>()), 1..300)) {
        let mut block = fresh(4096, 1);
        let mut model = NodeModel::new();
        for (op, k, x) in ops {
            let n = model.len();
            let mut node = NodeMut::new(&mut block).unwrap();
            let max = node.max_ptrs();
            match op {
                0 | 1 => {
                    let k = key(u32::from(k));
                    let slot = model.range(..k).count();
                    let ptr = (u64::from(x) + 1) * 4096;
                    let valid = !model.contains_key(&k) && n < max;
                    assert_eq!(node.insert_ptr(slot, k, ptr, GEN - 1).is_ok(), valid);
                    if valid {
                        model.insert(k, (ptr, GEN - 1));
                    }
                }
                2 if n > 0 => {
                    let slot = usize::from(x) % n;
                    node.remove_ptr(slot).unwrap();
                    let k = *model.keys().nth(slot).unwrap();
                    model.remove(&k);
                }
                3 if n > 0 => {
                    let slot = usize::from(x) % n;
                    let k = *model.keys().nth(slot).unwrap();
                    node.set_ptr(slot, 8192, GEN).unwrap();
                    model.insert(k, (8192, GEN));
                    let new = key(u32::from(k.objectid as u16 ^ 1));
                    let prev_ok = model.range(..k).next_back().is_none_or(|(p, _)| *p < new);
                    let next_ok = model.range(k..).nth(1).is_none_or(|(nx, _)| *nx > new);
                    assert_eq!(node.set_key(slot, new).is_ok(), prev_ok && next_ok);
                    if prev_ok && next_ok {
                        let v = model.remove(&k).unwrap();
                        model.insert(new, v);
                    }
                }
                _ => {}
            }
            assert_node_is(&mut block, &model);
        }
        // Split at the middle and merge back.
        let n = model.len();
        let mut right = fresh(4096, 1);
        {
            let mut l = NodeMut::new(&mut block).unwrap();
            let mut r = NodeMut::new(&mut right).unwrap();
            l.move_tail_to(n / 2, &mut r).unwrap();
        }
        let lm: NodeModel = model.iter().take(n / 2).map(|(k, v)| (*k, *v)).collect();
        let rm: NodeModel = model.iter().skip(n / 2).map(|(k, v)| (*k, *v)).collect();
        assert_node_is(&mut block, &lm);
        assert_node_is(&mut right, &rm);
        {
            let mut l = NodeMut::new(&mut block).unwrap();
            let mut r = NodeMut::new(&mut right).unwrap();
            let rn = r.nritems();
            r.move_head_to(rn, &mut l).unwrap();
        }
        assert_node_is(&mut block, &model);
    }
}

#[test]
fn header_setters_and_views() {
    let mut block = fresh(4096, 0);
    {
        let mut leaf = LeafMut::new(&mut block).unwrap();
        let mut h = leaf.header_mut();
        h.set_bytenr(8192).unwrap();
        h.set_generation(4).unwrap();
        h.set_owner(7).unwrap();
        h.set_flags(3).unwrap();
        h.set_fsid(&[1; 16]).unwrap();
        h.set_chunk_tree_uuid(&[2; 16]).unwrap();
        assert!(
            h.set_nritems(5).is_err(),
            "a view's item count is not settable"
        );
        assert!(h.set_level(1).is_err());
    }
    let tb = TreeBlock::new(&block).unwrap();
    let h = tb.header().unwrap();
    assert_eq!((h.bytenr, h.generation, h.owner, h.flags), (8192, 4, 7, 3));
    assert_eq!((h.fsid, h.chunk_tree_uuid), ([1; 16], [2; 16]));
    let mut raw = HeaderMut::new(&mut block).unwrap();
    raw.set_level(2).unwrap();
    raw.set_nritems(0).unwrap();
    assert!(LeafMut::new(&mut block).is_err(), "level 2 is not a leaf");
    assert!(NodeMut::new(&mut block).is_ok());
}

#[test]
fn largest_item_fills_an_empty_leaf() {
    for nodesize in [4096u32, 16384, 65536] {
        let mut block = fresh(nodesize, 0);
        let max = nodesize as usize - HEADER_SIZE - ITEM_SIZE;
        let mut leaf = LeafMut::new(&mut block).unwrap();
        assert!(leaf.insert_item(0, key(1), max + 1).is_err());
        leaf.insert_item(0, key(1), max).unwrap();
        assert_eq!(leaf.free_space(), 0);
        assert!(leaf.insert_item(1, key(2), 0).is_err());
        let mut model = Model::new();
        model.insert(key(1), vec![0; max]);
        assert_leaf_is(&mut block, &model);
    }
}
