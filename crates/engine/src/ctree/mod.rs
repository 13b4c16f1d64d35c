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
mod verify;

#[cfg(test)]
mod mem_store;
#[cfg(test)]
mod tests;

pub use cow::copy_root;
pub(crate) use cow::cow_root;
pub use delete::{delete_item, delete_items_at, delete_range};
pub use insert::{
    insert_empty_items, insert_item, insert_items, new_tree, resize_item, set_item_key, update_item,
};
pub use path::{search_for_write, update_parent_keys, PathLevel, WriteIntent, WritePath};
pub use search::{for_each_in_range, lookup, lookup_le, BlockSource, Cursor, TreeRoot};
pub use store::{finalize_block, BlockStore};
pub use verify::{check_tree, TreeCheck};
