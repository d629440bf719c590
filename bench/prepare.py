"""Preparing in parallel: one source prepared by 1 and by 2 processes on 2 cores, the shards compared byte for byte.

    python bench/prepare.py            # Fashion-MNIST's training images repeated to 2.4 M examples (~2 GB of shards)
    python bench/prepare.py --quick    # repeated to 600 k examples

Each run is the whole command, `python -m trainer.prepare ... --workers N`, pinned to the same 2 cores: both
start Python, read the gzip IDX files once and write the training shards and 1 test shard (the 2-process run from
2 spawned writers fed through shared memory). The source is Debian's Fashion-MNIST (the shipped sample where it is
missing) with its training images repeated, so that the writing outweighs the start of a process. The source
is read once beforehand (into the page cache, as every later run finds it), then 3 rounds of the two runs, the
first of each round taking turns, each run after a `sync` (the previous run's 2 GB written back first); the
medians are compared. Writes
bench/results/prepare-<mode>.json; `bench/run.py` runs `measure` as its section "preparing in parallel".
"""

import filecmp
import gzip
import json
import os
import re
import shutil
import statistics
import struct
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.measure import run, run_alone  # noqa: E402 - the project's root must be importable first

FASHION = "/usr/share/datasets/fashion-mnist"
TRAIN_EXAMPLES = {"full": 2_400_000, "quick": 600_000}
GOAL = 1.7
# Runs of each, 1 and 2 processes taking turns to go first; each count's median is compared (one run of a command
# that writes 2 GB varies by a fifth from the next here).
ROUNDS = 3


def _write_repeated(path, array, count):
    """Writes the IDX file of `array`'s rows repeated to `count` rows, gzip-compressed (level 1: quick to write)."""
    header = struct.pack(">HBB", 0, 8, array.ndim) + struct.pack(f">{array.ndim}I", count, *array.shape[1:])
    with gzip.open(path, "wb", compresslevel=1) as f:
        f.write(header)
        left = count
        while left:
            rows = array[: min(left, len(array))]
            f.write(rows.tobytes())
            left -= len(rows)


def make_source(directory, train_examples):
    """An IDX directory: the origin's training split repeated to `train_examples`, its test split as it is."""
    from trainer.data.idx import SPLIT_FILES, read_split
    from trainer.data.sources import sample_dir

    origin = FASHION if os.path.isdir(FASHION) else sample_dir()
    images, labels = read_split(origin, "train")
    directory.mkdir(parents=True)
    image_stem, label_stem = SPLIT_FILES["train"]
    _write_repeated(directory / f"{image_stem}.gz", images, train_examples)
    _write_repeated(directory / f"{label_stem}.gz", labels, train_examples)
    for stem in SPLIT_FILES["test"]:
        shutil.copy(f"{origin}/{stem}.gz", directory / f"{stem}.gz")
    name = "Fashion-MNIST" if origin == FASHION else "the shipped MNIST sample"
    return f"{name}'s {len(images)} training images repeated to {train_examples}, its test split as it is"


def identical(one, other):
    """Whether two prepared directories hold the same files with the same bytes."""
    names = sorted(os.listdir(one))
    return names == sorted(os.listdir(other)) and all(
        filecmp.cmp(one / name, other / name, shallow=False) for name in names
    )


def measure(work, quick=False):
    """Prepares the same source with `--workers 1` and `--workers 2` on the same 2 cores; returns the results."""
    mode = "quick" if quick else "full"
    if work.exists():
        shutil.rmtree(work)
    cores = set(sorted(os.sched_getaffinity(0))[:2])
    described = make_source(work / "source", TRAIN_EXAMPLES[mode])
    rounds, used = {1: [], 2: []}, {}
    for source_file in (work / "source").iterdir():
        with open(source_file, "rb") as f:
            while f.read(1 << 24):  # into the page cache, as it is for every run after the first
                pass
    for n in range(ROUNDS):
        for processes in (1, 2) if n % 2 == 0 else (2, 1):
            output = work / f"{processes}-process"
            shutil.rmtree(output, ignore_errors=True)
            os.sync()  # the last run's 2 GB written back now, not by the kernel's flusher beside this run
            command = [sys.executable, "-m", "trainer.prepare", "--source", f"idx:{work / 'source'}"]
            result, wall = run([*command, "--output", str(output), "--workers", str(processes)], cpus=cores)
            rounds[processes].append(wall)
            found = re.search(r"with (\d+) process", result.stderr)
            used[processes] = int(found.group(1)) if found else None
    seconds = {processes: statistics.median(walls) for processes, walls in rounds.items()}
    meta = json.loads((work / "1-process" / "metadata.json").read_text())
    same = identical(work / "1-process", work / "2-process")
    shard_bytes = sum(f.stat().st_size for f in (work / "1-process").glob("*.tfrecord"))
    shutil.rmtree(work)
    return {
        "mode": mode,
        "source": described,
        "cores": len(cores),
        "examples": sum(split["num_examples"] for split in meta["splits"].values()),
        "shard_bytes": shard_bytes,
        "processes_used": {str(k): v for k, v in used.items()},
        "seconds": {str(k): v for k, v in seconds.items()},
        "rounds": {str(k): v for k, v in rounds.items()},
        "speedup": seconds[1] / seconds[2],
        "identical": same,
        "goal": GOAL,
    }


if __name__ == "__main__":
    from bench.report import prepare_lines

    run_alone(__doc__, "prepare", measure, prepare_lines)
