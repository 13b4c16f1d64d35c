//! The write side against a `BTreeMap` model, over the in-memory store. After every step:
//! the read-side `Cursor` sees exactly the model, every reachable block passes the tree
//! checker with the generation, level and first key its parent promises, and the reachable
//! blocks are exactly those allocated and not freed. `OLEO_TEST_SEED=N` replays a run.

use super::mem_store::MemStore;
use super::*;
use crate::error::Error;
use oleo_format::key::Key;
use oleo_format::leaf_builder::max_item_size;
use std::collections::{BTreeMap, HashMap, HashSet};

const TREE: u64 = 256;
/// An item type the tree checker has no per-item rules for, so any body is fine.
const ITEM_TYPE: u8 = oleo_format::key::item::TEMPORARY_ITEM;

type Model = BTreeMap<Key, Vec<u8>>;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn percent(&mut self) -> u64 {
        self.below(100)
    }

    fn bytes(&mut self, len: usize) -> Vec<u8> {
        let seed = self.next();
        (0..len)
            .map(|i| (seed.rotate_left(i as u32 % 64) as u8) ^ (i as u8))
            .collect()
    }
}

fn test_seed(name: &str) -> u64 {
    let seed = std::env::var("OLEO_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
        });
    eprintln!("{name}: OLEO_TEST_SEED={seed}");
    seed
}

fn key(objectid: u64, offset: u64) -> Key {
    Key::new(objectid, ITEM_TYPE, offset)
}

/// Everything the write side promises, checked at once.
fn check_all(store: &MemStore, root: &TreeRoot, model: &Model) -> TreeCheck {
    assert!(store.violations.is_empty(), "{:?}", store.violations);
    let report = check_tree(store, root, &store.ctx()).unwrap_or_else(|e| panic!("{e}"));
    let reachable: HashSet<u64> = report.blocks.iter().map(|b| b.0).collect();
    assert_eq!(
        reachable.len(),
        report.blocks.len(),
        "a block reached twice"
    );
    assert_eq!(
        reachable, store.live,
        "reachable blocks differ from allocated - freed"
    );
    for (bytenr, _, generation, owner) in &report.blocks {
        if *generation == store.transid {
            assert!(
                store.dirty.contains_key(bytenr),
                "{bytenr} of this transaction not dirty"
            );
            assert_eq!(*owner, root.id);
        }
    }
    assert_eq!(root.generation, store.transid, "the root was not copied");
    let mut cur = Cursor::search(store, root, &Key::MIN).unwrap();
    let mut expected = model.iter();
    while let Some((k, data)) = cur.item().unwrap() {
        let (mk, md) = expected
            .next()
            .unwrap_or_else(|| panic!("extra item {k:?}"));
        assert_eq!((k, data), (*mk, &md[..]), "tree and model differ");
        cur.next().unwrap();
    }
    assert!(expected.next().is_none(), "items missing from the tree");
    assert_eq!(report.items, model.len());
    report
}

/// Item sizes that force splits: mostly small, some medium, a few near the maximum.
fn item_len(rng: &mut Rng, nodesize: u32) -> usize {
    let max = max_item_size(nodesize) as u64;
    (match rng.percent() {
        0..=59 => rng.below(33),
        60..=89 => rng.below(max / 8 + 1),
        _ => max / 3 + rng.below(max - max / 3 + 1),
    }) as usize
}

/// An existing key near a random one, if the tree holds any.
fn pick_existing(rng: &mut Rng, model: &Model, keyspace: u64) -> Option<Key> {
    let probe = key(rng.below(keyspace), 0);
    model
        .range(probe..)
        .next()
        .or_else(|| model.iter().next())
        .map(|(k, _)| *k)
}

struct Config {
    nodesize: u32,
    steps: usize,
    keyspace: u64,
    /// Steps per phase; phases alternate between growing and shrinking the tree.
    phase: usize,
    /// The tree must reach this level at least once.
    min_level: u8,
}

struct Stats {
    max_level: u8,
    /// Times the tree lost a level (a root collapsed).
    level_drops: usize,
    max_blocks: usize,
    commits: usize,
}

