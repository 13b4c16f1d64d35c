use super::*;
use proptest::prelude::*;

/// The start of a stream the kernel wrote (`btrfs send` of a snapshot `s1`, protocol 1):
/// header and SUBVOL, with the kernel's crc.
const KERNEL_START: [u8; 65] = [
    0x62, 0x74, 0x72, 0x66, 0x73, 0x2d, 0x73, 0x74, 0x72, 0x65, 0x61, 0x6d, 0x00, 0x01, 0x00, 0x00,
    0x00, 0x26, 0x00, 0x00, 0x00, 0x01, 0x00, 0x74, 0x84, 0x29, 0x52, 0x0f, 0x00, 0x02, 0x00, 0x73,
    0x31, 0x01, 0x00, 0x10, 0x00, 0xda, 0x25, 0x29, 0xac, 0x0e, 0xfa, 0xef, 0x47, 0x97, 0x52, 0xaf,
    0x2e, 0x82, 0x47, 0x43, 0x81, 0x02, 0x00, 0x08, 0x00, 0x07, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00,
];

fn header(version: u32) -> Vec<u8> {
    let mut v = STREAM_MAGIC.to_vec();
    v.extend_from_slice(&version.to_le_bytes());
    v
}

fn tlv(t: u16, v: &[u8]) -> Vec<u8> {
    let mut b = t.to_le_bytes().to_vec();
    b.extend_from_slice(&(v.len() as u16).to_le_bytes());
    b.extend_from_slice(v);
    b
}

/// A command with a correct length and crc around any payload.
fn raw_cmd(number: u16, payload: &[u8]) -> Vec<u8> {
    let mut b = (payload.len() as u32).to_le_bytes().to_vec();
    b.extend_from_slice(&number.to_le_bytes());
    b.extend_from_slice(&[0; 4]);
    b.extend_from_slice(payload);
    let crc = crc32c_raw(0, &b);
    b[6..10].copy_from_slice(&crc.to_le_bytes());
    b
}

fn encode(version: u32, cmds: &[Command]) -> Vec<u8> {
    let mut w = StreamWriter::new(Vec::new(), version).unwrap();
    for c in cmds {
        w.write_command(c).unwrap();
    }
    w.into_inner()
}

fn decode_all(bytes: &[u8]) -> Result<Vec<Command>, StreamError> {
    let mut r = StreamReader::new(bytes)?;
    let mut v = Vec::new();
    while let Some(c) = r.next_command()? {
        v.push(c);
    }
    Ok(v)
}

/// The error of a stream of `header(version)` and the raw commands.
fn error_of(version: u32, cmds: &[Vec<u8>]) -> StreamError {
    let mut b = header(version);
    for c in cmds {
        b.extend_from_slice(c);
    }
    decode_all(&b).expect_err("the stream must be refused")
}

/// The values a command is built from.
#[derive(Clone, Debug)]
struct Vals {
    p1: Vec<u8>,
    p2: Vec<u8>,
    root_ok: Vec<u8>,
    name: Vec<u8>,
    data: Vec<u8>,
    n: [u64; 4],
    m: u32,
    uuids: ([u8; 16], [u8; 16]),
    times: [Timespec; 4],
    flags: (bool, bool),
}

