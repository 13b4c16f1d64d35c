"""fsspec's view of a btrfs image: ``OleoFileSystem``, registered under the protocol
``btrfs``, lets pandas, pyarrow, dask and every other fsspec user read files inside an
image without mounting it.

    import pandas as pd
    pd.read_csv("btrfs:///data/x.csv", storage_options={"image": "disk.img"})
    pd.read_csv("btrfs://data/x.csv::file:///srv/disk.img")      # fsspec's chaining

The image is given as the ``image`` (or ``fo``) option, or, in fsspec's URL chaining, by
the URL after ``::`` (as ``zip://`` takes its archive). Paths are inside the filesystem.
Read-only: fsspec's writers expect object-store semantics (whole files put at once) that
a btrfs image gives better through ``oleo.open(image, "w")``.
"""

import stat as _stat

from fsspec.spec import AbstractFileSystem

import oleo


class OleoFileSystem(AbstractFileSystem):
    """A btrfs image (file or block device) as a read-only fsspec filesystem."""

    protocol = "btrfs"
    root_marker = "/"
    # Instances are cached by their arguments (fsspec's default), so one open image
    # serves every URL that names it.
    cachable = True

    def __init__(self, image=None, fo=None, target_protocol=None, target_options=None,
                 subvol=None, subvolid=None, **kwargs):
        super().__init__(**kwargs)
        image = image if image is not None else fo
        if image is None:
            raise ValueError("OleoFileSystem needs the image: image=PATH")
        if target_protocol not in (None, "file", "local"):
            raise ValueError(
                f"the image must be a local file or device, not {target_protocol}://")
        if isinstance(image, str) and image.startswith(("file://", "local://")):
            image = image.split("://", 1)[1]
        options = {}
        if subvol is not None:
            options["subvol"] = subvol
        if subvolid is not None:
            options["subvolid"] = subvolid
        self.image = image
        self.fs = oleo.open(image, "r", **options)

    @classmethod
    def _strip_protocol(cls, path):
        path = super()._strip_protocol(path)
        return "/" + path.lstrip("/")

    def _info(self, path, st):
        mode = st.st_mode
        if _stat.S_ISDIR(mode):
            kind = "directory"
        elif _stat.S_ISREG(mode):
            kind = "file"
        elif _stat.S_ISLNK(mode):
            kind = "link"
        else:
            kind = "other"
        return {"name": path, "size": st.st_size, "type": kind, "mode": mode,
                "uid": st.st_uid, "gid": st.st_gid, "mtime": st.st_mtime,
                "ino": st.st_ino, "nlink": st.st_nlink, "subvolume": st.st_dev,
                "islink": _stat.S_ISLNK(mode)}

    def info(self, path, **kwargs):
        path = self._strip_protocol(path)
        try:
            st = self.fs.stat(path)
        except FileNotFoundError:
            raise FileNotFoundError(path) from None
        info = self._info(path, st)
        if _stat.S_ISLNK(self.fs.lstat(path).st_mode):
            info["islink"] = True
            info["destination"] = self.fs.readlink(path)
        return info

    def ls(self, path, detail=True, **kwargs):
        path = self._strip_protocol(path)
        st = self.fs.stat(path)
        if not _stat.S_ISDIR(st.st_mode):
            out = [self.info(path)]
        else:
            base = path.rstrip("/")
            out = []
            for e in self.fs.scandir(path):
                full = f"{base}/{e.name}"
                try:
                    info = self._info(full, e.stat())
                except OSError:
                    info = self._info(full, e.stat(follow_symlinks=False))
                info["islink"] = e.is_symlink()
                out.append(info)
        return out if detail else [o["name"] for o in out]

    def _open(self, path, mode="rb", block_size=None, autocommit=True, cache_options=None,
              **kwargs):
        if mode != "rb":
            raise PermissionError(f"{self.protocol}:// is read-only (mode {mode!r})")
        return self.fs.open(self._strip_protocol(path), "rb")

    def cat_file(self, path, start=None, end=None, **kwargs):
        path = self._strip_protocol(path)
        with self.fs.open(path, "rb", buffering=0) as f:
            if start is None and end is None:
                return f.readall()
            size = f.seek(0, 2)
            start = 0 if start is None else (start if start >= 0 else max(size + start, 0))
            end = size if end is None else (end if end >= 0 else max(size + end, 0))
            f.seek(start)
            return f.read(max(end - start, 0))

    def created(self, path):
        import datetime

        st = self.fs.stat(self._strip_protocol(path))
        return datetime.datetime.fromtimestamp(st.st_ctime, tz=datetime.timezone.utc)

    def modified(self, path):
        import datetime

        st = self.fs.stat(self._strip_protocol(path))
        return datetime.datetime.fromtimestamp(st.st_mtime, tz=datetime.timezone.utc)

    def _rm(self, path):
        raise PermissionError(f"{self.protocol}:// is read-only")

    def mkdir(self, path, create_parents=True, **kwargs):
        raise PermissionError(f"{self.protocol}:// is read-only")

    def makedirs(self, path, exist_ok=False):
        raise PermissionError(f"{self.protocol}:// is read-only")

    def rmdir(self, path):
        raise PermissionError(f"{self.protocol}:// is read-only")

    def cp_file(self, path1, path2, **kwargs):
        raise PermissionError(f"{self.protocol}:// is read-only")

    def touch(self, path, truncate=True, **kwargs):
        raise PermissionError(f"{self.protocol}:// is read-only")