fn random_ops(cfg: &Config, seed: u64) -> Stats {
    let mut rng = Rng(seed);
    let mut store = MemStore::new(cfg.nodesize, 10);
    let mut root = new_tree(&mut store, TREE).unwrap();
    let mut model = Model::new();
    let mut stats = Stats {
        max_level: 0,
        level_drops: 0,
        max_blocks: 0,
        commits: 0,
    };
    for step in 0..cfg.steps {
        let growing = (step / cfg.phase).is_multiple_of(2);
        let roll = rng.percent();
        let what = if growing {
            match roll {
                0..=49 => 0,
                50..=59 => 1,
                60..=67 => 2,
                68..=72 => 3,
                73..=82 => 4,
                83..=89 => 5,
                90..=93 => 6,
                94..=96 => 7,
                _ => 8,
            }
        } else {
            match roll {
                0..=9 => 0,
                10..=12 => 1,
                13..=52 => 2,
                53..=62 => 3,
                63..=72 => 4,
                73..=82 => 5,
                83..=87 => 6,
                88..=94 => 7,
                _ => 8,
            }
        };
        let ctx = format!("seed {seed} step {step} op {what}");
        let level_before = root.level;
        match what {
            // Insert one item (sometimes an existing key).
            0 => {
                let k = key(rng.below(cfg.keyspace), rng.below(3));
                let len = item_len(&mut rng, cfg.nodesize);
                let data = rng.bytes(len);
                let res = insert_item(&mut store, &mut root, k, &data);
                if let std::collections::btree_map::Entry::Vacant(e) = model.entry(k) {
                    res.unwrap_or_else(|e| panic!("{ctx}: {e}"));
                    e.insert(data);
                } else {
                    assert!(matches!(res, Err(Error::AlreadyExists)), "{ctx}: {res:?}");
                }
            }
            // Insert a run of new keys in one call.
            1 => {
                let start = rng.below(cfg.keyspace);
                let count = 1 + rng.below(40);
                let len = rng.below(48) as usize;
                let items: Vec<(Key, Vec<u8>)> = (0..count)
                    .map(|i| key(start, 10 + i))
                    .filter(|k| !model.contains_key(k))
                    .map(|k| (k, rng.bytes(len)))
                    .collect();
                let refs: Vec<(Key, &[u8])> =
                    items.iter().map(|(k, d)| (*k, d.as_slice())).collect();
                insert_items(&mut store, &mut root, &refs).unwrap_or_else(|e| panic!("{ctx}: {e}"));
                model.extend(items);
            }
            // Delete one item (sometimes a missing one).
            2 => {
                let k = if rng.percent() < 90 {
                    pick_existing(&mut rng, &model, cfg.keyspace)
                } else {
                    Some(key(rng.below(cfg.keyspace), 7))
                };
                if let Some(k) = k {
                    let res = delete_item(&mut store, &mut root, &k);
                    if model.remove(&k).is_some() {
                        res.unwrap_or_else(|e| panic!("{ctx}: {e}"));
                    } else {
                        assert!(matches!(res, Err(Error::NotFound)), "{ctx}: {res:?}");
                    }
                }
            }
            // Delete a key range.
            3 => {
                // Narrow while growing, wide while shrinking (whole subtrees go).
                let width = match (growing, rng.percent()) {
                    (true, _) => cfg.keyspace / 200,
                    (false, 0..=79) => cfg.keyspace / 8,
                    (false, _) => cfg.keyspace / 2,
                };
                let a = rng.below(cfg.keyspace);
                let b = a + rng.below(width + 2);
                let (min, max) = (key(a, rng.below(12)), key(b, rng.below(12)));
                let (min, max) = (min.min(max), min.max(max));
                let n = delete_range(&mut store, &mut root, min, max)
                    .unwrap_or_else(|e| panic!("{ctx}: {e}"));
                let gone: Vec<Key> = model.range(min..=max).map(|(k, _)| *k).collect();
                assert_eq!(n, gone.len(), "{ctx}");
                for k in gone {
                    model.remove(&k);
                }
            }
            // Resize an item.
            4 => {
                if let Some(k) = pick_existing(&mut rng, &model, cfg.keyspace) {
                    let len = item_len(&mut rng, cfg.nodesize);
                    resize_item(&mut store, &mut root, &k, len)
                        .unwrap_or_else(|e| panic!("{ctx}: {e}"));
                    if let Some(d) = model.get_mut(&k) {
                        d.resize(len, 0);
                    }
                }
            }
            // Rewrite an item's body in place.
            5 => {
                if let Some(k) = pick_existing(&mut rng, &model, cfg.keyspace) {
                    let len = model[&k].len();
                    let data = rng.bytes(len);
                    update_item(&mut store, &mut root, &k, |b| b.copy_from_slice(&data))
                        .unwrap_or_else(|e| panic!("{ctx}: {e}"));
                    model.insert(k, data);
                }
            }
            // Change an item's key to one between its neighbours (or an invalid one).
            6 => {
                if let Some(k) = pick_existing(&mut rng, &model, cfg.keyspace) {
                    let new = key(k.objectid, k.offset ^ (1 + rng.below(4)));
                    let prev_ok = model.range(..k).next_back().is_none_or(|(p, _)| *p < new);
                    let next_ok = model.range(k..).nth(1).is_none_or(|(n, _)| *n > new);
                    let res = set_item_key(&mut store, &mut root, &k, new);
                    if prev_ok && next_ok {
                        res.unwrap_or_else(|e| panic!("{ctx}: {e}"));
                        let data = model.remove(&k).unwrap_or_default();
                        model.insert(new, data);
                    } else {
                        assert!(
                            matches!(res, Err(Error::InvalidArgument(_))),
                            "{ctx}: {res:?}"
                        );
                    }
                }
            }
            // Read through the store with the read side's lookups.
            7 => {
                let k = key(rng.below(cfg.keyspace), rng.below(3));
                let got = lookup(&store, &root, &k).unwrap();
                assert_eq!(got.as_ref(), model.get(&k), "{ctx}");
                let le = lookup_le(&store, &root, &k).unwrap();
                let want = model
                    .range(..=k)
                    .next_back()
                    .filter(|(mk, _)| mk.objectid == k.objectid && mk.item_type == k.item_type)
                    .map(|(mk, d)| (*mk, d.clone()));
                assert_eq!(le, want, "{ctx}");
                continue;
            }
            // End the transaction: from now on every change copies blocks again.
            _ => {
                store.commit();
                stats.commits += 1;
                // The tree is unchanged, but its root must be copied before the next check.
                update_root_only(&mut store, &mut root, &model);
            }
        }
        let report = check_all(&store, &root, &model);
        stats.max_level = stats.max_level.max(root.level);
        if root.level < level_before {
            stats.level_drops += 1;
        }
        stats.max_blocks = stats.max_blocks.max(report.blocks.len());
    }
    // Empty the tree: it ends as a single empty leaf.
    if root.level > 0 {
        stats.level_drops += 1;
    }
    delete_range(&mut store, &mut root, Key::MIN, Key::MAX).unwrap();
    model.clear();
    let report = check_all(&store, &root, &model);
    assert_eq!((root.level, report.blocks.len()), (0, 1));
    stats
}