/// Command number `i` (1 to 26) from `v`, each attribute filled.
fn build(i: u16, v: &Vals) -> Command {
    let (p, q, d) = (v.p1.clone(), v.p2.clone(), v.data.clone());
    let [a, b, c, e] = v.n;
    let opt = |f: bool, x: u64| f.then_some(x);
    match i {
        cmd::SUBVOL => Command::Subvol {
            path: p,
            uuid: v.uuids.0,
            ctransid: a,
        },
        cmd::SNAPSHOT => Command::Snapshot {
            path: p,
            uuid: v.uuids.0,
            ctransid: a,
            clone_uuid: v.uuids.1,
            clone_ctransid: b,
        },
        cmd::MKFILE => Command::Mkfile { path: p, ino: a },
        cmd::MKDIR => Command::Mkdir { path: p, ino: a },
        cmd::MKNOD => Command::Mknod {
            path: p,
            ino: a,
            mode: b,
            rdev: c,
        },
        cmd::MKFIFO => Command::Mkfifo {
            path: p,
            ino: a,
            mode: opt(v.flags.0, b),
            rdev: opt(v.flags.1, c),
        },
        cmd::MKSOCK => Command::Mksock {
            path: p,
            ino: a,
            mode: opt(v.flags.1, b),
            rdev: opt(v.flags.0, c),
        },
        cmd::SYMLINK => Command::Symlink {
            path: p,
            ino: a,
            target: v.name.clone(),
        },
        cmd::RENAME => Command::Rename { from: p, to: q },
        cmd::LINK => Command::Link { path: p, link: q },
        cmd::UNLINK => Command::Unlink { path: p },
        cmd::RMDIR => Command::Rmdir { path: p },
        cmd::SET_XATTR => Command::SetXattr {
            path: v.root_ok.clone(),
            name: v.name.clone(),
            data: d,
        },
        cmd::REMOVE_XATTR => Command::RemoveXattr {
            path: v.root_ok.clone(),
            name: v.name.clone(),
        },
        cmd::WRITE => Command::Write {
            path: p,
            offset: a,
            data: d,
        },
        cmd::CLONE => Command::Clone {
            path: p,
            offset: a,
            len: b,
            clone_uuid: v.uuids.1,
            clone_ctransid: c,
            clone_path: q,
            clone_offset: e,
        },
        cmd::TRUNCATE => Command::Truncate { path: p, size: a },
        cmd::CHMOD => Command::Chmod {
            path: v.root_ok.clone(),
            mode: a,
        },
        cmd::CHOWN => Command::Chown {
            path: v.root_ok.clone(),
            uid: a,
            gid: b,
        },
        cmd::UTIMES => Command::Utimes {
            path: v.root_ok.clone(),
            atime: v.times[0],
            mtime: v.times[1],
            ctime: v.times[2],
            otime: v.flags.0.then_some(v.times[3]),
        },
        cmd::END => Command::End,
        cmd::UPDATE_EXTENT => Command::UpdateExtent {
            path: p,
            offset: a,
            len: b,
        },
        cmd::FALLOCATE => Command::Fallocate {
            path: p,
            mode: v.m,
            offset: a,
            len: b,
        },
        cmd::FILEATTR => Command::Fileattr {
            path: v.root_ok.clone(),
            attr: a,
        },
        cmd::ENCODED_WRITE => Command::EncodedWrite {
            path: p,
            offset: a,
            unencoded_file_len: b,
            unencoded_len: c,
            unencoded_offset: e,
            compression: v.flags.0.then_some(v.m),
            encryption: v.flags.1.then_some(v.m ^ 1),
            data: d,
        },
        cmd::ENABLE_VERITY => Command::EnableVerity {
            path: p,
            algorithm: a as u8,
            block_size: v.m,
            salt: v.name.clone(),
            sig: d,
        },
        _ => panic!("no command {i}"),
    }
}

fn sample() -> Vals {
    Vals {
        p1: b"dir/o257-7-0".to_vec(),
        p2: b"a b/\n\\\xe9".to_vec(),
        root_ok: Vec::new(),
        name: b"user.x".to_vec(),
        data: (0..=255u8).collect(),
        n: [1, u64::MAX, 1 << 40, 4096],
        m: 3,
        uuids: ([1; 16], [0xfe; 16]),
        times: [Timespec {
            sec: 1_700_000_000,
            nsec: 999_999_999,
        }; 4],
        flags: (true, false),
    }
}

