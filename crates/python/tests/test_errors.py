"""Errors are the built-in OSError subclasses, with errno and filename, as the os module
raises them for the same calls on a local filesystem."""

import errno
import os

import pytest

import oleo


@pytest.fixture
def fs(tmp_image):
    with oleo.open(tmp_image, "w") as fs:
        fs.mkdir("/dir")
        fs.mkdir("/dir/sub")
        with fs.open("/file", "wb") as f:
            f.write(b"data")
        fs.symlink("file", "/link")
        fs.symlink("loop2", "/loop1")
        fs.symlink("loop1", "/loop2")
        yield fs


def raises(exc, eno, call, *args, **kw):
    with pytest.raises(exc) as info:
        call(*args, **kw)
    assert type(info.value) is exc, f"{type(info.value).__name__} is not {exc.__name__}"
    assert info.value.errno == eno
    return info.value


def test_each_error_is_its_oserror_subclass(fs):
    e = raises(FileNotFoundError, errno.ENOENT, fs.stat, "/missing")
    assert e.filename == "/missing"
    raises(FileNotFoundError, errno.ENOENT, fs.open, "/dir/missing", "rb")
    raises(FileNotFoundError, errno.ENOENT, fs.mkdir, "/no/parent")
    raises(FileExistsError, errno.EEXIST, fs.mkdir, "/dir")
    raises(FileExistsError, errno.EEXIST, fs.open, "/file", "x")
    raises(FileExistsError, errno.EEXIST, fs.symlink, "x", "/file")
    raises(FileExistsError, errno.EEXIST, fs.makedirs, "/dir/sub")
    raises(NotADirectoryError, errno.ENOTDIR, fs.stat, "/file/below")
    raises(NotADirectoryError, errno.ENOTDIR, fs.listdir, "/file")
    raises(NotADirectoryError, errno.ENOTDIR, fs.rmdir, "/file")
    raises(IsADirectoryError, errno.EISDIR, fs.open, "/dir", "wb")
    raises(IsADirectoryError, errno.EISDIR, fs.open, "/dir", "rb")
    raises(IsADirectoryError, errno.EISDIR, fs.unlink, "/dir")
    e = raises(OSError, errno.ENOTEMPTY, fs.rmdir, "/dir")
    assert e.filename == "/dir"
    raises(OSError, errno.ELOOP, fs.stat, "/loop1")
    raises(OSError, errno.ENODATA, fs.getxattr, "/file", "user.none")
    raises(OSError, errno.EINVAL, fs.readlink, "/file")
    raises(OSError, errno.EINVAL, fs.rename, "/dir", "/dir/sub/in")
    raises(FileExistsError, errno.EEXIST, fs.rename, "/file", "/link", noreplace=True)
    raises(PermissionError, errno.EPERM, fs.link, "/dir", "/dir-link")
    raises(OSError, errno.ENAMETOOLONG, fs.mkdir, "/" + "n" * 256)


def test_bytes_paths_give_bytes_filenames_and_names(fs):
    e = raises(FileNotFoundError, errno.ENOENT, fs.stat, b"/caf\xe9")
    assert e.filename == os.fsdecode(b"/caf\xe9")
    fs.mkdir(b"/caf\xe9")
    assert b"caf\xe9" in fs.listdir(b"/")
    assert os.fsdecode(b"caf\xe9") in fs.listdir("/")


def test_a_damaged_image_raises_corrupt_error(tmp_path):
    image = tmp_path / "bad.img"
    oleo.mkfs(image, 256 << 20)
    # Every superblock copy's checksum no longer matches its bytes.
    with open(image, "r+b") as f:
        for copy in (64 << 10, 64 << 20):
            f.seek(copy)
            f.write(b"\xff" * 4)
    with pytest.raises(oleo.CorruptError) as info:
        oleo.open(image)
    assert info.value.filename == str(image)
    assert info.value.errno == errno.EIO
    assert "superblock" in str(info.value)
    assert issubclass(oleo.CorruptError, OSError)


def test_not_a_btrfs_image(tmp_path):
    image = tmp_path / "zeros.img"
    image.write_bytes(b"\0" * (1 << 20))
    with pytest.raises(OSError) as info:
        oleo.open(image)
    assert info.value.filename == str(image)


def test_a_second_writer_is_refused(tmp_image):
    with oleo.open(tmp_image, "w"):
        with pytest.raises(OSError) as info:
            oleo.open(tmp_image, "w")
        assert info.value.errno == errno.EBUSY


def test_bad_arguments_are_value_errors(fs):
    with pytest.raises(ValueError):
        fs.open("/file", "rw")
    with pytest.raises(ValueError):
        fs.open("/file", "rb", encoding="utf-8")
    with pytest.raises(ValueError):
        oleo.open("whatever.img", "a")
    with pytest.raises(ValueError):
        fs.setxattr("/file", "user.x", b"v", 7)
