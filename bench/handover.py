"""A checkpoint hand-over between two supervisors' control channels on loopback: whole, and resumed after a break.

    python bench/handover.py                    # 2 GB (2048 MiB), under /tmp; prints and writes the numbers
    python bench/handover.py --size-mib 256 --dir /mnt/volume --out results.json

One home holds a checkpoint of epoch 3 as TensorFlow names it (`ckpt-3.data-00000-of-00001` of random bytes,
`ckpt-3.index`) with its manifest; a second supervisor's channel fetches it (`Control.fetch` into a `HandOver`, as a
replaced worker does): the whole, then again into an empty home with the connection cut at half way and resumed.
Times are wall-clock on this machine; the disk is whatever `--dir` is on (the page cache included). Everything
written is removed at the end.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainer.cluster.control import Control, new_secret  # noqa: E402 - the project's root must be importable first
from trainer.cluster.local_processes import free_ports  # noqa: E402
from trainer.cluster.resume import CheckpointHome  # noqa: E402
from trainer.core.errors import PeerUnavailableError  # noqa: E402

EPOCH = 3
BLOCK = 16 << 20
INDEX_BYTES = 64 << 10


def make_checkpoint(home: CheckpointHome, size: int) -> int:
    """Writes a checkpoint of `size` bytes in all (random data file, random index) and its manifest; returns size."""
    os.makedirs(home.uri, exist_ok=True)
    with open(f"{home.prefix(EPOCH)}.index", "wb") as f:
        f.write(os.urandom(INDEX_BYTES))
    left = size - INDEX_BYTES
    with open(f"{home.prefix(EPOCH)}.data-00000-of-00001", "wb") as f:
        while left:
            block = os.urandom(min(BLOCK, left))
            f.write(block)
            left -= len(block)
    home.commit(EPOCH, [{"epoch": e} for e in range(1, EPOCH + 1)])
    return size


class _Cut:
    """The sender's stream, cut (a reset connection) after `after` bytes."""

    def __init__(self, out: Any, after: int) -> None:
        self.out, self.left = out, after

    def write(self, data: bytes) -> int:
        if len(data) > self.left:
            self.out.write(data[: self.left])
            self.out.flush()
            raise ConnectionResetError("cut by the bench")
        self.left -= len(data)
        return self.out.write(data)

    def flush(self) -> None:
        self.out.flush()


def measure(directory: Path | str, size: int) -> dict[str, Any]:
    """Hands a checkpoint of `size` bytes over twice (whole; cut at half and resumed); returns the numbers."""
    work = Path(directory)
    work.mkdir(parents=True, exist_ok=True)
    source = CheckpointHome(str(work / "source" / "worker-0"))
    secret = new_secret()
    try:
        started = time.perf_counter()
        make_checkpoint(source, size)
        written = time.perf_counter() - started
        cut = {"after": None}

        def send(epoch: int, out: Any, key: bytes, offset: int, prefix: str) -> None:
            after, cut["after"] = cut["after"], None
            source.send(epoch, _Cut(out, after) if after is not None else out, key, offset, prefix)

        ports = free_ports(2)
        sender = Control(ports[0], [], source.epoch, send, secret=secret)
        receiver = Control(ports[1], [f"localhost:{ports[0]}"], secret=secret)
        address = f"localhost:{ports[0]}"
        try:
            whole = CheckpointHome(str(work / "whole" / "worker-1"))
            handover = whole.hand_over(EPOCH, "bench")
            started = time.perf_counter()
            receiver.fetch(address, EPOCH, handover.receive, handover.resume_point())
            whole_seconds = time.perf_counter() - started
            assert whole.epoch() == EPOCH
            whole.clear()

            resumed = CheckpointHome(str(work / "resumed" / "worker-1"))
            handover = resumed.hand_over(EPOCH, "bench")
            cut["after"] = size // 2
            started = time.perf_counter()
            try:
                receiver.fetch(address, EPOCH, handover.receive, handover.resume_point())
                raise AssertionError("the cut transfer finished")
            except PeerUnavailableError as err:
                broken = str(err)
            first_leg = time.perf_counter() - started
            started = time.perf_counter()
            offset, prefix = handover.resume_point()
            hashing = time.perf_counter() - started
            receiver.fetch(address, EPOCH, handover.receive, (offset, prefix))
            second_leg = time.perf_counter() - started
            assert resumed.epoch() == EPOCH and handover.received == size
        finally:
            sender.close()
            receiver.close()
        return {
            "size_bytes": size,
            "write_seconds": written,
            "whole": {"seconds": whole_seconds, "mb_per_s": size / whole_seconds / 1e6},
            "resumed": {
                "broken": broken,
                "first_leg_bytes": offset,
                "first_leg_seconds": first_leg,
                "kept_bytes_rehash_seconds": hashing,
                "second_leg_bytes": size - offset,
                "second_leg_seconds": second_leg,
                "second_leg_mb_per_s": (size - offset) / second_leg / 1e6,
                "total_seconds": first_leg + second_leg,
                "bytes_sent_twice": handover.received - size,
            },
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    """Runs `measure` once; prints the numbers and writes them to `--out` when given."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=2048, help="the checkpoint's size in MiB (default 2048)")
    parser.add_argument("--dir", default=tempfile.gettempdir(), help="where both homes go (default: $TMPDIR)")
    parser.add_argument("--out", default="", help="a JSON file for the numbers")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.size_mib < 1:
        parser.error(f"--size-mib {args.size_mib} is not allowed; allowed: 1 or more")
    results = measure(Path(args.dir) / f"handover-bench-{os.getpid()}", args.size_mib << 20)
    text = json.dumps(results, indent=2)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