#[test]
fn kernel_crc_and_bytes() {
    let mut r = StreamReader::new(&KERNEL_START[..]).unwrap();
    assert_eq!(r.version(), 1);
    let c = r.next_command().unwrap().unwrap();
    let uuid = KERNEL_START[37..53].try_into().unwrap();
    assert_eq!(
        c,
        Command::Subvol {
            path: b"s1".to_vec(),
            uuid,
            ctransid: 7
        }
    );
    // Written again, the same bytes (order, lengths and the kernel's crc).
    let mut w = StreamWriter::new(Vec::new(), 1).unwrap();
    w.write_command(&c).unwrap();
    assert_eq!(w.into_inner(), KERNEL_START);
    // The stream stops there: no END.
    let e = r.next_command().unwrap_err();
    assert!(matches!(e.kind, StreamErrorKind::MissingEnd), "{e}");
    assert_eq!(e.offset, 65);
}

#[test]
fn every_command_round_trips_in_every_version() {
    let v = sample();
    for version in 1..=MAX_VERSION {
        let cmds: Vec<Command> = (1..=cmd::MAX_V3)
            .filter(|&i| i != cmd::END && i <= max_command(version))
            .map(|i| build(i, &v))
            .chain([Command::End])
            .collect();
        let bytes = encode(version, &cmds);
        assert_eq!(decode_all(&bytes).unwrap(), cmds, "version {version}");
    }
}

#[test]
fn newer_commands_are_refused_by_older_versions() {
    let v = sample();
    for (i, version) in [
        (cmd::FALLOCATE, 1),
        (cmd::ENCODED_WRITE, 1),
        (cmd::ENABLE_VERITY, 2),
    ] {
        let c = build(i, &v);
        let mut w = StreamWriter::new(Vec::new(), version).unwrap();
        assert!(w.write_command(&c).is_err());
        // Read side: a well-formed command of a newer version.
        let mut payload = tlv(attr::PATH, b"f");
        payload.extend(tlv(attr::FILEATTR, &[0; 8]));
        let e = error_of(version, &[raw_cmd(i, &payload)]);
        assert!(
            matches!(e.kind, StreamErrorKind::CommandNotInVersion(x) if x == version),
            "{e}"
        );
        assert_eq!(e.command.unwrap().number, i);
    }
}

#[test]
fn v2_data_takes_the_rest_of_the_command() {
    // Data that looks like attributes must stay data in v2, and be framed in v1.
    let data = [tlv(attr::PATH, b"x"), tlv(attr::INO, &[0; 8])].concat();
    let c = Command::Write {
        path: b"f".to_vec(),
        offset: 7,
        data: data.clone(),
    };
    for version in [1, 2, 3] {
        let bytes = encode(version, &[c.clone(), Command::End]);
        assert_eq!(decode_all(&bytes).unwrap(), vec![c.clone(), Command::End]);
    }
    // v2 layout: PATH, FILE_OFFSET, then the bare DATA type and the bytes.
    let bytes = encode(2, std::slice::from_ref(&c));
    let payload = &bytes[STREAM_HEADER_SIZE + CMD_HEADER_SIZE..];
    let head = [
        tlv(attr::PATH, b"f"),
        tlv(attr::FILE_OFFSET, &7u64.to_le_bytes()),
    ]
    .concat();
    assert_eq!(&payload[..head.len()], &head[..]);
    assert_eq!(
        &payload[head.len()..head.len() + 2],
        &attr::DATA.to_le_bytes()
    );
    assert_eq!(&payload[head.len() + 2..], &data[..]);
    // More than 64 KiB of data fits v2, not v1.
    let big = Command::Write {
        path: b"f".to_vec(),
        offset: 0,
        data: vec![7; 200_000],
    };
    let bytes = encode(2, &[big.clone(), Command::End]);
    assert_eq!(decode_all(&bytes).unwrap()[0], big);
    let mut w = StreamWriter::new(Vec::new(), 1).unwrap();
    assert!(w.write_command(&big).is_err());
}

