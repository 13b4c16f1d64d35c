//! Compressed writes through the library across data chunk boundaries: a small image has
//! small data chunks, so adjacent compressed extents often sit in two chunks that follow
//! each other in logical addresses; each must be written through its own chunk's mapping.
//! Then the data reads back (oleo and the kernel) and `btrfs check --check-data-csum` passes.
//!
//! Needs root and btrfs-progs; without them it prints `SKIP: ...` (fails under CI=true).

use oleo::compression::Compress;
use oleo::{Filesystem, NewInode, OpenOptions};
use oleo_testkit::ops::data_for;
use oleo_testkit::{assert_btrfs_check, image, KernelMount, TempDir};

#[test]
fn compressed_writes_across_data_chunks() {
    if !oleo_testkit::require_root("compressed_writes_across_data_chunks") {
        return;
    }
    let tmp = TempDir::new("oleo-compress-chunks").expect("tempdir");
    let img = tmp.join("image");
    image::empty_image(&img, 256, &[]).expect("mkfs.btrfs");
    let opts = || OpenOptions {
        compress: Compress::parse(Some("zstd"), false).unwrap(),
        ..OpenOptions::default()
    };
    let fs = Filesystem::open_rw(&img, opts()).expect("open_rw");
    // 12 KiB that stays uncompressed first, so that chunk ends fall inside later writes.
    let noise = fs
        .mknod(fs.root(), b"noise", &NewInode::file(0o644))
        .unwrap()
        .id;
    fs.write(noise, 0, &data_for(0, 12 << 10, 0xf0)).unwrap();
    let mut files = Vec::new();
    for f in 0..2u8 {
        let name = format!("f{f}");
        let id = fs
            .mknod(fs.root(), name.as_bytes(), &NewInode::file(0o644))
            .unwrap()
            .id;
        // Zeros: one sector per 128 KiB, pieces end to end, 4 MiB on disk per 128 MiB.
        // Two files of 640 MiB fill more than the first data chunk.
        let zeros = vec![0u8; 1 << 20];
        let mut at = 0u64;
        while at < 640 << 20 {
            fs.write(id, at, &zeros).unwrap();
            at += 1 << 20;
        }
        files.push((name, id));
    }
    fs.sync().unwrap();
    for (name, id) in &files {
        assert_eq!(
            fs.read(*id, 300 << 20, 1 << 20).unwrap(),
            vec![0u8; 1 << 20],
            "{name}"
        );
    }
    drop(fs);
    assert_btrfs_check(&img, "compressed writes across chunks");
    let k = KernelMount::mount(&img, &tmp.join("mnt"), &["ro"]).expect("kernel mount");
    for (name, _) in &files {
        let data = std::fs::read(k.path().join(name)).unwrap();
        assert_eq!(data.len(), 640 << 20);
        assert!(
            data.iter().all(|&b| b == 0),
            "{name}: the kernel reads other bytes"
        );
    }
    assert_eq!(
        std::fs::read(k.path().join("noise")).unwrap(),
        data_for(0, 12 << 10, 0xf0)
    );
    let (disk, ram) = oleo_testkit::check::compsize(k.path());
    assert!(disk * 16 < ram, "compsize: {disk} of {ram} bytes");
}

/// A compressed inline extent may hold a whole sector; growing such a file turns it into
/// a regular extent, which the write must have reserved (debug builds assert every
/// allocation against its reservation). Found by the syscall differential test: the
/// kernel wrote back page 0 of a small file before its new last page.
#[test]
fn a_full_sector_inline_extent_grows_within_its_reservation() {
    if !oleo_testkit::require_root("a_full_sector_inline_extent_grows_within_its_reservation") {
        return;
    }
    let tmp = TempDir::new("oleo-compress-inline").expect("tempdir");
    let img = tmp.join("image");
    image::empty_image(&img, 256, &[]).expect("mkfs.btrfs");
    let opts = OpenOptions {
        compress: Compress::parse(Some("zstd"), false).unwrap(),
        ..OpenOptions::default()
    };
    let fs = Filesystem::open_rw(&img, opts).expect("open_rw");
    let id = fs
        .mknod(fs.root(), b"f", &NewInode::file(0o644))
        .unwrap()
        .id;
    fs.write(id, 0, &[7u8; 1000]).unwrap();
    fs.sync().unwrap();
    // The whole first page, compressible: a one-sector compressed inline extent.
    let mut page = vec![184u8; 1653];
    page.resize(4096, 7);
    fs.write(id, 0, &page).unwrap();
    // Then the end of the page at the new end, far past the old one.
    fs.write(id, 696_320, &[183u8; 56]).unwrap();
    fs.sync().unwrap();
    assert_eq!(fs.read(id, 0, 4096).unwrap(), page);
    assert_eq!(fs.read(id, 696_320, 56).unwrap(), vec![183u8; 56]);
    drop(fs);
    assert_btrfs_check(&img, "a grown one-sector inline extent");
}
