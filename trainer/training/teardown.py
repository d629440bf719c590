"""How a multi-worker training process ends without TensorFlow's end-of-input stall.

TensorFlow 2.21 can stall for up to 60 s when an autotuned tf.data iterator is destroyed: its autotuning thread
(`Model::OptimizeLoop`, tensorflow/core/framework/model.cc) is woken by the cancellation callback, re-checks
`CancellationManager::IsCancelled()`, which `StartCancelWithStatus` (xla/tsl/framework/cancellation.cc) sets only
after its callbacks ran, loses that race and sleeps the rest of its period, which doubles up to
`kOptimizationPeriodMaxMs` (60 s). The destructor joins that thread while holding the GIL. Under
MultiWorkerMirroredStrategy every worker's input goes through a `MultiDeviceIterator` whose per-device iterators
take TensorFlow's default (autotuned) options, whatever the dataset's own are: once per `fit`, a worker stalled
after its last epoch for about as long as it had trained, up to a minute (measured: 0 or 19-22 s after a 21 s
`fit`, in about half the runs).

So a training process that is one worker of several keeps its training input's iterators (`Teardown.keep`) and,
once every worker is done (a coordination-service barrier, `Teardown.leave`), leaves with `os._exit`: the iterators
are never destroyed. Leaving together matters: a worker that vanishes without the coordination service's shutdown
is reported as crashed to the others after the heartbeat timeout. The worker of rank 0 (the chief, or worker 0
without one) hosts that service, so it leaves last: each other worker says in the service's key-value store that it
is leaving, and rank 0 waits for all of them (a peer that passed the barrier but cannot answer the service any more
would otherwise see its own barrier fail). A process that failed, or whose peers do not all reach the barrier, ends
the ordinary way.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

BARRIER = "trainer-leave"
LEFT = "trainer-left"


def _kept_dataset(distributed: Any, iterators: list[Any]) -> Any:
    """`distributed` (a `tf.distribute.DistributedDataset`) whose every iterator is also appended to `iterators`."""
    import tensorflow as tf

    class Kept(tf.distribute.DistributedDataset):
        def __init__(self) -> None:
            pass

        def __iter__(self) -> Any:
            iterator = iter(distributed)
            iterators.append(iterator)
            return iterator

        @property
        def element_spec(self) -> Any:
            return distributed.element_spec

        def __getattr__(self, name: str) -> Any:
            return getattr(distributed, name)

    return Kept()


@dataclass
class Teardown:
    """What a training process keeps until it leaves, and how it leaves.

    Attributes:
        barrier_timeout_s: how long a finished worker waits for the others (the chief may still be saving the
            model) before it ends the ordinary way.
        left_timeout_s: how long rank 0 waits, after the barrier, for each other worker to say it is leaving.
        iterators: the training input's iterators, kept alive until the process exits.
        rank: this worker's rank (`trainer.cluster.topology.worker_rank`); rank 0 hosts the coordination service.
        workers: the number of workers.
    """

    barrier_timeout_s: float = 600.0
    left_timeout_s: float = 60.0
    iterators: list[Any] = field(default_factory=list)
    rank: int = 0
    workers: int = 1

    def keep(self, strategy: Any, dataset: Any, rank: int, workers: int) -> Any:
        """`dataset` distributed by `strategy` as `fit` would distribute it; its iterators are kept.

        `rank` and `workers` are this worker's rank and the number of workers (who leaves last).
        """
        self.rank, self.workers = rank, workers
        return _kept_dataset(strategy.experimental_distribute_dataset(dataset), self.iterators)

    def leave(self, code: int, service: Any = None) -> int:
        """Exits with `code` once every worker reached the barrier when iterators are kept and `code` is 0.

        `service` is the coordination service's client (default: TensorFlow's eager context, which is one).
        Returns `code` (the caller exits the ordinary way) when nothing is kept, the process failed, or the
        barrier failed (a peer failed or did not finish within `barrier_timeout_s`).
        """
        if code or not self.iterators:
            return code
        if service is None:
            from tensorflow.python.eager import context

            service = context.context()
        if not self.together(service):
            return code
        log.info("every worker finished: leaving with the training input's %d iterator(s) kept", len(self.iterators))
        atexit._run_exitfuncs()  # what the interpreter's exit runs first (autograph removes its generated files)
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)

    def together(self, service: Any) -> bool:
        """Whether every worker reached the barrier; rank 0 then waits for the others to say they are leaving.

        A worker whose word that it is leaving fails after the barrier still leaves: rank 0 may have read that
        word and left before the service's answer reached it (its connection then reads `Socket closed`).
        """
        try:
            service.wait_at_barrier(BARRIER, int(self.barrier_timeout_s * 1000))
        except Exception as error:  # noqa: BLE001 - any failure of the barrier means: end the ordinary way
            log.warning("not every worker reached the end (%s): this process ends the ordinary way", error)
            return False
        if self.rank:
            try:
                service.set_config_key_value(f"{LEFT}/{self.rank}", "left")
            except Exception as error:  # noqa: BLE001 - every worker passed the barrier: leaving is safe
                log.info("rank 0 did not answer that this worker is leaving (%s): it may have left", error)
            return True
        for rank in range(1, self.workers):
            try:
                service.get_config_key_value(f"{LEFT}/{rank}", int(self.left_timeout_s * 1000))
            except Exception as error:  # noqa: BLE001 - the peer passed the barrier: its work is done
                log.warning("worker %d did not say it is leaving (%s)", rank, error)
        return True
