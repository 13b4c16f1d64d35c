//! B-trees: search and iteration (read side), and copy-on-write changes (write side).
//!
//! The read side (`search`) reads verified blocks through a `BlockSource`: the disk, or a
//! transaction's store. The write side works on a tree given by its `TreeRoot` and a
//! `BlockStore` that holds the running transaction's dirty blocks and decides where new
//! blocks go. Every block it touches is first copied into the transaction (`cow`); inserts
//! split full blocks on the way down (`path`, `split`); deletes drop emptied blocks, merge
//! thin neighbours and collapse a single-child root (`balance`). The root in `TreeRoot`
//! changes as the tree is copied, grows or shrinks: the caller stores it (ROOT_ITEM or
//! superblock) when the transaction commits.

mod balance;
mod cow;
mod delete;
mod insert;
mod path;
mod search;
mod split;
mod store;
#[cfg(test)]
mod verify;

#[cfg(test)]
mod mem_store;
#[cfg(test)]
mod tests;

pub(crate) use cow::copy_root;
pub(crate) use cow::cow_root;
pub(crate) use delete::{delete_item, delete_range};
pub(crate) use insert::{
    edit_leaf, insert_item, insert_items, new_tree, resize_item, set_item_key, update_item,
};
pub use search::TreeRoot;
pub(crate) use search::{for_each_in_range, lookup, lookup_le, BlockSource, Cursor};
pub(crate) use store::{finalize_block, BlockStore};

// The write path's lower-level entry points and the whole-tree check: only the tests
// drive them directly.
#[cfg(test)]
pub(crate) use delete::delete_items_at;
#[cfg(test)]
pub(crate) use path::{search_for_write, update_parent_keys, WriteIntent};
#[cfg(test)]
pub(crate) use verify::{check_tree, TreeCheck};
