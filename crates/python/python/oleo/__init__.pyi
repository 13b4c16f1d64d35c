"""Type stubs of the `oleo` package: read and write btrfs images from Python."""

import io
import os
from typing import (Any, BinaryIO, Callable, Dict, Generic, Iterator, List, Literal, Optional,
                    Sequence, Tuple, TypeVar, Union, overload)

_Path = Union[str, bytes, "os.PathLike[str]", "os.PathLike[bytes]"]
_AnyStr = TypeVar("_AnyStr", str, bytes)

__version__: str
XATTR_CREATE: int
XATTR_REPLACE: int
FALLOC_FL_KEEP_SIZE: int
FALLOC_FL_PUNCH_HOLE: int
FALLOC_FL_ZERO_RANGE: int

class CorruptError(OSError):
    """A damaged image: metadata that fails validation (errno EUCLEAN) or file data whose
    checksum does not match (errno EIO)."""

def open(
    path: _Path,
    mode: Literal["r", "w", "rw", "r+"] = "r",
    *,
    subvol: Optional[_Path] = ...,
    subvolid: Optional[int] = ...,
    devices: Sequence[_Path] = ...,
    compress: Optional[str] = ...,
    compress_force: bool = ...,
    cache_bytes: Optional[int] = ...,
    log_replay: bool = ...,
    degraded: bool = ...,
) -> FileSystem:
    """Opens the btrfs filesystem in an image file or block device; "w" commits on
    close."""

def mkfs(
    path: _Path,
    size: Optional[int] = ...,
    *,
    rootdir: Optional[_Path] = ...,
    label: Optional[str] = ...,
    nodesize: Optional[int] = ...,
    csum: Optional[Literal["crc32c", "xxhash", "xxhash64", "sha256", "blake2", "blake2b"]] = ...,
    metadata: Optional[str] = ...,
    data: Optional[str] = ...,
    uuid: Union[str, bytes, None] = ...,
    owner: Optional[Tuple[int, int]] = ...,
    force: bool = ...,
) -> str:
    """Makes a new btrfs filesystem as mkfs.btrfs does; returns its UUID."""

class DirEntry(Generic[_AnyStr]):
    name: _AnyStr
    path: _AnyStr
    def inode(self) -> int: ...
    def is_dir(self, *, follow_symlinks: bool = ...) -> bool: ...
    def is_file(self, *, follow_symlinks: bool = ...) -> bool: ...
    def is_symlink(self) -> bool: ...
    def is_junction(self) -> bool: ...
    def stat(self, *, follow_symlinks: bool = ...) -> os.stat_result: ...
    def __fspath__(self) -> _AnyStr: ...

