"""Fills a read data set: data/seq.bin (incompressible) for seq-read and rand-read,
tree/dNNNN/fNNNNNNN (empty files) for meta-walk.

Runs as a child process (python -m oleobench.populate PATH MIB FILES DIRS) so
that a FUSE daemon that hangs while it is being filled hangs a killable child,
not the harness.
"""

import os
import sys


def populate(path, seq_mib, files, dirs):
    os.makedirs(os.path.join(path, "data"), exist_ok=True)
    with open(os.path.join(path, "data", "seq.bin"), "wb") as f:
        for _ in range(seq_mib):
            f.write(os.urandom(1 << 20))
        f.flush()
        os.fsync(f.fileno())
    if files <= 0:
        return
    per_dir = -(-files // dirs)
    made = 0
    for d in range(dirs):
        dpath = os.path.join(path, "tree", f"d{d:04d}")
        os.makedirs(dpath, exist_ok=True)
        for _ in range(min(per_dir, files - made)):
            os.close(os.open(os.path.join(dpath, f"f{made:07d}"), os.O_CREAT | os.O_WRONLY, 0o644))
            made += 1
    os.sync()


if __name__ == "__main__":
    populate(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