/// After a commit the root is clean; a no-op write (search for write) copies it.
fn update_root_only(store: &mut MemStore, root: &mut TreeRoot, model: &Model) {
    let k = model.keys().next().copied().unwrap_or(Key::MIN);
    let path = search_for_write(store, root, &k, WriteIntent::Modify).unwrap();
    assert_eq!(path.height(), usize::from(root.level) + 1);
}

fn run_config(cfg: Config, name: &str) {
    let seed = test_seed(name);
    let start = std::time::Instant::now();
    let stats = random_ops(&cfg, seed);
    eprintln!(
        "{name}: nodesize {} steps {} max level {} level drops {} max blocks {} commits {} in {:?}",
        cfg.nodesize,
        cfg.steps,
        stats.max_level,
        stats.level_drops,
        stats.max_blocks,
        stats.commits,
        start.elapsed()
    );
    assert!(
        stats.max_level >= cfg.min_level,
        "seed {seed}: tree too shallow"
    );
    assert!(
        stats.level_drops > 0,
        "seed {seed}: the root never collapsed"
    );
}

#[test]
fn random_ops_tiny_nodes_grow_deep_trees() {
    // Not a real nodesize, but legal for the tree code: deep trees with few items.
    run_config(
        Config {
            nodesize: 512,
            steps: 5000,
            keyspace: 10000,
            phase: 1250,
            min_level: 3,
        },
        "tiny nodes",
    );
}

