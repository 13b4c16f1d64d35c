//! `oleo dump-super`: the superblock, field by field.

use oleo_format::bytes::uuid_string;
use oleo_format::superblock::{
    compat_ro, flag_names, incompat, mirror_offset, Superblock, SUPER_INFO_SIZE,
};
use std::os::unix::fs::FileExt;
use std::path::Path;

pub fn run(image: &Path, mirror: usize) -> Result<(), String> {
    if mirror > 2 {
        return Err("mirror must be 0, 1 or 2".into());
    }
    let file = std::fs::File::open(image).map_err(|e| format!("{}: {e}", image.display()))?;
    let mut buf = vec![0u8; SUPER_INFO_SIZE];
    let off = mirror_offset(mirror);
    file.read_exact_at(&mut buf, off)
        .map_err(|e| format!("reading superblock copy {mirror} at {off}: {e}"))?;
    // Shown whatever its fields hold (as btrfs dump-super does), those that fail their
    // sanity checks named after it.
    let sb = Superblock::parse_unchecked(&buf)
        .map_err(|e| format!("superblock copy {mirror} at {off}: {e}"))?;
    print!("{}", render(&sb));
    for p in sb.problems() {
        eprintln!("superblock copy {mirror} at {off}: {p} (fails its sanity check)");
    }
    Ok(())
}

fn render(sb: &Superblock) -> String {
    let mut o = String::new();
    let mut line = |k: &str, v: String| o.push_str(&format!("{k:<24}{v}\n"));
    let csum_type = sb.csum_type();
    line(
        "csum_type",
        format!("{} ({})", sb.csum_type_raw, csum_type.name()),
    );
    line("csum_size", csum_type.size().to_string());
    line(
        "csum",
        sb.csum[..csum_type.size()]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect(),
    );
    line("bytenr", sb.bytenr.to_string());
    line("flags", format!("{:#x}", sb.flags));
    line("magic", "_BHRfS_M [match]".into());
    line("fsid", uuid_string(&sb.fsid));
    line("metadata_uuid", uuid_string(&sb.metadata_fsid()));
    line("label", String::from_utf8_lossy(&sb.label).into_owned());
    line("generation", sb.generation.to_string());
    line("root", sb.root.to_string());
    line("sys_array_size", sb.sys_chunk_array_size.to_string());
    line(
        "chunk_root_generation",
        sb.chunk_root_generation.to_string(),
    );
    line("root_level", sb.root_level.to_string());
    line("chunk_root", sb.chunk_root.to_string());
    line("chunk_root_level", sb.chunk_root_level.to_string());
    line("log_root", sb.log_root.to_string());
    line("log_root_level", sb.log_root_level.to_string());
    line("total_bytes", sb.total_bytes.to_string());
    line("bytes_used", sb.bytes_used.to_string());
    line("sectorsize", sb.sectorsize.to_string());
    line("nodesize", sb.nodesize.to_string());
    line("leafsize", sb.leafsize.to_string());
    line("stripesize", sb.stripesize.to_string());
    line("root_dir", sb.root_dir_objectid.to_string());
    line("num_devices", sb.num_devices.to_string());
    line("compat_flags", format!("{:#x}", sb.compat_flags));
    line(
        "compat_ro_flags",
        format!(
            "{:#x} ( {} )",
            sb.compat_ro_flags,
            flag_names(sb.compat_ro_flags, compat_ro::NAMES).join(" | ")
        ),
    );
    line(
        "incompat_flags",
        format!(
            "{:#x} ( {} )",
            sb.incompat_flags,
            flag_names(sb.incompat_flags, incompat::NAMES).join(" | ")
        ),
    );
    line("cache_generation", sb.cache_generation.to_string());
    line("uuid_tree_generation", sb.uuid_tree_generation.to_string());
    let d = &sb.dev_item;
    line("dev_item.uuid", uuid_string(&d.uuid));
    line("dev_item.fsid", uuid_string(&d.fsid));
    line("dev_item.devid", d.devid.to_string());
    line("dev_item.total_bytes", d.total_bytes.to_string());
    line("dev_item.bytes_used", d.bytes_used.to_string());
    line("dev_item.sector_size", d.sector_size.to_string());
    match sb.sys_chunks() {
        Ok(chunks) => {
            for (logical, c) in chunks {
                let stripes: Vec<String> = c
                    .stripes
                    .iter()
                    .map(|s| format!("devid {} physical {}", s.devid, s.offset))
                    .collect();
                line(
                    "sys_chunk",
                    format!(
                        "logical {logical} length {} {} [{}]",
                        c.length,
                        oleo_format::items::block_group::describe(c.chunk_type),
                        stripes.join(", ")
                    ),
                );
            }
        }
        Err(e) => line("sys_chunk_array", format!("invalid: {e}")),
    }
    for (i, b) in sb.backup_roots.iter().enumerate() {
        line(&format!("backup_roots[{i}]"), format!(
            "tree_root {} gen {} level {}, chunk_root {} gen {}, extent_root {}, fs_root {}, dev_root {}, csum_root {}, total_bytes {}, bytes_used {}, num_devices {}",
            b.tree_root, b.tree_root_gen, b.tree_root_level, b.chunk_root, b.chunk_root_gen, b.extent_root, b.fs_root, b.dev_root, b.csum_root, b.total_bytes, b.bytes_used, b.num_devices
        ));
    }
    o
}
