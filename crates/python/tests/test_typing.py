"""The type stubs: typical uses type-check under mypy --strict, and misuses are caught
(an editor's completion and a type checker read the same stubs)."""

import pathlib
import subprocess
import sys

import pytest

HERE = pathlib.Path(__file__).parent


def mypy(path):
    pytest.importorskip("mypy")
    return subprocess.run([sys.executable, "-m", "mypy", "--strict", "--no-incremental",
                           str(path)], capture_output=True, text=True, cwd=HERE)


def test_typical_uses_type_check():
    r = mypy(HERE / "typed_usage.py")
    assert r.returncode == 0, r.stdout + r.stderr


def test_misuses_are_caught(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import oleo\n"
                   "with oleo.open('x') as fs:\n"
                   "    fs.stat(123)\n"
                   "    fs.open('/x', 'rb').write('text, not bytes')\n"
                   "    fs.no_such_call()\n")
    r = mypy(bad)
    assert r.returncode == 1
    for line in (3, 4, 5):
        assert f"bad.py:{line}: error" in r.stdout, r.stdout
