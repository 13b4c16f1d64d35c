//! cargo-fuzz target `tree_block`: see crates/format/tests/fuzz_entry/mod.rs.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../crates/format/tests/fuzz_entry/mod.rs"]
mod fuzz_entry;

fuzz_target!(|data: &[u8]| fuzz_entry::tree_block(data));