#[test]
fn random_ops_4k() {
    run_config(
        Config {
            nodesize: 4096,
            steps: 6000,
            keyspace: 20000,
            phase: 1500,
            min_level: 2,
        },
        "4k",
    );
}

#[test]
fn random_ops_16k() {
    run_config(
        Config {
            nodesize: 16384,
            steps: 3000,
            keyspace: 20000,
            phase: 1000,
            min_level: 1,
        },
        "16k",
    );
}

#[test]
fn random_ops_64k() {
    run_config(
        Config {
            nodesize: 65536,
            steps: 1500,
            keyspace: 20000,
            phase: 500,
            min_level: 1,
        },
        "64k",
    );
}

/// Builds a tree of `count` items with `len`-byte bodies in one transaction.
fn build(store: &mut MemStore, count: u64, len: usize) -> (TreeRoot, Model) {
    let mut root = new_tree(store, TREE).unwrap();
    let mut model = Model::new();
    let mut rng = Rng(count);
    for i in 0..count {
        // Interleaved order, so inserts land everywhere, not only at the end.
        let k = key((i * 7919) % count, 0);
        let data = rng.bytes(len);
        insert_item(store, &mut root, k, &data).unwrap();
        model.insert(k, data);
    }
    (root, model)
}

#[test]
fn cow_never_edits_an_older_transaction() {
    let seed = test_seed("cow_never_edits_an_older_transaction");
    let mut rng = Rng(seed);
    let mut store = MemStore::new(4096, 20);
    let (root1, model1) = build(&mut store, 3000, 200);
    check_all(&store, &root1, &model1);
    assert!(
        root1.level >= 2,
        "want a three-level tree, got level {}",
        root1.level
    );
    store.commit();
    let old: HashMap<u64, Vec<u8>> = store
        .committed
        .iter()
        .map(|(b, d)| (*b, d.to_vec()))
        .collect();
    let old_reachable: HashSet<u64> = store.live.clone();

    let mut root = root1;
    let mut model = model1.clone();
    for step in 0..300 {
        let k = key(rng.below(4000), 0);
        match rng.percent() {
            0..=39 => {
                let len = rng.below(300) as usize;
                let data = rng.bytes(len);
                if insert_item(&mut store, &mut root, k, &data).is_ok() {
                    model.insert(k, data);
                }
            }
            40..=79 => {
                if delete_item(&mut store, &mut root, &k).is_ok() {
                    model.remove(&k);
                }
            }
            80..=89 => {
                let data = rng.bytes(8);
                if update_item(&mut store, &mut root, &k, |b| {
                    let n = b.len().min(8);
                    b[..n].copy_from_slice(&data[..n]);
                    n
                })
                .is_ok()
                {
                    if let Some(d) = model.get_mut(&k) {
                        let n = d.len().min(8);
                        d[..n].copy_from_slice(&data[..n]);
                    }
                }
            }
            _ => {
                let max = key(k.objectid + rng.below(200), 0);
                delete_range(&mut store, &mut root, k, max).unwrap();
                let gone: Vec<Key> = model.range(k..=max).map(|(k, _)| *k).collect();
                for g in gone {
                    model.remove(&g);
                }
            }
        }
        let report = check_all(&store, &root, &model);
        for (bytenr, _, generation, _) in &report.blocks {
            if *generation != store.transid {
                assert!(
                    old.contains_key(bytenr),
                    "step {step}: {bytenr} from nowhere"
                );
            }
        }
    }
    assert!(store.cows > 0);
    // Not one byte of the first transaction's blocks changed, and its tree reads as before.
    for (bytenr, bytes) in &old {
        assert!(!store.dirty.contains_key(bytenr));
        assert_eq!(
            &store.committed[bytenr][..],
            &bytes[..],
            "{bytenr} was edited"
        );
    }
    let mut ctx = store.ctx();
    ctx.super_generation = root1.generation;
    let report = check_tree(&store, &root1, &ctx).unwrap();
    assert_eq!(report.items, model1.len());
    let mut cur = Cursor::search(&store, &root1, &Key::MIN).unwrap();
    for (k, d) in &model1 {
        assert_eq!(cur.item().unwrap(), Some((*k, &d[..])));
        cur.next().unwrap();
    }
    assert_eq!(cur.item().unwrap(), None);
    // What the first tree had and the second does not was freed; nothing else old was.
    let now: HashSet<u64> = store.live.clone();
    let freed: HashSet<u64> = store.freed.iter().copied().collect();
    for b in &old_reachable {
        assert_eq!(freed.contains(b), !now.contains(b), "old block {b}");
    }
}