#[test]
fn bad_crc_names_the_command_and_offset() {
    let v = sample();
    let cmds = [build(cmd::MKFILE, &v), build(cmd::WRITE, &v), Command::End];
    let good = encode(1, &cmds);
    let second =
        STREAM_HEADER_SIZE + 10 + (u32::from_le_bytes(good[17..21].try_into().unwrap()) as usize);
    // Every byte of the second command: its crc, or (for its length) a truncation or crc
    // failure further on, but always an error and never a panic.
    for i in second..good.len() - CMD_HEADER_SIZE {
        let mut b = good.clone();
        b[i] ^= 0x40;
        let e = decode_all(&b).unwrap_err();
        if (second + 4..good.len() - CMD_HEADER_SIZE).contains(&i) {
            assert!(
                matches!(e.kind, StreamErrorKind::BadCrc { .. }),
                "byte {i}: {e}"
            );
            assert_eq!(e.offset, second as u64);
            assert_eq!(e.command.unwrap().offset, second as u64);
        }
    }
    let mut b = good.clone();
    b[second + 20] ^= 1;
    let e = decode_all(&b).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains(&format!("byte {second}")) && msg.contains("command 15 (WRITE)"),
        "{msg}"
    );
    assert!(msg.contains("bad CRC"), "{msg}");
}

#[test]
fn truncation_at_every_byte_is_an_error() {
    let v = sample();
    let cmds: Vec<Command> = [cmd::SUBVOL, cmd::MKFILE, cmd::WRITE, cmd::UTIMES]
        .iter()
        .map(|&i| build(i, &v))
        .chain([Command::End])
        .collect();
    for version in [1, 2] {
        let good = encode(version, &cmds);
        assert_eq!(decode_all(&good).unwrap(), cmds);
        for k in 0..good.len() {
            let e = decode_all(&good[..k]).unwrap_err();
            assert!(e.offset <= k as u64, "cut at {k}: {e}");
            assert!(
                matches!(
                    e.kind,
                    StreamErrorKind::Empty
                        | StreamErrorKind::Truncated { .. }
                        | StreamErrorKind::MissingEnd
                ),
                "cut at {k}: {e}"
            );
        }
    }
}

#[test]
fn unknown_and_misfit_things_are_refused() {
    let path = tlv(attr::PATH, b"f");
    let ino = tlv(attr::INO, &5u64.to_le_bytes());
    let end = raw_cmd(cmd::END, &[]);
    let mkfile = raw_cmd(cmd::MKFILE, &[path.clone(), ino.clone()].concat());
    let offset_of_second = (STREAM_HEADER_SIZE + mkfile.len()) as u64;
    let check = |bad: Vec<u8>, want: &dyn Fn(&StreamErrorKind) -> bool, what: &str| {
        let e = error_of(2, &[mkfile.clone(), bad, end.clone()]);
        assert!(want(&e.kind), "{what}: {e}");
        assert_eq!(e.command.unwrap().offset, offset_of_second, "{what}: {e}");
        assert!(e.offset >= offset_of_second, "{what}: {e}");
        e
    };
    let e = check(
        raw_cmd(99, &path),
        &|k| matches!(k, StreamErrorKind::UnknownCommand),
        "unknown command",
    );
    assert!(e.to_string().contains("command 99 (unknown)"), "{e}");
    check(
        raw_cmd(0, &[]),
        &|k| matches!(k, StreamErrorKind::UnknownCommand),
        "command 0",
    );
    check(
        raw_cmd(cmd::MKFILE, &[path.clone(), tlv(77, b"")].concat()),
        &|k| matches!(k, StreamErrorKind::UnknownAttribute(77)),
        "unknown attribute",
    );
    check(
        raw_cmd(
            cmd::MKFILE,
            &[path.clone(), tlv(attr::VERITY_ALGORITHM, &[1])].concat(),
        ),
        &|k| {
            matches!(
                k,
                StreamErrorKind::AttributeNotInVersion {
                    attr: 32,
                    version: 2
                }
            )
        },
        "v3 attribute in v2",
    );
    let e = check(
        raw_cmd(
            cmd::MKFILE,
            &[path.clone(), ino.clone(), ino.clone()].concat(),
        ),
        &|k| matches!(k, StreamErrorKind::DuplicateAttribute { attr: 3 }),
        "duplicate",
    );
    assert_eq!(
        e.offset,
        offset_of_second + (CMD_HEADER_SIZE + path.len() + ino.len()) as u64
    );
    check(
        raw_cmd(cmd::MKFILE, &path),
        &|k| matches!(k, StreamErrorKind::MissingAttribute { attr: 3 }),
        "missing",
    );
    check(
        raw_cmd(
            cmd::MKFILE,
            &[path.clone(), tlv(attr::INO, &[1; 4])].concat(),
        ),
        &|k| {
            matches!(
                k,
                StreamErrorKind::AttributeSize {
                    attr: 3,
                    expected: 8,
                    got: 4
                }
            )
        },
        "size",
    );
    check(
        raw_cmd(
            cmd::MKFILE,
            &[path.clone(), ino.clone(), tlv(attr::UID, &[0; 8])].concat(),
        ),
        &|k| matches!(k, StreamErrorKind::UnexpectedAttribute { attr: 6 }),
        "unexpected",
    );
    let mut overrun = path.clone();
    overrun.extend_from_slice(&attr::INO.to_le_bytes());
    overrun.extend_from_slice(&100u16.to_le_bytes());
    overrun.extend_from_slice(&[0; 8]);
    check(
        raw_cmd(cmd::MKFILE, &overrun),
        &|k| matches!(k, StreamErrorKind::AttributeOverrun { attr: 3, .. }),
        "overrun",
    );
    check(
        raw_cmd(cmd::MKFILE, &[path.clone(), vec![3]].concat()),
        &|k| matches!(k, StreamErrorKind::ShortAttributeHeader),
        "short attribute header",
    );
    // A length beyond the limit is refused before anything is read or allocated.
    let mut huge = raw_cmd(cmd::WRITE, &path);
    huge[0..4].copy_from_slice(&(MAX_COMMAND_LEN + 1).to_le_bytes());
    check(
        huge,
        &|k| matches!(k, StreamErrorKind::TooLong(_)),
        "too long",
    );
}

