"""Writing a prepared dataset's TFRecord shards with several processes: the bytes one process writes, sooner.

How examples reach the processes: this process reads the source once, in order, in chunks of `CHUNK_BYTES`
(`trainer.data.idx.IdxSplit` decompresses as it reads; TFDS streams) and gathers them into pieces of about
`PIECE_BYTES` in free slots of a ring in shared memory (`_Ring`, a file in `/dev/shm` every writer maps); it tells
each writing process that owns shards with examples in a piece (example `i` of a split goes to shard
`i % num_shards`) the slot's number, and the writer serializes its examples straight from there and acknowledges
the slot. A shard belongs to exactly one process, which writes it from its first record to its last. No example is
pickled or sent through a pipe.

Why this process streams rather than each writer reading the source itself and skipping the others' examples: a
gzip stream (Debian's and the MNIST sites' IDX files) cannot be split, so N readers would each decompress all of
it, N times the reading this process does once; and one reader serves every source alike (IDX files at a path or
a URI, TFDS). That one stream bounds the gain: measured here on 2.4 M Fashion-MNIST examples, this process spends
~2 µs of a core per example decompressing (ISA-L's inflate) and copying it into the ring, and the writers ~3.5 µs
serializing, framing and checksumming its record (`trainer.data.framing`, without TensorFlow), all on the same
cores.

Why the bytes are the same whatever the number of processes: a shard's records are its examples in their order in
the source, each serialized deterministically (`trainer.data.tfrecords`); which process writes a shard, and when,
does not enter its bytes. With one process (`prepare_workers` 1, or a small dataset) the same `ShardWriter` writes
every shard here.

Memory: this process holds one chunk at a time and the ring `SLOTS_PER_WRITER` chunks per writer (at most
`RING_BYTES` in all); a writer holds its shards' unsent parts (`trainer.data.place`). Reading waits while every slot
is in use, so memory stays the same however large the dataset.

How many processes: at most `prepare_workers`, and never more than the CPU this process may use
(`trainer.core.cpus.cpu_budget`), the shards of both splits, or one per `MIN_EXAMPLES_PER_PREPARE_WORKER` examples
(a writer's start and the ring's traffic cost more than a few hundred thousand examples' writing saves). Processes
are spawned, not forked (a process that has imported TensorFlow is not fork-safe). Shards are dealt out largest
first, each to the process with the fewest examples so far, so the test split's shard is weighed against the
training shards.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import pickle
import signal
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from trainer.config.contract import MIN_EXAMPLES_PER_PREPARE_WORKER
from trainer.core.cpus import CpuBudget, cpu_budget
from trainer.core.errors import TaskFailedError, UsageError
from trainer.data.place import Place
from trainer.data.tfrecords import ShardWriter, numbered, split_of, write_chunks
from trainer.records.dataset import Shard, Split

log = logging.getLogger(__name__)

# Slots of the shared ring per writing process (`_Ring`), pieces announced and not yet written, the ring's largest
# size (a container's /dev/shm is often 64 MiB) and a piece's images: the source's chunks are gathered into pieces
# of 8 of them, since every piece costs a message to each writer and an answer back (with 128 KiB pieces those were
# a third of the CPU the 2-process prepare spent, most of it in the kernel).
SLOTS_PER_WRITER = 8
RING_BYTES = 16 << 20
PIECE_BYTES = 1 << 20
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


def write_splits(directory: Place | str, sources: Sequence[SplitSource], requested: int) -> dict[str, Split]:
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


class _Ring:
    """`SLOTS_PER_WRITER` slots per writing process in one file in memory (`/dev/shm`), each holding one piece.

    A piece is up to `rows` consecutive examples of a split (about `PIECE_BYTES` of images, at least one image):
    their images, then their labels as int64. The file is
    mapped by this process and by every writer, so a piece travels as its slot's number: no example is pickled or
    copied through a pipe. A slot is free again once each writer it was announced to has acknowledged it.
    """

    def __init__(self, slots: int, image_bytes: int) -> None:
        import mmap
        import shutil
        import tempfile

        self.rows = max(1, PIECE_BYTES // max(1, image_bytes))
        self.image_bytes = image_bytes
        self.slot_bytes = self.rows * (image_bytes + 8)
        slots = max(2, min(slots, RING_BYTES // self.slot_bytes))
        directory = None  # the temporary directory, where /dev/shm is missing, read-only or short of room
        with contextlib.suppress(OSError):
            if os.access("/dev/shm", os.W_OK) and shutil.disk_usage("/dev/shm").free > 2 * slots * self.slot_bytes:
                directory = "/dev/shm"
        handle, self.path = tempfile.mkstemp(prefix="trainer-prepare-", dir=directory)
        try:
            os.ftruncate(handle, slots * self.slot_bytes)
            self._map = mmap.mmap(handle, slots * self.slot_bytes)
        finally:
            os.close(handle)
        self.free = list(range(slots))
        self.waiting: dict[int, int] = {}

    @property
    def layout(self) -> tuple[int, int, int]:
        """What a writer needs to find a piece: rows per slot, bytes per image, bytes per slot."""
        return self.rows, self.image_bytes, self.slot_bytes

    def put(self, slot: int, row: int, images: np.ndarray, labels: np.ndarray) -> None:
        """Copies examples into `slot` from its row `row` on."""
        at = slot * self.slot_bytes + row * self.image_bytes
        count = len(labels)
        self._map[at : at + count * self.image_bytes] = memoryview(np.ascontiguousarray(images, np.uint8)).cast("B")
        labels_at = slot * self.slot_bytes + self.rows * self.image_bytes + row * 8
        self._map[labels_at : labels_at + count * 8] = memoryview(np.ascontiguousarray(labels, np.int64)).cast("B")

    def release(self, slots: list[int]) -> None:
        """Counts one acknowledgement for each of `slots`; a slot every writer has acknowledged is free again."""
        for slot in slots:
            self.waiting[slot] -= 1
            if self.waiting[slot] == 0:
                del self.waiting[slot]
                self.free.append(slot)

    def close(self) -> None:
        """Unmaps and removes the file (the writers' own mappings end with them)."""
        self._map.close()
        with contextlib.suppress(OSError):
            os.remove(self.path)


def _piece(view: Any, layout: tuple[int, int, int], slot: int, count: int, shape: tuple[int, ...]) -> tuple[Any, Any]:
    """A piece of `count` examples in `slot` of a ring mapped as `view`: `(images [count, *shape], labels)`."""
    rows, image_bytes, slot_bytes = layout
    at = slot * slot_bytes
    images = np.frombuffer(view, np.uint8, count * image_bytes, at).reshape(count, *shape)
    labels = np.frombuffer(view, np.int64, count, at + rows * image_bytes)
    return images, labels


def _write_in_processes(
    directory: Place | str, sources: Sequence[SplitSource], groups: list[list[Job]]
) -> dict[str, dict[int, Shard]]:
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    writers: list[_Writer] = []
    ring: _Ring | None = None
    try:
        owner = {(split, shard): n for n, jobs in enumerate(groups) for split, shard, _ in jobs}
        for source in sources:
            piece: _Piece | None = None
            for start, images, labels in numbered(source.chunks):
                if ring is None:
                    ring = _Ring(SLOTS_PER_WRITER * len(groups), int(np.prod(images.shape[1:], dtype=np.int64)))
                    writers = [_Writer(context, directory, jobs, n, ring) for n, jobs in enumerate(groups)]
                offset = 0
                while offset < len(labels):
                    if piece is None:
                        piece = _Piece(_free_slot(ring, writers), start + offset, tuple(images.shape[1:]))
                    taken = min(ring.rows - piece.count, len(labels) - offset)
                    ring.put(piece.slot, piece.count, images[offset : offset + taken], labels[offset : offset + taken])
                    piece.count += taken
                    offset += taken
                    if piece.count == ring.rows:
                        _announce(ring, writers, owner, source, piece)
                        piece = None
            if piece is not None:
                _announce(ring, writers, owner, source, piece)
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
        if ring is not None:
            ring.close()


@dataclasses.dataclass
class _Piece:
    """Consecutive examples of a split gathered in a slot of the ring: from example `start`, `count` so far."""

    slot: int
    start: int
    shape: tuple[int, ...]
    count: int = 0


def _free_slot(ring: _Ring, writers: list[_Writer]) -> int:
    """A free slot of the ring, waiting for acknowledgements while none is."""
    from multiprocessing.connection import wait

    while not ring.free:
        ready = wait([w.outbox for w in writers])
        for writer in writers:
            if writer.outbox in ready:
                ring.release(writer.acknowledged())
    return ring.free.pop()


def _announce(
    ring: _Ring, writers: list[_Writer], owner: dict[tuple[str, int], int], source: SplitSource, piece: _Piece
) -> None:
    """Tells the writers of the shards with examples in `piece` (example `i` is shard `i % num_shards`'s) of it."""
    shards = (
        range(source.num_shards)
        if piece.count >= source.num_shards
        else {i % source.num_shards for i in range(piece.start, piece.start + piece.count)}
    )
    concerned = sorted({owner[source.name, shard] for shard in shards})
    ring.waiting[piece.slot] = len(concerned)
    message = (source.name, piece.slot, piece.start, piece.count, piece.shape)
    for n in concerned:
        writers[n].send(message)


class _Writer:
    """One spawned process writing its shards: told of pieces in the ring, it acknowledges each, then answers once."""

    def __init__(self, context: Any, directory: Place | str, jobs: list[Job], number: int, ring: _Ring) -> None:
        inbox, self._inbox = context.Pipe(duplex=False)
        self.outbox, outbox = context.Pipe(duplex=False)
        self.process = context.Process(
            target=_serve,
            args=(directory, jobs, inbox, outbox, ring.path, ring.layout),
            name=f"shard-writer-{number}",
            daemon=True,
        )
        self.process.start()
        inbox.close()
        outbox.close()
        self._answer: Any = None

    def send(self, message: Any) -> None:
        """Tells the process of its next piece (None: no more).

        Raises:
            the process's own error when it stopped (a UsageError stays one), else RuntimeError with its exit code.
        """
        try:
            self._inbox.send(message)
            return
        except (BrokenPipeError, ConnectionResetError):
            pass
        raise self._failure()  # outside the except: the broken pipe is not the cause (nor a store's fault)

    def _next(self) -> tuple[str, Any]:
        """The process's next message: `("ack", slot)`, `("done", shards)`; its error is raised.

        Raises:
            the process's own error, else RuntimeError (or TaskFailedError, killed) when it ended without a word.
        """
        try:
            kind, value = self.outbox.recv()
        except EOFError:
            raise self._failure() from None
        if kind == "error":
            raise value
        return kind, value

    def acknowledged(self) -> list[int]:
        """The slots this process has finished with since last asked (its final answer is kept for `result`)."""
        slots = []
        while self._answer is None and self.outbox.poll():
            kind, value = self._next()
            if kind == "ack":
                slots.append(value)
            else:
                self._answer = value
        return slots

    def result(self) -> dict[str, dict[int, Shard]]:
        """Waits for the process to finish: its shards' metadata by split and shard index."""
        while self._answer is None:
            kind, value = self._next()
            if kind != "ack":
                self._answer = value
        return self._answer

    def _failure(self) -> BaseException:
        with contextlib.suppress(EOFError, OSError):
            while self.outbox.poll(10):
                kind, value = self.outbox.recv()
                if kind == "error":
                    return value
        self.process.join(10)
        code = self.process.exitcode
        if code is not None and code < 0:
            # Killed (the OOM killer, an operator): the code a killed step has, 128 + signal.
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
        self.outbox.close()


def _serve(
    directory: Place | str, jobs: list[Job], inbox: Any, outbox: Any, ring: str, layout: tuple[int, int, int]
) -> None:
    """A writing process: writes its examples of each piece it is told of into its shards until None, then answers."""
    import mmap

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # an interrupt is the parent's to handle; it ends this process
    try:
        shards: dict[tuple[str, int], list[int]] = {}
        for split, shard, num_shards in jobs:
            shards.setdefault((split, num_shards), []).append(shard)
        with contextlib.ExitStack() as stack:
            mapped = stack.enter_context(open(ring, "rb"))  # noqa: SIM115 - closed by the stack
            view = stack.enter_context(mmap.mmap(mapped.fileno(), 0, prot=mmap.PROT_READ))
            writers = {
                split: stack.enter_context(ShardWriter(directory, split, indices, num_shards))
                for (split, num_shards), indices in shards.items()
            }
            while (message := inbox.recv()) is not None:
                split, slot, start, count, shape = message
                images, labels = _piece(view, layout, slot, count, shape)
                writers[split].add(start, images, labels)
                del images, labels  # views of the map, which closes with the stack
                outbox.send(("ack", slot))
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
