#!/usr/bin/env bash
# Installs what the tests need, then runs every test. Tests that need root, loop devices,
# kernel btrfs or FUSE skip with a message when those are missing, and fail under CI=true.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
export PATH="$HOME/.cargo/bin:$PATH"
cargo build --workspace --all-targets
bash scripts/fuzz.sh 15
cargo test --workspace -- --test-threads=2
