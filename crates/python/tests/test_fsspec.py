"""fsspec: the `btrfs` protocol reads files inside an image, by option and by URL
chaining, for fsspec's users (pandas and pyarrow read through these same calls)."""

import pytest

import oleo

fsspec = pytest.importorskip("fsspec")


@pytest.fixture
def image(tmp_image):
    with oleo.open(tmp_image, "w") as fs:
        fs.makedirs("/data/sub")
        with fs.open("/data/x.csv", "w") as f:
            f.write("a,b\n1,2\n3,4\n")
        with fs.open("/data/sub/blob", "wb") as f:
            f.write(bytes(range(256)) * 4096)
        fs.symlink("x.csv", "/data/link.csv")
    return str(tmp_image)


def test_registered_under_btrfs(image):
    cls = fsspec.get_filesystem_class("btrfs")
    assert cls.__name__ == "OleoFileSystem"


def test_open_by_option_and_by_chaining(image):
    with fsspec.open("btrfs:///data/x.csv", "rt", image=image) as f:
        assert f.read() == "a,b\n1,2\n3,4\n"
    with fsspec.open(f"btrfs://data/x.csv::file://{image}", "rb") as f:
        assert f.read() == b"a,b\n1,2\n3,4\n"


def test_listing_info_and_ranges(image):
    fs = fsspec.filesystem("btrfs", image=image)
    assert sorted(fs.ls("/data", detail=False)) == ["/data/link.csv", "/data/sub",
                                                    "/data/x.csv"]
    info = fs.info("/data/sub/blob")
    assert (info["type"], info["size"]) == ("file", 256 * 4096)
    assert fs.info("/data/sub")["type"] == "directory"
    assert fs.cat_file("/data/sub/blob", start=10, end=20) == bytes(range(10, 20))
    assert fs.cat_file("/data/sub/blob", start=-3) == bytes([253, 254, 255])
    assert fs.exists("/data/x.csv") and not fs.exists("/nope")
    assert sorted(fs.find("/data")) == ["/data/link.csv", "/data/sub/blob", "/data/x.csv"]
    assert fs.glob("/data/*.csv") == ["/data/link.csv", "/data/x.csv"]
    assert fs.cat("/data/link.csv") == b"a,b\n1,2\n3,4\n"
    with pytest.raises(FileNotFoundError):
        fs.info("/nope")
    with pytest.raises(PermissionError):
        fs.open("/data/new", "wb")


def test_pandas_reads_a_csv_inside_an_image(image):
    pd = pytest.importorskip("pandas")
    df = pd.read_csv("btrfs:///data/x.csv", storage_options={"image": image})
    assert df.to_dict("list") == {"a": [1, 3], "b": [2, 4]}


def test_get_copies_out(image, tmp_path):
    fs = fsspec.filesystem("btrfs", image=image)
    fs.get("/data", str(tmp_path / "out"), recursive=True)
    assert (tmp_path / "out" / "x.csv").read_text() == "a,b\n1,2\n3,4\n"
    assert (tmp_path / "out" / "sub" / "blob").read_bytes() == bytes(range(256)) * 4096


# fsspec's own abstract suite, the part that applies to a read-only filesystem: `get`
# (copying out of the image). Its fixtures build their trees through the filesystem under
# test; here they are written into the image by oleo, which the read-only fsspec view
# then reopens.
abstract = pytest.importorskip("fsspec.tests.abstract")


class _Writer:
    """The calls the abstract fixtures make to build a tree, through oleo's writer."""

    def __init__(self, fs):
        self.fs = fs

    def makedirs(self, path, exist_ok=True):
        self.fs.makedirs(path, exist_ok=True)

    def touch(self, path):
        self.pipe(path, b"")

    def pipe(self, path, value):
        parent = path.rsplit("/", 1)[0] or "/"
        self.fs.makedirs(parent, exist_ok=True)
        with self.fs.open(path, "wb") as f:
            f.write(value)


class TestOleoGet(abstract.AbstractFixtures, abstract.AbstractGetTests):
    @pytest.fixture
    def fs(self, tmp_path):
        image = tmp_path / "abstract.img"
        oleo.mkfs(image, 256 << 20)
        view = fsspec.filesystem("btrfs", image=str(image), skip_instance_cache=True)
        view._image_path = str(image)
        yield view
        view.fs.close()

    @pytest.fixture
    def fs_join(self):
        import posixpath

        return posixpath.join

    @pytest.fixture
    def fs_path(self):
        return "/base"

    def _build(self, fs, make):
        fs.fs.close()
        with oleo.open(fs._image_path, "w") as w:
            source = make(_Writer(w))
        fs.fs = oleo.open(fs._image_path)
        fs.invalidate_cache()
        return source

    @pytest.fixture
    def fs_bulk_operations_scenario_0(self, fs, fs_join, fs_path):
        return self._build(fs, lambda w: self._bulk_operations_scenario_0(w, fs_join, fs_path))

    @pytest.fixture
    def fs_glob_edge_cases_files(self, fs, fs_join, fs_path):
        return self._build(fs, lambda w: self._glob_edge_cases_files(w, fs_join, fs_path))

    @pytest.fixture
    def fs_dir_and_file_with_same_name_prefix(self, fs, fs_join, fs_path):
        return self._build(
            fs, lambda w: self._dir_and_file_with_same_name_prefix(w, fs_join, fs_path))

    @pytest.fixture
    def fs_10_files_with_hashed_names(self, fs, fs_join, fs_path):
        return self._build(fs, lambda w: self._10_files_with_hashed_names(w, fs_join, fs_path))

    def test_get_directory_recursive(self, fs, fs_join, fs_path, local_fs, local_join,
                                     local_target):
        # The one get test that makes its tree through the filesystem under test: the
        # tree is written by oleo first, and the test's own mkdir and touch find it there.
        self._build(fs, lambda w: w.touch(fs_join(fs_path, "src", "file")))
        fs.mkdir = lambda *args, **kw: None
        fs.touch = lambda *args, **kw: None
        super().test_get_directory_recursive(fs, fs_join, fs_path, local_fs, local_join,
                                             local_target)