#[test]
fn huge_item_between_big_neighbours_splits_three_ways() {
    let mut store = MemStore::new(4096, 3);
    let mut root = new_tree(&mut store, TREE).unwrap();
    let max = max_item_size(4096);
    let mut model = Model::new();
    for (k, len) in [(key(1, 0), 1800), (key(3, 0), 1800), (key(2, 0), max)] {
        let data = vec![k.objectid as u8; len];
        insert_item(&mut store, &mut root, k, &data).unwrap();
        model.insert(k, data);
    }
    let report = check_all(&store, &root, &model);
    assert_eq!(root.level, 1);
    assert_eq!(report.blocks.len(), 4, "root and three leaves");
    // Growing the middle item of three big ones splits three ways as well.
    delete_item(&mut store, &mut root, &key(2, 0)).unwrap();
    insert_item(&mut store, &mut root, key(2, 0), &[9; 10]).unwrap();
    model.insert(key(2, 0), vec![9; 10]);
    check_all(&store, &root, &model);
    resize_item(&mut store, &mut root, &key(2, 0), max).unwrap();
    if let Some(d) = model.get_mut(&key(2, 0)) {
        d.resize(max, 0);
    }
    let report = check_all(&store, &root, &model);
    assert_eq!(report.blocks.len(), 4);
    assert!(insert_item(&mut store, &mut root, key(4, 0), &vec![0; max + 1]).is_err());
    assert!(resize_item(&mut store, &mut root, &key(4, 0), 10).is_err());
}

#[test]
fn sequential_inserts_fill_leaves() {
    let mut store = MemStore::new(4096, 3);
    let mut root = new_tree(&mut store, TREE).unwrap();
    let mut model = Model::new();
    for i in 0..2000u64 {
        insert_item(&mut store, &mut root, key(i, 0), &[1; 30]).unwrap();
        model.insert(key(i, 0), vec![1; 30]);
    }
    let ascending = check_all(&store, &root, &model);
    let mut store2 = MemStore::new(4096, 3);
    let mut root2 = new_tree(&mut store2, TREE).unwrap();
    for i in (0..2000u64).rev() {
        insert_item(&mut store2, &mut root2, key(i, 0), &[1; 30]).unwrap();
    }
    let descending = check_all(&store2, &root2, &model);
    // 2000 items of 55 bytes fill 27 leaves of 3995 bytes: allow a little slack.
    let leaves = |r: &TreeCheck| r.blocks.iter().filter(|b| b.1 == 0).count();
    assert!(leaves(&ascending) <= 30, "{} leaves", leaves(&ascending));
    assert!(leaves(&descending) <= 30, "{} leaves", leaves(&descending));
}