class FileSystem:
    image: str
    writable: bool
    def __enter__(self) -> FileSystem: ...
    def __exit__(self, *exc: Any) -> Literal[False]: ...
    @property
    def closed(self) -> bool: ...
    @property
    def label(self) -> str: ...
    def close(self) -> None: ...
    def sync(self) -> None: ...
    # reading
    def stat(self, path: _Path, *, follow_symlinks: bool = ...) -> os.stat_result: ...
    def lstat(self, path: _Path) -> os.stat_result: ...
    def exists(self, path: _Path) -> bool: ...
    def isdir(self, path: _Path) -> bool: ...
    def isfile(self, path: _Path) -> bool: ...
    def islink(self, path: _Path) -> bool: ...
    @overload
    def scandir(self, path: str = ...) -> Iterator[DirEntry[str]]: ...
    @overload
    def scandir(self, path: bytes) -> Iterator[DirEntry[bytes]]: ...
    @overload
    def listdir(self, path: str = ...) -> List[str]: ...
    @overload
    def listdir(self, path: bytes) -> List[bytes]: ...
    @overload
    def walk(
        self,
        top: str = ...,
        topdown: bool = ...,
        onerror: Optional[Callable[[OSError], Any]] = ...,
        followlinks: bool = ...,
    ) -> Iterator[Tuple[str, List[str], List[str]]]: ...
    @overload
    def walk(
        self,
        top: bytes,
        topdown: bool = ...,
        onerror: Optional[Callable[[OSError], Any]] = ...,
        followlinks: bool = ...,
    ) -> Iterator[Tuple[bytes, List[bytes], List[bytes]]]: ...
    @overload
    def readlink(self, path: str) -> str: ...
    @overload
    def readlink(self, path: bytes) -> bytes: ...
    def listxattr(self, path: _Path, *, follow_symlinks: bool = ...) -> List[str]: ...
    def getxattr(self, path: _Path, attribute: _Path, *, follow_symlinks: bool = ...) -> bytes: ...
    def statvfs(self) -> os.statvfs_result: ...
    def read_bytes(self, path: _Path) -> bytes: ...
    def read_text(self, path: _Path, encoding: Optional[str] = ..., errors: Optional[str] = ...) -> str: ...
    # files
    @overload
    def open(
        self,
        path: _Path,
        mode: Literal["r", "w", "x", "a", "r+", "w+", "x+", "a+", "rt", "wt", "xt", "at"] = ...,
        buffering: int = ...,
        encoding: Optional[str] = ...,
        errors: Optional[str] = ...,
        newline: Optional[str] = ...,
        *,
        perm: int = ...,
    ) -> io.TextIOWrapper: ...
    @overload
    def open(
        self,
        path: _Path,
        mode: Literal["rb", "br"],
        buffering: int = ...,
        encoding: None = ...,
        errors: None = ...,
        newline: None = ...,
        *,
        perm: int = ...,
    ) -> io.BufferedReader: ...
    @overload
    def open(
        self,
        path: _Path,
        mode: Literal["wb", "xb", "ab", "bw", "bx", "ba"],
        buffering: int = ...,
        encoding: None = ...,
        errors: None = ...,
        newline: None = ...,
        *,
        perm: int = ...,
    ) -> io.BufferedWriter: ...
    @overload
    def open(
        self,
        path: _Path,
        mode: str,
        buffering: int = ...,
        encoding: Optional[str] = ...,
        errors: Optional[str] = ...,
        newline: Optional[str] = ...,
        *,
        perm: int = ...,
    ) -> BinaryIO: ...
    # changes
    def mkdir(self, path: _Path, mode: int = ...) -> None: ...
    def makedirs(self, name: _Path, mode: int = ..., exist_ok: bool = ...) -> None: ...
    def mknod(self, path: _Path, mode: int = ..., device: int = ...) -> None: ...
    def mkfifo(self, path: _Path, mode: int = ...) -> None: ...
    def unlink(self, path: _Path) -> None: ...
    def remove(self, path: _Path) -> None: ...
    def rmdir(self, path: _Path) -> None: ...
    def rename(self, src: _Path, dst: _Path, *, noreplace: bool = ..., exchange: bool = ...) -> None: ...
    def replace(self, src: _Path, dst: _Path) -> None: ...
    def link(self, src: _Path, dst: _Path, *, follow_symlinks: bool = ...) -> None: ...
    def symlink(self, src: _Path, dst: _Path) -> None: ...
    def chmod(self, path: _Path, mode: int, *, follow_symlinks: bool = ...) -> None: ...
    def chown(self, path: _Path, uid: int, gid: int, *, follow_symlinks: bool = ...) -> None: ...
    def utime(
        self,
        path: _Path,
        times: Optional[Tuple[float, float]] = ...,
        *,
        ns: Optional[Tuple[int, int]] = ...,
        follow_symlinks: bool = ...,
    ) -> None: ...
    def truncate(self, path: Union[_Path, BinaryIO, io.TextIOWrapper], length: int) -> None: ...
    def fallocate(self, file: Union[BinaryIO, io.RawIOBase], offset: int, length: int, mode: int = ...) -> None: ...
    def copy_file_range(
        self,
        src: Union[BinaryIO, io.RawIOBase],
        dst: Union[BinaryIO, io.RawIOBase],
        count: int,
        offset_src: Optional[int] = ...,
        offset_dst: Optional[int] = ...,
    ) -> int: ...
    def setxattr(
        self, path: _Path, attribute: _Path, value: bytes, flags: int = ..., *, follow_symlinks: bool = ...
    ) -> None: ...
    def removexattr(self, path: _Path, attribute: _Path, *, follow_symlinks: bool = ...) -> None: ...
    # subvolumes
    def subvolumes(self) -> List[Dict[str, Any]]: ...
    def create_subvolume(self, path: _Path) -> int: ...
    def snapshot(self, source: _Path, dest: _Path, readonly: bool = ...) -> int: ...
    def delete_subvolume(self, path: _Path) -> int: ...
