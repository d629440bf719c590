"""Data at scale: a generated 2 GB dataset, trained on by 2 workers from memory, streamed from disk and from S3.

    python bench/scale.py            # 78,000 training images of 96x96x3 (2.16 GB of TFRecords), 1,000 test images
    python bench/scale.py --quick    # 7,800 training images (216 MB)

The dataset (`generate`, seeded, nothing downloaded): 10 classes, each a sinusoidal grating of its own angle and
frequency in its own colour, with a random phase and contrast and Gaussian noise; written as 128 training shards by
the project's own writers (`trainer.data.writers`), once on local disk and once straight into moto's S3 server (a
real S3 API on loopback, standing in for KFP's SeaweedFS) as `trainer-prepare --data-uri` writes it.

Three kinds of run of 2 workers (`trainer-launch`, each pinned to a core), the same seed, model
(`bench/scale_model.py`, a small CNN, so the input decides the pace) and 2 epochs, each a whole pass over the worker's
share (in memory and streamed from disk `ROUNDS` times, taking turns to go first, their medians compared: one run
of either varies by a third from the next on this shared machine):

- in memory: the local dataset with the machine's memory; each worker caches its share in memory;
- streamed from disk: the local dataset, `TRAINER_MEMORY_LIMIT` half a share and `TRAINER_DISK_LIMIT` 1 byte, so
  each worker reads its share from the files every epoch;
- streamed from S3: the same limits, the dataset in the S3 server, read through fsspec (`trainer.data.streamed`).

Then one worker alone for one epoch, its share the whole dataset: in memory, and streamed from S3 with a limit of
half the dataset (TensorFlow's own ~0.6 GB of memory is more than half of a 2-worker share, so only a share this
large shows a limit twice exceeded by the data and not by TensorFlow).

Per worker, sampled from /proc every 0.2 s: peak RSS of its processes (the supervisor and the training process, as a
pod holds them), bytes read (from S3: what the worker's reader fetched, which `tests/test_data_store.py` checks
against the bytes on the wire; from disk: `rchar`, every byte its processes read), the largest its temporary
directory grew to (a file cache would be there), and time to the first step; examples/s in epoch 2; the test accuracy
of each run's model. For the runs from S3, the CPU time moto's server took meanwhile (from /proc: it serves on the
same cores); and, alone, what a ranged read costs this process (the workers' reader, `trainer.data.streamed`) and
the server, per GB, at `REQUEST_BYTES` a request: the bytes a request takes are set by how many files a worker has
open at once (`trainer.data.streamed.read_bytes`). Writes bench/results/scale-<mode>.json; `bench/run.py` runs
`measure` as its section.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.measure import ROOT, bench_env, run_alone  # noqa: E402 - the project's root must be importable first

TRAIN_EXAMPLES = {"full": 78_000, "quick": 7_800}
TEST_EXAMPLES = 1_000
SHAPE = (96, 96, 3)
CLASSES = 10
SHARDS = 128
SEED = 2026
BATCH = 64
EPOCHS = 2
MODEL_FN = "bench.scale_model:small_cnn"
BUCKET = "models"
GOALS = {"bytes_share": 0.55, "streamed_rate": 0.9, "accuracy_gap": 0.01}
ROUNDS = 3
REQUEST_BYTES = (256 << 10, 1 << 20, 4 << 20)
REQUEST_FILES = 4


def _images(seed: int, first: int, count: int) -> tuple:
    """Examples `first` to `first + count` of a split: images `[count, 96, 96, 3]` uint8, labels `[count]` int64."""
    import numpy as np

    rng = np.random.default_rng([seed, first])
    labels = rng.integers(0, CLASSES, count)
    size = SHAPE[0]
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) / size
    angle = labels * (np.pi / CLASSES)
    frequency = 3.0 + 1.5 * (labels % 4)
    phase = rng.uniform(0, 2 * np.pi, count)
    along = xx[None] * np.cos(angle)[:, None, None] + yy[None] * np.sin(angle)[:, None, None]
    wave = np.sin(2 * np.pi * frequency[:, None, None] * along + phase[:, None, None]).astype(np.float32)
    palette = np.random.default_rng(SEED).uniform(0.3, 1.0, (CLASSES, 3)).astype(np.float32)
    contrast = rng.uniform(0.4, 1.0, count).astype(np.float32)
    pattern = wave[..., None] * (contrast[:, None, None, None] * palette[labels][:, None, None, :])
    noise = rng.normal(0.0, 30.0, (count, *SHAPE)).astype(np.float32)
    return np.clip(128 + 100 * pattern + noise, 0, 255).astype(np.uint8), labels.astype(np.int64)


def _chunks(seed: int, count: int):
    """A split's examples in order, in chunks of 256 generated at once (each chunk seeded by its first index)."""
    for first in range(0, count, 256):
        yield _images(seed, first, min(256, count - first))