#[test]
fn errors_for_missing_and_duplicate_keys() {
    let mut store = MemStore::new(4096, 3);
    let (mut root, model) = build(&mut store, 500, 20);
    let missing = key(10_000, 0);
    assert!(matches!(
        delete_item(&mut store, &mut root, &missing),
        Err(Error::NotFound)
    ));
    assert!(matches!(
        update_item(&mut store, &mut root, &missing, |_| ()),
        Err(Error::NotFound)
    ));
    assert!(matches!(
        resize_item(&mut store, &mut root, &missing, 3),
        Err(Error::NotFound)
    ));
    assert!(matches!(
        set_item_key(&mut store, &mut root, &missing, key(10_001, 0)),
        Err(Error::NotFound)
    ));
    assert!(matches!(
        insert_item(&mut store, &mut root, key(5, 0), b"x"),
        Err(Error::AlreadyExists)
    ));
    let unsorted = [(key(900, 0), &b"a"[..]), (key(899, 0), &b"b"[..])];
    assert!(matches!(
        insert_items(&mut store, &mut root, &unsorted),
        Err(Error::InvalidArgument(_))
    ));
    // A batch whose last key clashes: the items before the clash's run may be in.
    let batch = [(key(600, 0), &b"a"[..]), (key(499, 0), &b"b"[..])];
    assert!(insert_items(&mut store, &mut root, &batch).is_err());
    assert_eq!(
        delete_range(&mut store, &mut root, key(20_000, 0), key(30_000, 0)).unwrap(),
        0
    );
    check_all(&store, &root, &model);
}

#[test]
fn set_item_key_at_a_leaf_boundary_fixes_parent_keys() {
    let mut store = MemStore::new(4096, 3);
    let (mut root, mut model) = build(&mut store, 1000, 20);
    // Find a leaf's first key by walking the tree: the second pointer of the root.
    let report = check_all(&store, &root, &model);
    assert!(root.level >= 1);
    let first_of_second_leaf = {
        let mut cur = Cursor::search(&store, &root, &Key::MIN).unwrap();
        let leaf0 = report
            .blocks
            .iter()
            .find(|b| b.1 == 0)
            .map(|b| b.0)
            .unwrap();
        let block = store.dirty[&leaf0].clone();
        let n = oleo_format::TreeBlock::new(&block).unwrap().nritems();
        for _ in 0..n {
            cur.next().unwrap();
        }
        cur.item().unwrap().unwrap().0
    };
    let new = key(first_of_second_leaf.objectid, 1);
    set_item_key(&mut store, &mut root, &first_of_second_leaf, new).unwrap();
    let data = model.remove(&first_of_second_leaf).unwrap();
    model.insert(new, data);
    check_all(&store, &root, &model);
}

#[test]
fn search_for_write_makes_room_the_caller_fills() {
    let mut store = MemStore::new(4096, 3);
    let (mut root, mut model) = build(&mut store, 800, 30);
    store.commit();
    let k = key(400, 5);
    let path = search_for_write(&mut store, &mut root, &k, WriteIntent::Insert(25 + 3000)).unwrap();
    assert!(!path.found);
    let leaf = path.leaf();
    {
        let block = store
            .dirty
            .get_mut(&leaf.bytenr)
            .expect("the path's leaf is dirty");
        let mut lm = oleo_format::tree_mut::LeafMut::new(block).unwrap();
        assert!(lm.free_space() >= 25 + 3000);
        lm.insert_item(leaf.slot, k, 3000).unwrap().fill(7);
    }
    // At slot 0 the new key is the leaf's first: the parents must learn it.
    update_parent_keys(&mut store, &path).unwrap();
    model.insert(k, vec![7; 3000]);
    check_all(&store, &root, &model);
}

/// Leaves counted in a check report.
fn leaf_count(report: &TreeCheck) -> usize {
    report.blocks.iter().filter(|b| b.1 == 0).count()
}

#[test]
fn sparse_deletes_merge_leaves_and_nodes() {
    for nodesize in [512u32, 4096] {
        let mut store = MemStore::new(nodesize, 3);
        let mut root = new_tree(&mut store, TREE).unwrap();
        let mut model = Model::new();
        for i in 0..3000u64 {
            insert_item(&mut store, &mut root, key(i, 0), &[2; 20]).unwrap();
            model.insert(key(i, 0), vec![2; 20]);
        }
        store.commit();
        let before = check_all_after_touch(&mut store, &mut root, &model);
        // Keep one item in twenty, spread over the whole tree.
        for i in (0..3000u64).filter(|i| i % 20 != 0) {
            delete_item(&mut store, &mut root, &key(i, 0)).unwrap();
            model.remove(&key(i, 0));
        }
        let after = check_all(&store, &root, &model);
        // 150 items of 45 bytes: a few leaves, where an unmerged tree keeps them all.
        let needed = (150 * 45) / (nodesize as usize - 101) + 1;
        assert!(
            leaf_count(&after) <= 2 * needed + 1,
            "nodesize {nodesize}: {} leaves left of {} for {needed} leaves of items",
            leaf_count(&after),
            leaf_count(&before)
        );
        assert!(after.blocks.len() * 4 < before.blocks.len());
    }
}

