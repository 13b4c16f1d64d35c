//! `oleo restore`: `btrfs restore`, more tolerant: copies every file it can reach out of
//! an image that will not mount, never writing to the image.

use oleo::rescue::{restore, Report, RestoreOptions};
use std::io::Write;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct RestoreArgs {
    /// The image file or device (opened read-only).
    image: PathBuf,
    /// The directory to restore into (created if missing).
    #[arg(required_unless_present = "list_roots")]
    dest: Option<PathBuf>,
    /// Restore only paths (like /dir/file) matching this regular expression.
    #[arg(long)]
    path: Option<String>,
    /// The subvolume (tree id) to restore instead of the top level and its subvolumes.
    #[arg(long)]
    root: Option<u64>,
    /// A root tree root block to use (as `btrfs restore -t`).
    #[arg(long)]
    tree_root: Option<u64>,
    /// The superblock copy to use (0, 1 or 2, as `btrfs restore -u`); default the newest
    /// valid one. `--super` is another name for it.
    #[arg(long = "mirror", visible_alias = "super", value_name = "N",
          value_parser = clap::value_parser!(u8).range(0..3))]
    super_copy: Option<u8>,
    /// Print what would be restored; write nothing.
    #[arg(long)]
    dry_run: bool,
    /// Also try older roots a scan of the metadata finds (btrfs-find-root), newest first,
    /// for a tree whose known roots are all unreadable.
    #[arg(long)]
    older: bool,
    /// List the tree roots the metadata still holds (tree, generation, level, address),
    /// newest first, as btrfs-find-root does; restore nothing.
    #[arg(long)]
    list_roots: bool,
    /// Print each path restored.
    #[arg(short, long)]
    verbose: bool,
}

pub fn run(a: &RestoreArgs) -> Result<(), String> {
    if a.list_roots {
        let roots = oleo::rescue::find_roots(&a.image, a.super_copy.map(usize::from))
            .map_err(|e| e.to_string())?;
        let mut out = std::io::stdout().lock();
        let listed = writeln!(out, "tree generation level bytenr").and_then(|()| {
            roots.iter().try_for_each(|r| {
                writeln!(out, "{} {} {} {}", r.owner, r.generation, r.level, r.bytenr)
            })
        });
        return match listed {
            // A reader that has seen enough (`| head`) is no failure.
            Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.to_string()),
            _ => Ok(()),
        };
    }
    let Some(dest) = &a.dest else {
        return Err("give the directory to restore into (DEST)".into());
    };
    let filter = match &a.path {
        Some(p) => {
            let re = regex::Regex::new(p).map_err(|e| format!("--path {p}: {e}"))?;
            Some(Box::new(move |s: &str| re.is_match(s)) as Box<dyn Fn(&str) -> bool>)
        }
        None => None,
    };
    let print = a.verbose || a.dry_run;
    let options = RestoreOptions {
        super_copy: a.super_copy.map(usize::from),
        tree_root: a.tree_root,
        root: a.root,
        dry_run: a.dry_run,
        older: a.older,
        filter,
        on_path: print.then(|| {
            Box::new(|p: &std::path::Path| println!("{}", p.display()))
                as Box<dyn FnMut(&std::path::Path)>
        }),
    };
    let report = restore(&a.image, dest, options).map_err(|e| e.to_string())?;
    print_report(&report, a.dry_run);
    Ok(())
}

fn print_report(r: &Report, dry_run: bool) {
    let verb = if dry_run { "would restore" } else { "restored" };
    println!(
        "{verb}: {} files whole, {} with holes, {} directories, {} symlinks, {} special files",
        r.files_whole,
        r.files_with_holes.len(),
        r.dirs,
        r.symlinks,
        r.specials
    );
    for (path, holes) in &r.files_with_holes {
        let ranges: Vec<String> = holes.iter().map(|(a, b)| format!("{a}..{b}")).collect();
        println!(
            "  with holes: {} (unreadable bytes {})",
            path.display(),
            ranges.join(", ")
        );
    }
    if !r.files_unverified.is_empty() {
        println!(
            "unverified: {} files (data copied whose checksums could not be read)",
            r.files_unverified.len()
        );
        for (path, bytes) in &r.files_unverified {
            println!("  unverified: {} ({bytes} bytes)", path.display());
        }
    }
    println!(
        "names without inode or data: {}",
        r.names_without_inode.len()
    );
    for p in &r.names_without_inode {
        println!("  {}", p.display());
    }
    println!("skipped tree blocks: {}", r.skipped_blocks.len());
    for b in &r.skipped_blocks {
        println!("  {} (tree {}): {}", b.bytenr, b.owner, b.why);
    }
    if !r.errors.is_empty() {
        println!("other problems: {}", r.errors.len());
    }
}
