"""Threads: readers at once get every byte right, and a call into the engine lets other
Python threads run (the GIL is let go)."""

import hashlib
import random
import threading
import time

import oleo


def make_files(image, n, size, seed=5):
    rnd = random.Random(seed)
    want = {}
    with oleo.open(image, "w") as fs:
        fs.mkdir("/t")
        for i in range(n):
            data = rnd.randbytes(size + i)
            with fs.open(f"/t/f{i}", "wb") as f:
                f.write(data)
            want[f"/t/f{i}"] = hashlib.sha256(data).hexdigest()
    return want


def test_threads_read_at_once(tmp_image):
    want = make_files(tmp_image, 32, 300_000)
    errors = []
    with oleo.open(tmp_image) as fs:
        def reader(k):
            try:
                for _ in range(3):
                    for path in sorted(want, key=lambda p: hash((p, k))):
                        with fs.open(path, "rb") as f:
                            got = hashlib.sha256(f.read()).hexdigest()
                        if got != want[path]:
                            errors.append((k, path))
            except Exception as e:  # pragma: no cover - reported below
                errors.append((k, repr(e)))
        threads = [threading.Thread(target=reader, args=(k,)) for k in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert errors == []


def test_writers_in_threads(tmp_image):
    with oleo.open(tmp_image, "w") as fs:
        def writer(k):
            fs.mkdir(f"/w{k}")
            for i in range(50):
                with fs.open(f"/w{k}/f{i}", "wb") as f:
                    f.write(bytes([k]) * (1000 * i + 1))
        threads = [threading.Thread(target=writer, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    with oleo.open(tmp_image) as fs:
        for k in range(4):
            for i in range(50):
                assert fs.read_bytes(f"/w{k}/f{i}") == bytes([k]) * (1000 * i + 1)


def test_the_gil_is_let_go_during_a_read(tmp_image):
    size = 256 << 20
    with oleo.open(tmp_image, "w") as fs:
        with fs.open("/big", "wb") as f:
            chunk = random.Random(1).randbytes(1 << 20)
            for _ in range(size >> 20):
                f.write(chunk)
    with oleo.open(tmp_image) as fs:
        raw = fs.open("/big", "rb", buffering=0)
        buf = bytearray(size)
        ticks = []
        done = threading.Event()

        def counter():
            while not done.is_set():
                ticks.append(time.perf_counter())

        t = threading.Thread(target=counter)
        t.start()
        time.sleep(0.05)
        start = time.perf_counter()
        n = raw.readinto(buf)
        end = time.perf_counter()
        done.set()
        t.join()
        raw.close()
    assert n == size
    during = [x for x in ticks if start < x < end]
    # With the GIL held for the whole read the counter could not run at all while it
    # lasted; let go, it runs all along.
    assert end - start > 0.01
    assert len(during) > 100, (len(during), end - start)
