//! Walk a btrfs image without FUSE or the kernel: print every path with its size and mode,
//! and a checksum of each regular file's contents.
//!
//!     cargo run -p oleo --example walk -- IMAGE [SUBVOL]

use oleo::{FileKind, Filesystem, InodeId, OpenOptions};

fn walk(fs: &Filesystem, dir: InodeId, path: &mut Vec<u8>, depth: usize) -> oleo::Result<()> {
    let mut entries = Vec::new();
    fs.readdir(dir, 0, &mut |e| {
        entries.push(e);
        true
    })?;
    for e in entries {
        let len = path.len();
        path.push(b'/');
        path.extend_from_slice(&e.name);
        let attr = fs.getattr(e.id)?;
        let mut line = format!(
            "{:>10} {:o} {}",
            attr.size,
            attr.mode,
            String::from_utf8_lossy(path)
        );
        match attr.kind {
            FileKind::File => {
                // A cheap content fingerprint: sum of all bytes, read 1 MiB at a time.
                let (mut sum, mut off) = (0u64, 0u64);
                while off < attr.size {
                    let chunk = fs.read(e.id, off, 1 << 20)?;
                    sum = chunk
                        .iter()
                        .fold(sum, |s, &b| s.wrapping_mul(31).wrapping_add(b as u64));
                    off += chunk.len().max(1) as u64;
                }
                line += &format!("  sum={sum:016x}");
            }
            FileKind::Symlink => {
                line += &format!(" -> {}", String::from_utf8_lossy(&fs.readlink(e.id)?))
            }
            _ => {}
        }
        for name in fs.listxattr(e.id)? {
            line += &format!(
                "  [{}={:?}]",
                String::from_utf8_lossy(&name),
                String::from_utf8_lossy(&fs.getxattr(e.id, &name)?)
            );
        }
        println!("{line}");
        if attr.kind == FileKind::Dir && depth < 64 {
            walk(fs, e.id, path, depth + 1)?;
        }
        path.truncate(len);
    }
    Ok(())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let Some(image) = args.get(1) else {
        eprintln!("usage: walk IMAGE [SUBVOL]");
        std::process::exit(2);
    };
    let options = OpenOptions {
        subvol: args.get(2).map(|s| s.as_bytes().to_vec()),
        ..Default::default()
    };
    let result = Filesystem::open(image, options).and_then(|fs| {
        for sv in fs.list_subvolumes()? {
            println!(
                "subvolume {} {}",
                sv.id,
                String::from_utf8_lossy(sv.path.as_deref().unwrap_or(b"?"))
            );
        }
        walk(&fs, fs.root(), &mut Vec::new(), 0)
    });
    if let Err(e) = result {
        eprintln!("walk: {e}");
        std::process::exit(1);
    }
}
