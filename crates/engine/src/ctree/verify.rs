//! A whole-tree check for tests and debugging: every reachable block, finalized as it would
//! be written, must pass the tree checker with the generation, level and first key its
//! parent promises; subtrees must hold only keys between their parent's neighbouring
//! pointers; only the root may be an empty leaf.

use super::search::{BlockSource, TreeRoot};
use super::store::{corrupt_at, finalize_block};
use crate::error::{Error, Result};
use oleo_format::key::Key;
use oleo_format::validate::{check_tree_block, Expect, FsContext};
use oleo_format::TreeBlock;

/// What a tree check saw.
#[derive(Clone, Debug, Default)]
pub struct TreeCheck {
    /// Every reachable block: (bytenr, level, generation, owner), in key order.
    pub blocks: Vec<(u64, u8, u64, u64)>,
    pub items: usize,
}

struct Visit {
    bytenr: u64,
    level: u8,
    generation: u64,
    first_key: Option<Key>,
    /// Keys in this subtree must be below this (the parent's next pointer key).
    upper: Option<Key>,
}

/// Walks the whole tree from `root`.
pub fn check_tree<S: BlockSource + ?Sized>(
    src: &S,
    root: &TreeRoot,
    ctx: &FsContext,
) -> Result<TreeCheck> {
    let mut out = TreeCheck::default();
    let mut last_key: Option<Key> = None;
    let mut stack = vec![Visit {
        bytenr: root.bytenr,
        level: root.level,
        generation: root.generation,
        first_key: None,
        upper: None,
    }];
    while let Some(v) = stack.pop() {
        let block =
            src.read_tree_block(v.bytenr, Some(v.level), Some(v.generation), v.first_key)?;
        let mut copy = block.to_vec();
        finalize_block(&mut copy, ctx.csum_type)?;
        let expect = Expect {
            bytenr: v.bytenr,
            level: Some(v.level),
            generation: Some(v.generation),
            first_key: v.first_key,
        };
        check_tree_block(&copy, ctx, &expect).map_err(corrupt_at(v.bytenr))?;
        let tb = TreeBlock::new(&copy).map_err(corrupt_at(v.bytenr))?;
        out.blocks
            .push((v.bytenr, v.level, tb.generation(), tb.owner()));
        let n = tb.nritems();
        if n == 0 {
            if v.bytenr != root.bytenr {
                return Err(Error::corrupt(v.bytenr, "empty block below the root"));
            }
            continue;
        }
        let last = tb.key_at(n - 1).map_err(corrupt_at(v.bytenr))?;
        if v.upper.is_some_and(|u| last >= u) {
            return Err(Error::corrupt(
                v.bytenr,
                format!("key {last:?} not below the parent's next key"),
            ));
        }
        if tb.is_leaf() {
            let first = tb.key_at(0).map_err(corrupt_at(v.bytenr))?;
            if last_key.is_some_and(|k| k >= first) {
                return Err(Error::corrupt(
                    v.bytenr,
                    "leaf keys overlap the previous leaf",
                ));
            }
            last_key = Some(last);
            out.items += n;
            continue;
        }
        // Children go on the stack last first, so they are visited in key order.
        for slot in (0..n).rev() {
            let p = tb.key_ptr(slot).map_err(corrupt_at(v.bytenr))?;
            let upper = if slot + 1 < n {
                Some(tb.key_ptr(slot + 1).map_err(corrupt_at(v.bytenr))?.key)
            } else {
                v.upper
            };
            stack.push(Visit {
                bytenr: p.blockptr,
                level: v.level - 1,
                generation: p.generation,
                first_key: Some(p.key),
                upper,
            });
        }
    }
    Ok(out)
}