#[test]
fn bad_paths_are_refused() {
    let ino = tlv(attr::INO, &[0; 8]);
    let bad: [&[u8]; 9] = [
        b"/etc/passwd",
        b"..",
        b"a/../../b",
        b"a/..",
        b"a\0b",
        b"",
        b"a//b",
        b"a/",
        b"./a",
    ];
    for p in bad {
        let c = raw_cmd(cmd::MKFILE, &[tlv(attr::PATH, p), ino.clone()].concat());
        let e = error_of(1, &[c]);
        assert!(
            matches!(e.kind, StreamErrorKind::BadPath { attr: 15, .. }),
            "{p:?}: {e}"
        );
        assert_eq!(e.offset, (STREAM_HEADER_SIZE + CMD_HEADER_SIZE) as u64);
        // The same through the typed writer (which does not check) and in other path
        // attributes.
        let r = Command::Rename {
            from: b"ok".to_vec(),
            to: p.to_vec(),
        };
        let e = decode_all(&encode(1, &[r, Command::End])).unwrap_err();
        assert!(
            matches!(e.kind, StreamErrorKind::BadPath { attr: 16, .. }),
            "{p:?}: {e}"
        );
    }
    // The subvolume's root is the empty path, where the kernel uses it.
    let ok = [
        Command::Chmod {
            path: Vec::new(),
            mode: 0o755,
        },
        Command::Utimes {
            path: Vec::new(),
            atime: Timespec::default(),
            mtime: Timespec::default(),
            ctime: Timespec::default(),
            otime: None,
        },
        // A symlink's target is not a path inside the stream.
        Command::Symlink {
            path: b"l".to_vec(),
            ino: 300,
            target: b"/../etc".to_vec(),
        },
        Command::End,
    ];
    assert_eq!(decode_all(&encode(1, &ok)).unwrap(), ok);
    let nul_target = Command::Symlink {
        path: b"l".to_vec(),
        ino: 300,
        target: b"a\0".to_vec(),
    };
    let e = decode_all(&encode(1, &[nul_target])).unwrap_err();
    assert!(
        matches!(e.kind, StreamErrorKind::BadPath { attr: 17, .. }),
        "{e}"
    );
}

