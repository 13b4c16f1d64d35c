"""Typical uses of the package, checked by mypy --strict against the stubs
(test_typing.py): every line must type-check as written. Never run."""

import io
import os

import oleo


def walk_sizes(image: str) -> int:
    total = 0
    with oleo.open(image) as fs:
        for top, dirs, files in fs.walk("/"):
            for name in files:
                st: os.stat_result = fs.lstat(f"{top}/{name}")
                total += st.st_size
        with fs.scandir("/") as it:
            for e in it:
                if e.is_file():
                    total += e.stat().st_size
        f: io.BufferedReader = fs.open("/x", "rb")
        data: bytes = f.read()
        t: io.TextIOWrapper = fs.open("/y")
        text: str = t.read()
        names: list[bytes] = fs.listdir(b"/")
        subs = fs.subvolumes()
    uuid: str = oleo.mkfs("x.img", 1 << 30, label="l")
    with oleo.open("x.img", "w") as w:
        w.makedirs("/a/b", exist_ok=True)
        w.setxattr("/a", "user.k", b"v", oleo.XATTR_CREATE)
        w.snapshot("/", "/s", readonly=True)
    try:
        oleo.open("x.img", "w")
    except oleo.CorruptError as err:
        print(err.errno)
    return total + len(data) + len(text) + len(names) + len(subs) + len(uuid)
