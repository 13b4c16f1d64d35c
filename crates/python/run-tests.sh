#!/usr/bin/env bash
# The Python binding's tests as a user meets the package: a fresh venv, `pip install` of
# this directory (maturin builds the wheel from the Rust crate), then pytest. Tests that
# need root and kernel btrfs skip elsewhere and fail under CI=true.
# OLEO_PY_SEEDS=1,2,... gives test_write's random sequences other seeds.
set -euo pipefail
cd "$(dirname "$0")"
python=${PYTHON:-/usr/bin/python3}
venv=$(mktemp -d /tmp/oleo-py-venv.XXXXXX)
trap 'rm -rf "$venv"' EXIT
"$python" -m venv "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check --upgrade pip
# pandas only for the test that reads a CSV through fsspec, as the README's example does.
"$venv/bin/pip" install -q --disable-pip-version-check ".[test]" pandas
# The wheel, not this directory's sources, is what the tests import.
cd tests
"$venv/bin/python" -c 'import oleo, sys; print("oleo", oleo.__version__, "from", oleo.__file__, "on Python", sys.version.split()[0])'
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider "$@" .