#[test]
fn header_errors() {
    let e = decode_all(b"").unwrap_err();
    assert!(matches!(e.kind, StreamErrorKind::Empty));
    let e = decode_all(b"btrfs-streaX\0\x01\0\0\0").unwrap_err();
    assert!(matches!(e.kind, StreamErrorKind::BadMagic));
    for v in [0u32, 4, u32::MAX] {
        let e = decode_all(&header(v)).unwrap_err();
        assert!(matches!(e.kind, StreamErrorKind::UnsupportedVersion(x) if x == v));
    }
    assert!(StreamWriter::new(Vec::new(), 4).is_err());
}

#[test]
fn end_stops_reading() {
    let mut b = encode(1, &[Command::End]);
    b.extend_from_slice(b"trailing bytes are not read");
    let mut r = StreamReader::new(&b[..]).unwrap();
    assert_eq!(r.next_command().unwrap(), Some(Command::End));
    assert_eq!(r.next_command().unwrap(), None);
    assert_eq!(r.position(), (STREAM_HEADER_SIZE + CMD_HEADER_SIZE) as u64);
    // After an error, no more commands.
    let h = header(1);
    let mut r = StreamReader::new(&h[..]).unwrap();
    assert!(r.next_command().is_err());
    assert!(matches!(
        r.next_command().unwrap_err().kind,
        StreamErrorKind::AfterError
    ));
    assert!(r.next().is_none(), "the iterator ends after an error");
}

fn component() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(1u8..=255, 1..12).prop_filter("no slash, not . or ..", |c| {
        !c.contains(&b'/') && c != b"." && c != b".."
    })
}

fn path() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(component(), 1..4).prop_map(|cs| cs.join(&b'/'))
}

fn timespec() -> impl Strategy<Value = Timespec> {
    (any::<u64>(), any::<u32>()).prop_map(|(sec, nsec)| Timespec { sec, nsec })
}

fn vals() -> impl Strategy<Value = Vals> {
    (
        (path(), path(), prop_oneof![Just(Vec::new()), path()]),
        proptest::collection::vec(1u8..=255, 1..40),
        proptest::collection::vec(any::<u8>(), 0..3000),
        any::<[u64; 4]>(),
        any::<u32>(),
        (any::<[u8; 16]>(), any::<[u8; 16]>()),
        proptest::array::uniform4(timespec()),
        (any::<bool>(), any::<bool>()),
    )
        .prop_map(
            |((p1, p2, root_ok), name, data, n, m, uuids, times, flags)| Vals {
                p1,
                p2,
                root_ok,
                name,
                data,
                n,
                m,
                uuids,
                times,
                flags,
            },
        )
}

proptest! {
    #[test]
    fn commands_round_trip(
        version in 1u32..=3,
        picks in proptest::collection::vec(1u16..=cmd::MAX_V3, 1..8),
        v in vals(),
    ) {
        let cmds: Vec<Command> = picks
            .iter()
            .filter(|&&i| i != cmd::END && i <= max_command(version))
            .map(|&i| build(i, &v))
            .chain([Command::End])
            .collect();
        let bytes = encode(version, &cmds);
        prop_assert_eq!(decode_all(&bytes).unwrap(), cmds);
    }

    #[test]
    fn hostile_bytes_never_panic(version in 1u32..=3, body in proptest::collection::vec(any::<u8>(), 0..400)) {
        let mut b = header(version);
        b.extend_from_slice(&body);
        let _ = decode_all(&b);
    }

    #[test]
    fn well_framed_garbage_never_panics(number in 0u16..40, payload in proptest::collection::vec(any::<u8>(), 0..200)) {
        let mut b = header(2);
        b.extend(raw_cmd(number, &payload));
        let _ = decode_all(&b);
    }
}
