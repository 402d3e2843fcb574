#!/usr/bin/env python3
"""fdatasync latency of small appends, with and without reserved blocks.

Each mode appends 1,100-byte records to a fresh file in the given directory,
each followed by fdatasync, 0.2 ms apart (like commit rounds at about 5,000
msg/s), and prints percentiles:
  append   plain appends: every commit grows the file (size is metadata)
  keep     blocks reserved 4 MiB ahead with FALLOC_FL_KEEP_SIZE (size still grows)
  reserve  blocks reserved 4 MiB ahead with plain fallocate (size grows 4 MiB at
           a time; most commits flush data only)
  zeroed   the whole file written with zeros and synced before the timed part:
           every commit overwrites blocks already written (a pure data flush)
  ahead    a second thread keeps 1-2 MiB of zeros written and synced ahead of
           the appends (what a broker would have to do to get `zeroed` on a
           live log: its syncs share the disk with the timed ones)

    python3 bench/fsync_reserve.py /path/on/the/data/disk append keep reserve
"""
import ctypes
import os
import sys
import threading
import time

LIBC = ctypes.CDLL("libc.so.6", use_errno=True)
CHUNK = 4 << 20
RECORD = b"x" * 1100


def fallocate(fd, mode, offset, length):
    if LIBC.fallocate(fd, mode, ctypes.c_longlong(offset), ctypes.c_longlong(length)) != 0:
        raise OSError(ctypes.get_errno(), "fallocate")


class ZeroAhead:
    """Zero-fills and syncs 1 MiB at a time while fewer than 2 MiB lie
    ahead of the write position; the timed appends start once 2 MiB do."""

    STEP = 1 << 20

    def __init__(self, fd, position):
        self.fd, self.position, self.zeroed, self.done = fd, position, 0, False
        self.thread = threading.Thread(target=self.work)
        self.thread.start()
        while self.zeroed < 2 * self.STEP:
            time.sleep(0.001)

    def work(self):
        zeros = bytes(self.STEP)
        while not self.done:
            if self.zeroed - self.position() < 2 * self.STEP:
                os.pwrite(self.fd, zeros, self.zeroed)
                os.fdatasync(self.fd)
                self.zeroed += self.STEP
            else:
                time.sleep(0.001)

    def stop(self):
        self.done = True
        self.thread.join()


def run(directory, mode, n=4000):
    path = os.path.join(directory, f"fsync-{mode}.dat")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    took, offset, reserved = [], 0, 0
    if mode == "zeroed":
        zeros = bytes(CHUNK)
        total = n * len(RECORD)
        while reserved < total:
            os.pwrite(fd, zeros, reserved)
            reserved += CHUNK
        os.fsync(fd)
    ahead = None
    if mode == "ahead":
        ahead = ZeroAhead(fd, lambda: offset)
    try:
        for _ in range(n):
            started = time.perf_counter()
            if mode in ("keep", "reserve") and offset + len(RECORD) > reserved:
                fallocate(fd, 1 if mode == "keep" else 0, reserved, CHUNK)
                reserved += CHUNK
            os.pwrite(fd, RECORD, offset)
            offset += len(RECORD)
            os.fdatasync(fd)
            took.append(time.perf_counter() - started)
            time.sleep(0.0002)
    finally:
        if ahead:
            ahead.stop()
        os.close(fd)
        os.unlink(path)
    took.sort()
    q = lambda p: took[int(p * len(took)) - 1] * 1e3
    print(f"{mode:8} p50 {q(.5):.3f}  p90 {q(.9):.3f}  p99 {q(.99):.3f}  "
          f"p99.9 {q(.999):.3f}  max {took[-1] * 1e3:.3f} ms", flush=True)


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    for m in sys.argv[2:]:
        run(sys.argv[1], m)