/// After a commit: copies the root (a write that changes nothing) and checks everything.
fn check_all_after_touch(store: &mut MemStore, root: &mut TreeRoot, model: &Model) -> TreeCheck {
    update_root_only(store, root, model);
    check_all(store, root, model)
}

#[test]
fn foreign_tree_with_a_single_child_root_collapses() {
    use oleo_format::{Header, LeafBuilder, NodeBuilder};
    // A committed tree as another writer might leave it: a root node with one pointer.
    let mut store = MemStore::new(4096, 8);
    let header = |bytenr: u64| Header {
        csum: [0; 32],
        fsid: super::mem_store::FSID,
        bytenr,
        flags: Header::new_block_flags(),
        chunk_tree_uuid: super::mem_store::CHUNK_UUID,
        generation: 5,
        owner: TREE,
        nritems: 0,
        level: 0,
    };
    let mut model = Model::new();
    let mut leaf = LeafBuilder::new(4096).unwrap();
    for i in 0..20u64 {
        leaf.push(key(i, 0), &[i as u8; 50]).unwrap();
        model.insert(key(i, 0), vec![i as u8; 50]);
    }
    let (leaf_at, node_at) = (4096 * 1000, 4096 * 1001);
    let leaf_block = leaf.finish(&header(leaf_at), store.csum).unwrap();
    let mut node = NodeBuilder::new(4096).unwrap();
    node.push(oleo_format::tree_block::KeyPtr {
        key: key(0, 0),
        blockptr: leaf_at,
        generation: 5,
    })
    .unwrap();
    let node_block = node.finish(&header(node_at), 1, store.csum).unwrap();
    store.committed.insert(leaf_at, leaf_block.into());
    store.committed.insert(node_at, node_block.into());
    store.live.extend([leaf_at, node_at]);
    let mut root = TreeRoot {
        id: TREE,
        bytenr: node_at,
        level: 1,
        generation: 5,
    };
    delete_item(&mut store, &mut root, &key(0, 0)).unwrap();
    model.remove(&key(0, 0));
    check_all(&store, &root, &model);
    assert_eq!(root.level, 0, "the single-child root gave way to its leaf");
    // Both old blocks were copied and freed, and so was the root's copy.
    assert!(store.freed.contains(&leaf_at) && store.freed.contains(&node_at));
    assert_eq!(store.freed.len(), 3);
    insert_item(&mut store, &mut root, key(0, 0), b"back").unwrap();
    model.insert(key(0, 0), b"back".to_vec());
    check_all(&store, &root, &model);
}

#[test]
fn delete_items_at_a_path_rebalances() {
    let mut store = MemStore::new(4096, 3);
    let (mut root, mut model) = build(&mut store, 600, 30);
    store.commit();
    // Remove runs of items through paths, as the extent tree code would.
    for start in (0..600u64).step_by(50) {
        let path =
            search_for_write(&mut store, &mut root, &key(start, 0), WriteIntent::Modify).unwrap();
        assert!(path.found);
        let (bytenr, slot) = (path.leaf().bytenr, path.leaf().slot);
        let in_leaf = oleo_format::TreeBlock::new(&store.dirty[&bytenr])
            .unwrap()
            .nritems()
            - slot;
        let count = in_leaf.min(40);
        delete_items_at(&mut store, &mut root, &path, count).unwrap();
        let gone: Vec<Key> = model
            .range(key(start, 0)..)
            .take(count)
            .map(|(k, _)| *k)
            .collect();
        for k in gone {
            model.remove(&k);
        }
        check_all(&store, &root, &model);
    }
}