def generate(place, train: int, workers: int = 2):
    """Writes the dataset's shards and metadata.json at `place` (a `trainer.data.place.Place`); returns the metadata."""
    from trainer.data.writers import SplitSource, write_splits
    from trainer.records.dataset import DatasetMetadata

    sources = [
        SplitSource("train", _chunks(SEED, train), train, SHARDS),
        SplitSource("test", _chunks(SEED + 1, TEST_EXAMPLES), TEST_EXAMPLES, 1),
    ]
    splits = write_splits(place, sources, workers)
    names = [f"class-{i}" for i in range(CLASSES)]
    meta = DatasetMetadata.of_images("bench/scale.py gratings", SHAPE, names, splits)
    if not place.native:
        meta = meta.placed(place.base, place.endpoint)
    place.location().write_json(meta.to_json(), DatasetMetadata.FILE)
    return meta


class Sampler:
    """Samples the process tree under `root` every 0.2 s, per worker (a child of the launcher).

    Its processes' summed RSS and `rchar` (the peaks: a process that reaps a child adds the child's `rchar` to its
    own, so a sum over the processes alive at one moment counts every byte once), and the size of `tmp` (the peak).
    A worker's rank is its place among the launcher's first `workers` children by process id, fixed
    when they are first seen: once one has ended, the others keep theirs.
    """

    def __init__(self, root: int, tmp: Path, workers: int) -> None:
        self.root, self.tmp, self.workers = root, tmp, workers
        self.ranks: dict[int, int] = {}
        self.peak_rss: dict[int, int] = {}
        self.peak_anon: dict[int, int] = {}
        self.rchar: dict[int, int] = {}
        self.peak_disk = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            parents = {}
            for entry in os.scandir("/proc"):
                if entry.name.isdigit():
                    try:
                        stat = Path(f"/proc/{entry.name}/stat").read_text()
                        parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
                    except (OSError, ValueError, IndexError):
                        continue
            children = sorted(pid for pid, parent in parents.items() if parent == self.root)
            if not self.ranks and len(children) >= self.workers:
                self.ranks = {pid: rank for rank, pid in enumerate(children[: self.workers])}
            for worker, rank in self.ranks.items():
                if worker not in parents:
                    continue
                tree, frontier = {worker}, [worker]
                while frontier:
                    children = [pid for pid, parent in parents.items() if parent in frontier]
                    tree.update(children)
                    frontier = children
                rss = anon = read = 0
                for pid in tree:
                    resident = _resident(pid)
                    rss, anon = rss + resident.get("VmRSS", 0), anon + resident.get("RssAnon", 0)
                    read += _rchar(pid) or 0
                self.rchar[rank] = max(self.rchar.get(rank, 0), read)
                self.peak_rss[rank] = max(self.peak_rss.get(rank, 0), rss)
                self.peak_anon[rank] = max(self.peak_anon.get(rank, 0), anon)
            self.peak_disk = max(self.peak_disk, _tree_bytes(self.tmp))
            self.samples += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def _resident(pid: int) -> dict[str, int]:
    """A process's resident memory in bytes: `VmRSS` (all of it) and `RssAnon` (what is not a mapped file's)."""
    found = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon"):
                found[key] = int(value.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return found


def _rchar(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/io").read_text().splitlines():
            if line.startswith("rchar:"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def _tree_bytes(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                continue
    return total


def cpu_seconds(pid: int) -> float:
    """The user and system CPU time process `pid` has used so far (its own threads', from /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def ranged_reads(place, names: list[str], store: int) -> dict:
    """CPU seconds per GB of this process and of the store's server, reading `names`'s records at each request size."""
    from trainer.data.streamed import file_records

    total = sum(place.size(name) for name in names)
    found = {}
    for size in REQUEST_BYTES:
        store_before, before = cpu_seconds(store), time.process_time()
        for name in names:
            for _ in file_records(place, name, size):
                pass
        found[str(size)] = {
            "reader_cpu_seconds_per_gb": (time.process_time() - before) / total * 1e9,
            "store_cpu_seconds_per_gb": (cpu_seconds(store) - store_before) / total * 1e9,
        }
    return found


def train(
    work: Path, name: str, data: Path, env: dict, workers: int = 2, epochs: int = EPOCHS, store: int | None = None
) -> dict:
    """One run, sampled: its per-worker figures, examples/s in its last epoch and its model's test accuracy.

    `store`: the process id of the object store's server, whose CPU time during the run is counted.
    """
    store_before = cpu_seconds(store) if store else 0.0
    model_dir, tmp = work / name, work / f"{name}-tmp"
    tmp.mkdir(parents=True)
    args = ["--data", str(data), "--model-dir", str(model_dir), "--model-fn", MODEL_FN]
    args += ["--epochs", str(epochs), "--batch-size", str(BATCH), "--shuffle-buffer", "2048"]
    command = [sys.executable, "-m", "trainer.launch", "--workers", str(workers), "--", *args]
    started = time.time()
    proc = subprocess.Popen(
        command, cwd=ROOT, env=bench_env(TMPDIR=str(tmp), **env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    sampler = Sampler(proc.pid, tmp, workers)
    out, _ = proc.communicate(timeout=3600)
    sampler.stop()
    wall = time.time() - started
    store_cpu = cpu_seconds(store) - store_before if store else None
    log = out.decode(errors="replace")
    (work / f"{name}.log").write_text(log)
    if proc.returncode:
        raise SystemExit(f"benchmark step failed ({name}):\n{log[-4000:]}")
    history = json.loads((model_dir / "history.json").read_text())
    evaluated = subprocess.run(
        [sys.executable, "-m", "trainer.evaluate", "--model-dir", str(model_dir), "--data", str(data)]
        + ["--output", str(work / f"{name}-metrics.json")],
        cwd=ROOT,
        env=bench_env(**env),
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if evaluated.returncode:
        raise SystemExit(f"benchmark step failed (evaluating {name}):\n{evaluated.stderr[-3000:]}")
    found = {}
    for rank in range(workers):
        first = re.search(rf"\[worker {rank}\] .*first training step done ([0-9.]+) s after this process", log)
        streamed = re.findall(
            rf"\[worker {rank}\] .*read through fsspec by this process so far: "
            r".*?\((\d+) bytes\), .*?\((\d+) bytes\) counted once",
            log,
        )
        cache = re.search(
            rf"\[worker {rank}\] .*data cache: worker {rank}'s share of the train split: ([^;]+);.*?; (\w+):", log
        )
        found[rank] = {
            "peak_rss_bytes": sampler.peak_rss.get(rank, 0),
            "peak_anonymous_bytes": sampler.peak_anon.get(rank, 0),
            "rchar_bytes": sampler.rchar.get(rank, 0),
            "fetched_bytes": int(streamed[-1][0]) if streamed else 0,
            "distinct_bytes": int(streamed[-1][1]) if streamed else 0,
            "first_step_seconds": float(first.group(1)) if first else None,
            "cache": cache.group(2) if cache else None,
            "share": cache.group(1) if cache else None,
        }
    metrics = json.loads((work / f"{name}-metrics.json").read_text())
    return {
        "workers": found,
        "epochs": epochs,
        "peak_disk_bytes": sampler.peak_disk,
        "wall_seconds": wall,
        "store_cpu_seconds": store_cpu,
        "examples_per_second": history["epochs"][-1]["examples_per_second"],
        "epoch_seconds": [e["seconds"] for e in history["epochs"]],
        "epoch_losses": [e.get("loss") for e in history["epochs"]],
        "accuracy": metrics["metrics"]["accuracy"],
    }


def measure(work: Path, quick: bool = False) -> dict:
    """Generates the dataset on disk and in S3, then the three runs; returns the results."""
    from tests.standins.s3 import S3Server
    from trainer.data.place import Place
    from trainer.data.streamed import read_bytes

    mode = "quick" if quick else "full"
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    train_examples = TRAIN_EXAMPLES[mode]
    local = work / "dataset"
    started = time.perf_counter()
    meta = generate(Place.of(str(local)), train_examples)
    generated = time.perf_counter() - started
    dataset_bytes = sum(f.stat().st_size for f in local.glob("train-*.tfrecord"))
    test_bytes = sum(f.stat().st_size for f in local.glob("test-*.tfrecord"))
    server = S3Server(work)
    before = dict(os.environ)
    try:
        keys = server.publisher.env()
        os.environ.update(keys)  # this process's own reads and writes; put back after (`make bench` goes on)
        started = time.perf_counter()
        generate(Place.of(f"s3://{BUCKET}/scale", server.url), train_examples)
        uploaded = time.perf_counter() - started
        artifact = work / "artifact"
        artifact.mkdir()
        (artifact / "metadata.json").write_text(server.read("scale/metadata.json").decode())
        share = dataset_bytes // 2
        limits = {"TRAINER_MEMORY_LIMIT": str(share // 2), "TRAINER_DISK_LIMIT": "1"}
        alone = {"TRAINER_MEMORY_LIMIT": str(dataset_bytes // 2), "TRAINER_DISK_LIMIT": "1"}
        paired = {"in memory": ("memory", {}), "streamed from disk": ("disk", limits)}
        rounds: dict[str, list[dict]] = {name: [] for name in paired}
        for n in range(ROUNDS):
            for name in list(paired) if n % 2 == 0 else reversed(paired):
                short, env = paired[name]
                rounds[name].append(train(work, f"{short}-round-{n}", local, env))
        store = server.proc.pid
        s3 = Place.of(f"s3://{BUCKET}/scale", server.url)
        requests = ranged_reads(s3, [shard.file for shard in meta.splits["train"].shards[:REQUEST_FILES]], store)
        runs = {name: median_run(found) for name, found in rounds.items()}
        runs["streamed from S3"] = train(work, "s3", artifact, {**limits, **keys}, store=store)
        runs["1 worker in memory"] = train(work, "memory-1", local, {}, workers=1, epochs=1)
        runs["1 worker streamed from S3"] = train(
            work, "s3-1", artifact, {**alone, **keys}, workers=1, epochs=1, store=store
        )
    finally:
        server.stop()
        os.environ.clear()
        os.environ.update(before)
    pairs = {name: runs["1 worker in memory" if name.startswith("1 worker") else "in memory"] for name in runs}
    results = {
        "mode": mode,
        "dataset": {
            "train_examples": train_examples,
            "test_examples": TEST_EXAMPLES,
            "image_shape": list(SHAPE),
            "shards": SHARDS,
            "train_bytes": dataset_bytes,
            "generate_seconds": generated,
            "write_to_s3_seconds": uploaded,
            "sha256_equal": meta.splits == json_splits(artifact),
        },
        "simulated_memory_limit_bytes": {"2 workers": share // 2, "1 worker": dataset_bytes // 2},
        "rounds": ROUNDS,
        "ranged_reads": {
            "files": REQUEST_FILES,
            "file_bytes": (local / meta.splits["train"].shards[0].file).stat().st_size,
            "example_bytes": dataset_bytes / train_examples,
            "by_request_bytes": requests,
            "request_bytes_used": {"2 workers": read_bytes(SHARDS // 2), "1 worker": read_bytes(SHARDS)},
        },
        "runs": runs,
        "goals": GOALS,
    }
    for name, run in runs.items():
        run["rate_vs_memory"] = run["examples_per_second"] / pairs[name]["examples_per_second"]
        run["accuracy_gap"] = abs(run["accuracy"] - pairs[name]["accuracy"])
        losses = [r["epoch_losses"] for r in rounds.get(name, [run])]
        run["same_losses"] = all(found == pairs[name]["epoch_losses"] for found in losses)
        for worker in run["workers"].values():
            worker["distinct_share_of_dataset"] = worker["distinct_bytes"] / (dataset_bytes + test_bytes)
    shutil.rmtree(work, ignore_errors=True)
    return results


def median_run(found: list[dict]) -> dict:
    """The run of median examples/s among rounds of one kind, with every round's rate beside it (in order)."""
    ranked = sorted(found, key=lambda r: r["examples_per_second"])
    return {**ranked[len(ranked) // 2], "rounds_examples_per_second": [r["examples_per_second"] for r in found]}


def json_splits(directory: Path):
    from trainer.records.dataset import DatasetMetadata

    return DatasetMetadata.read(str(directory)).splits


if __name__ == "__main__":
    from bench.report import scale_lines

    run_alone(__doc__, "scale", measure, scale_lines)
