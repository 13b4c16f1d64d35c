//! `oleo restore`: `btrfs restore`, more tolerant: copies every file it can reach out of
//! an image that will not mount, never writing to the image.

use oleo::rescue::{restore, Report, RestoreOptions};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct RestoreArgs {
    /// The image file or device (opened read-only).
    image: PathBuf,
    /// The directory to restore into (created if missing).
    dest: PathBuf,
    /// Restore only paths (like /dir/file) matching this regular expression.
    #[arg(long)]
    path: Option<String>,
    /// The subvolume (tree id) to restore instead of the top level and its subvolumes.
    #[arg(long)]
    root: Option<u64>,
    /// A root tree root block to use (as `btrfs restore -t`).
    #[arg(long)]
    tree_root: Option<u64>,
    /// The superblock copy to use (0, 1 or 2); default the newest valid one.
    #[arg(long = "super", value_parser = clap::value_parser!(u8).range(0..3))]
    super_copy: Option<u8>,
    /// Print what would be restored; write nothing.
    #[arg(long)]
    dry_run: bool,
    /// Print each path restored.
    #[arg(short, long)]
    verbose: bool,
}

pub fn run(a: &RestoreArgs) -> Result<(), String> {
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
        filter,
        on_path: print.then(|| {
            Box::new(|p: &std::path::Path| println!("{}", p.display()))
                as Box<dyn FnMut(&std::path::Path)>
        }),
    };
    let report = restore(&a.image, &a.dest, options).map_err(|e| e.to_string())?;
    print_report(&report, a.dry_run);
    Ok(())
}

fn print_report(r: &Report, dry_run: bool) {
    let verb = if dry_run { "would restore" } else { "restored" };
    println!(
        "{verb}: {} files whole, {} with holes, {} directories, {} symlinks",
        r.files_whole,
        r.files_with_holes.len(),
        r.dirs,
        r.symlinks
    );
    for (path, holes) in &r.files_with_holes {
        let ranges: Vec<String> = holes.iter().map(|(a, b)| format!("{a}..{b}")).collect();
        println!(
            "  with holes: {} (unreadable bytes {})",
            path.display(),
            ranges.join(", ")
        );
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
