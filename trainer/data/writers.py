"""Writing a prepared dataset's TFRecord shards with several processes: the bytes one process writes, sooner.

How examples reach the processes: this process reads the source once, in order, in chunks of `CHUNK_BYTES`
(`trainer.data.idx.IdxSplit` decompresses as it reads; TFDS streams), cuts each chunk into its shards' examples
(example `i` of a split goes to shard `i % num_shards`, `tfrecords.shard_slices`) and sends every writing process
the examples of its own shards over a pipe of its own. A shard belongs to exactly one process, which writes it from
its first record to its last.

Why this process streams rather than each writer reading the source itself and skipping the others' examples: a
gzip stream (Debian's and the MNIST sites' IDX files) cannot be split, so N readers would each decompress all of
it, N times the reading this process does once; and one reader serves every source alike (IDX files at a path or
a URI, TFDS). Reading is the smaller part of the work: measured here, decompressing Fashion-MNIST takes ~3.6 µs of
a core per example and writing its record ~8 µs (TensorFlow builds and serializes an Example, frames it, the shard
is checksummed), so one reader keeps two writers busy and on 2 cores the three processes share the cores.

Why the bytes are the same whatever the number of processes: a shard's records are its examples in their order in
the source, each serialized deterministically (`trainer.data.tfrecords`); which process writes a shard, and when,
does not enter its bytes. With one process (`prepare_workers` 1, or a small dataset) the same `ShardWriter` writes
every shard here.

Memory: this process holds one chunk at a time, each writer the share of a chunk it is writing, and each pipe up to
`PIPE_BYTES` of shares not yet read: sending waits while a pipe is full, so memory stays the same however large the
dataset.

How many processes: at most `prepare_workers`, and never more than the CPU this process may use
(`trainer.core.cpus.cpu_budget`), the shards of both splits, or one per `MIN_EXAMPLES_PER_PREPARE_WORKER` examples:
each writer starts its own TensorFlow (seconds of a core) before it writes its first record. Processes are spawned,
not forked (TensorFlow is not fork-safe once imported). Shards are dealt out largest first, each to the process with
the fewest examples so far, so the test split's shard is weighed against the training shards.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import pickle
import signal
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from trainer.config.contract import MIN_EXAMPLES_PER_PREPARE_WORKER
from trainer.core.cpus import CpuBudget, cpu_budget
from trainer.core.errors import TaskFailedError, UsageError
from trainer.data.tfrecords import ShardWriter, numbered, shard_slices, split_of, write_chunks
from trainer.records.dataset import Shard, Split

log = logging.getLogger(__name__)

# What a pipe to a writing process may hold (`_widen`).
PIPE_BYTES = 1 << 20
# One shard a process writes: (split, shard index, the split's shard count).
Job = tuple[str, int, int]


@dataclasses.dataclass(frozen=True)
class SplitSource:
    """One split to write: its examples as `(images [k, ...] uint8, labels [k])` chunks in order, how many, shards."""

    name: str
    chunks: Iterable[tuple[np.ndarray, np.ndarray]]
    count: int
    num_shards: int


def shard_sizes(count: int, num_shards: int) -> list[int]:
    """How many of `count` examples each shard gets (example `i` goes to shard `i % num_shards`)."""
    return [count // num_shards + (1 if shard < count % num_shards else 0) for shard in range(num_shards)]


def process_count(requested: int, sources: Sequence[SplitSource], budget: CpuBudget | None = None) -> tuple[int, str]:
    """How many processes write the shards (see the module docstring), and why, for the log."""
    budget = budget or cpu_budget()
    shards = sum(s.num_shards for s in sources)
    examples = sum(s.count for s in sources)
    count = max(1, min(requested, budget.threads, shards, examples // MIN_EXAMPLES_PER_PREPARE_WORKER))
    why = (
        f"prepare_workers {requested}; CPU {budget.describe()}; {shards} shards; {examples} examples, one process "
        f"per {MIN_EXAMPLES_PER_PREPARE_WORKER}"
    )
    return count, why


def deal(sources: Sequence[SplitSource], processes: int) -> list[list[Job]]:
    """The shards each process writes: largest first, each to the process with the fewest examples so far."""
    jobs = [
        ((s.name, shard, s.num_shards), size)
        for s in sources
        for shard, size in enumerate(shard_sizes(s.count, s.num_shards))
    ]
    groups: list[list[Job]] = [[] for _ in range(processes)]
    loads = [0] * processes
    for job, size in sorted(jobs, key=lambda item: -item[1]):
        least = loads.index(min(loads))
        groups[least].append(job)
        loads[least] += size
    return groups


def write_splits(directory: str, sources: Sequence[SplitSource], requested: int) -> dict[str, Split]:
    """Writes every split's shards into `directory` with up to `requested` processes; returns each split's metadata.

    Raises:
        UsageError: a split has no examples, or an example is not what is allowed (from the source's chunks).
    """
    for source in sources:
        if source.count == 0:
            raise UsageError(f"split {source.name!r} has no examples")
    processes, why = process_count(requested, sources)
    log.info("writing %d shards with %d process(es) (%s)", sum(s.num_shards for s in sources), processes, why)
    if processes == 1:
        written = {s.name: write_chunks(directory, s.name, s.chunks, s.num_shards) for s in sources}
    else:
        written = _write_in_processes(directory, sources, deal(sources, processes))
    return {s.name: split_of(s.name, written[s.name]) for s in sources}


def _write_in_processes(
    directory: str, sources: Sequence[SplitSource], groups: list[list[Job]]
) -> dict[str, dict[int, Shard]]:
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    writers: list[_Writer] = []
    try:
        for n, jobs in enumerate(groups):
            writers.append(_Writer(context, directory, jobs, n))
        owner = {(split, shard): n for n, jobs in enumerate(groups) for split, shard, _ in jobs}
        for source in sources:
            for start, images, labels in numbered(source.chunks):
                parcels: dict[int, list[tuple[int, Any, Any]]] = {}
                for shard, shard_images, shard_labels in shard_slices(start, images, labels, source.num_shards):
                    parcels.setdefault(owner[source.name, shard], []).append((shard, shard_images, shard_labels))
                for n, parcel in parcels.items():
                    writers[n].send((source.name, parcel))
        for writer in writers:
            writer.send(None)
        written: dict[str, dict[int, Shard]] = {}
        for writer in writers:
            for split, shards in writer.result().items():
                written.setdefault(split, {}).update(shards)
        return written
    except BaseException:
        for writer in writers:
            writer.stop()
        raise
    finally:
        for writer in writers:
            writer.close()


class _Writer:
    """One spawned process writing its shards, fed over a pipe; it answers once, with its shards or its error."""

    def __init__(self, context: Any, directory: str, jobs: list[Job], number: int) -> None:
        inbox, self._inbox = context.Pipe(duplex=False)
        _widen(self._inbox)
        self._outbox, outbox = context.Pipe(duplex=False)
        self.process = context.Process(
            target=_serve, args=(directory, jobs, inbox, outbox), name=f"shard-writer-{number}", daemon=True
        )
        self.process.start()
        inbox.close()
        outbox.close()

    def send(self, message: Any) -> None:
        """Hands the process its next examples (None: no more).

        Raises:
            the process's own error when it stopped (a UsageError stays one), else RuntimeError with its exit code.
        """
        try:
            self._inbox.send(message)
            return
        except (BrokenPipeError, ConnectionResetError):
            pass
        raise self._failure()  # outside the except: the broken pipe is not the cause (nor a store's fault)

    def result(self) -> dict[str, dict[int, Shard]]:
        """Waits for the process to finish: its shards' metadata by split and shard index."""
        try:
            kind, value = self._outbox.recv()
        except EOFError:
            kind, value = "error", None
        if kind == "error":
            raise value or self._failure()
        return value

    def _failure(self) -> BaseException:
        with contextlib.suppress(EOFError, OSError):
            if self._outbox.poll(10):
                kind, value = self._outbox.recv()
                if kind == "error":
                    return value
        self.process.join(10)
        code = self.process.exitcode
        if code is not None and code < 0:
            # Killed (the OOM killer picks a writer: each holds a TensorFlow): the code a killed step has, 128 + signal.
            return TaskFailedError(
                128 - code, f"{self.process.name} (pid {self.process.pid}) was killed by signal {-code}"
            )
        return RuntimeError(f"{self.process.name} (pid {self.process.pid}) exited with code {code}")

    def stop(self) -> None:
        """Ends the process now (another one failed, or this one was interrupted)."""
        if self.process.is_alive():
            self.process.terminate()

    def close(self) -> None:
        """Waits for the process and closes both pipes."""
        self.process.join()
        self._inbox.close()
        self._outbox.close()


def _widen(connection: Any) -> None:
    """Lets a pipe hold several shares (Linux: up to /proc/sys/fs/pipe-max-size, 1 MiB by default; else as it is).

    With the default 64 KiB the reader and the writers wait on each other in turn: on 2 cores, the writing took
    ~15% longer (measured here).
    """
    with contextlib.suppress(AttributeError, OSError):
        import fcntl

        fcntl.fcntl(connection.fileno(), fcntl.F_SETPIPE_SZ, PIPE_BYTES)


def _serve(directory: str, jobs: list[Job], inbox: Any, outbox: Any) -> None:
    """A writing process: writes each parcel of examples it receives into its shards until None, then answers."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # an interrupt is the parent's to handle; it ends this process
    try:
        shards: dict[tuple[str, int], list[int]] = {}
        for split, shard, num_shards in jobs:
            shards.setdefault((split, num_shards), []).append(shard)
        with contextlib.ExitStack() as stack:
            writers = {
                split: stack.enter_context(ShardWriter(directory, split, indices, num_shards))
                for (split, num_shards), indices in shards.items()
            }
            while (message := inbox.recv()) is not None:
                split, parcel = message
                for shard, images, labels in parcel:
                    writers[split].write(shard, images, labels)
            outbox.send(("done", {split: writer.finish() for split, writer in writers.items()}))
    except EOFError:
        return  # the parent is gone: nobody waits for these shards
    except Exception as err:  # noqa: BLE001 - every failure goes back to the parent, which reports it
        outbox.send(("error", _picklable(err)))


def _picklable(err: Exception) -> Exception:
    """`err` when it survives pickling (its type decides the exit code), else a RuntimeError that says it."""
    try:
        pickle.loads(pickle.dumps(err))
    except Exception:  # noqa: BLE001 - any failure to pickle
        return RuntimeError(f"{type(err).__name__}: {err}")
    return err
