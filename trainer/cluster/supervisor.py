"""The process that supervises one training task: start-up watchdog, prompt cancel and restarts in place.

TensorFlow's cluster join blocks inside the strategy constructor while holding the GIL, and TensorFlow's
coordination service catches SIGTERM for itself, so a training process can neither time out its own join nor be
stopped politely. The task therefore runs as a child of this small process (no TensorFlow in it), which:

- kills the child when the cluster has not formed within the start-up timeout, naming the peers it cannot reach
  (exit 140, restarted in place);
- on SIGTERM or SIGINT stops the child (SIGTERM, then SIGKILL after a short grace) and exits 143 or 130;
- after a retryable failure (137, 138, 140, ...) restarts the child in place, up to `max_restarts` times. With a control
  channel (`Control`) every worker's supervisor publishes its generation, state and latest checkpoint, stops its own
  child as soon as a peer's has failed or a replaced peer has come up, and starts the next generation only when
  every peer answers and none still runs an older one: all workers converge on the same restart instead of joining
  each other's dying clusters. Before each generation they agree on the epoch to resume after
  (`trainer.cluster.resume`); one that lacks that checkpoint fetches it from a peer. Peers that do not answer within
  the start-up timeout end the task (exit 140, not restarted: waiting again does not bring a lost pod back).
- a hand-over of a checkpoint has its own limit instead of the start-up timeout: it fails only after no byte came
  for `handover_stall` seconds (60), resumes after a broken connection where it broke, logs its progress every few
  seconds, and while it runs the peers' start-up watchdogs wait (the fetching supervisor publishes `fetching`);
  a full disk ends it with exit 3 (not restarted: the disk stays full).
"""

from __future__ import annotations

import ctypes
import dataclasses
import itertools
import json
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from trainer.cluster import topology
from trainer.cluster.control import PEER_POLL_SECONDS, STALL_TIMEOUT, Control, State
from trainer.cluster.peers import unreachable
from trainer.cluster.policy import CONTRACT, Decision, Readiness, RestartPolicy
from trainer.cluster.resume import CheckpointHome, agree
from trainer.cluster.topology import tasks
from trainer.core.errors import (
    EXIT_FAILED,
    EXIT_PEER_UNAVAILABLE,
    EXIT_STARTUP_TIMEOUT,
    EXIT_TERMINATED,
    PeerFinishedError,
    PeerUnavailableError,
    StartupTimeoutError,
    StorageFaultError,
    exit_code,
)
from trainer.core.processes import shell_code
from trainer.core.tasks import TaskId

log = logging.getLogger(__name__)

FORMED = b"formed\n"
CONFIG_ENV = "TRAINER_CONFIG"
STATUS_FD_ENV = "TRAINER_STATUS_FD"
SUPERVISOR_PID_ENV = "TRAINER_SUPERVISOR_PID"
RESUME_ENV = "TRAINER_RESUME_EPOCH"
GRACE_SECONDS = 2.0
POLL_SECONDS = 0.2


def report_formed() -> None:
    """Called by the child once its cluster has formed: disarms the supervisor's start-up watchdog."""
    fd = os.environ.get(STATUS_FD_ENV)
    if fd:
        try:
            os.write(int(fd), FORMED)
        except OSError:
            pass


def die_with_supervisor() -> None:
    """Called first thing in the child: it is SIGKILLed when its supervisor dies, so it never outlives it."""
    supervisor = os.environ.get(SUPERVISOR_PID_ENV)
    if not supervisor:
        return
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != int(supervisor):
        os._exit(EXIT_TERMINATED)


class _Stopped(Exception):
    """A signal arrived while the supervisor was busy outside its watch loop (a hand-over)."""


class _Signals:
    """SIGTERM and SIGINT set a flag the supervision loop acts on (this process runs no TensorFlow)."""

    def __init__(self) -> None:
        self.received: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> _Signals:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: object) -> None:
        self.received = signum

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def _stop(child: subprocess.Popen[bytes], grace: float) -> None:
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, None)):
        try:
            os.killpg(child.pid, sig)
        except ProcessLookupError:
            return
        try:
            child.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


@runtime_checkable
class Watch(Protocol):
    """What a task that serves until another is done watches (`trainer.cluster.chief.ChiefWatch`)."""

    def over(self) -> bool:
        """True once the job is over; raises (with its exit code) when it failed."""
        ...


@dataclasses.dataclass(frozen=True)
class SupervisedTask:
    """What a supervisor runs, and by which rules: the data that differs between the trainer and a user's command.

    Attributes:
        command: the task's process's command line.
        env: its environment (TF_CONFIG is added from `tf_config`).
        tf_config: this task's TF_CONFIG dict; None for a single process.
        startup_timeout: seconds the cluster may take to form, per generation.
        restart: which exits restart the process in place, how many times, and whether an exit it does not retry
            asks the peers first (`RestartPolicy.decide`).
        readiness: how the supervisor learns that the cluster formed.
        serves_until: for a process that serves until another task is done (a parameter server of a user's job,
            which never exits on its own): polled once a second; True stops the process and ends the task with exit
            0, an exception stops it and ends the task with the exception's exit code (no restart either way).
    """

    command: Sequence[str]
    env: Mapping[str, str]
    tf_config: Mapping[str, Any] | None
    startup_timeout: float
    restart: RestartPolicy = CONTRACT
    readiness: Readiness = Readiness.REPORTED
    serves_until: Watch | None = None

    @property
    def name(self) -> str:
        """The task as log lines and errors name it (`worker 1`)."""
        return TaskId.of(self.tf_config).name


class Supervisor:
    """Runs a `SupervisedTask` and supervises it (see the module docstring)."""

    def __init__(
        self,
        task: SupervisedTask,
        control: Control | None = None,
        home: CheckpointHome | None = None,
        grace: float = GRACE_SECONDS,
        handover_stall: float = STALL_TIMEOUT,
    ) -> None:
        """Sets up the supervision; `run` does it.

        Args:
            task: what to run, and by which rules.
            control: the control channel the workers' supervisors restart together through.
            home: this task's checkpoints, handed over between supervisors.
            grace: seconds between SIGTERM and SIGKILL when stopping the process.
            handover_stall: seconds a checkpoint hand-over may go without receiving a byte, over every broken
                connection and retry together, before it fails (exit 138). The hand-over has no total deadline.
        """
        self.task = task
        self.control = control
        self.home = home
        self.grace = grace
        self.handover_stall = handover_stall
        self.restarts = 0
        self._ended: int | None = None
        self._waited_for: set[tuple[int, str]] = set()
        self.name = task.name

    def run(self) -> int:
        """Supervises until the task succeeds, fails for good or is stopped; returns the exit code."""
        with _Signals() as signals:
            generation = self.control.first_generation() if self.control else 0
            self.restarts = 0
            while True:
                deadline = time.monotonic() + self.task.startup_timeout
                exited = False
                try:
                    resume, handed_over = self._resume_point(generation, deadline, signals)
                except StartupTimeoutError as err:
                    # A peer that did not come back within the start-up timeout is not brought back by waiting again.
                    print(f"error: {self.name}: {err}", file=sys.stderr, flush=True)
                    return exit_code(err)
                except (PeerUnavailableError, StorageFaultError) as err:
                    print(f"error: {self.name}: {err}", file=sys.stderr, flush=True)
                    code = exit_code(err)
                except PeerFinishedError as err:
                    print(f"error: {self.name}: {err}", file=sys.stderr, flush=True)
                    return EXIT_FAILED
                except _Stopped:
                    code = EXIT_TERMINATED
                else:
                    if handed_over:
                        # The hand-over had its own limit; forming the cluster gets the whole start-up timeout.
                        deadline = time.monotonic() + self.task.startup_timeout
                    code, exited = self._attempt(generation, signals, resume, deadline)
                decision, code = self._decide(code, exited, generation, signals)
                if decision is not Decision.RESTART:
                    return code
                self.restarts += 1
                nxt = max(generation + 1, self.control.first_generation() if self.control else 0)
                log.info(
                    "%s: restart %d of %d in place (exit code %d); generation %d",
                    self.name,
                    self.restarts,
                    self.task.restart.max_restarts,
                    code,
                    nxt,
                )
                generation = nxt

    def _decide(self, code: int, exited: bool, generation: int, signals: _Signals) -> tuple[Decision, int]:
        """What follows an attempt that ended with `code`, and the task's exit code: the supervisor's one policy.

        A signal ends the task (128 + its number), and so does the end of what it serves until; otherwise the
        task's `RestartPolicy` decides, after asking the peers when it says so and the process itself `exited`
        (a code of 138 when a peer's supervisor reports its own failure, or stops answering, within two seconds).
        The decision is published to the peers (`done` or `failed`).
        """
        decision = self.task.restart.decide(code, self.restarts)
        if decision is Decision.ASK_PEERS:
            if exited and self.control:
                code = self._ask_peers(code, generation)
            decision = self.task.restart.decide(code, self.restarts, peers_asked=True)
        if signals.received is not None:
            return Decision.FAIL, 128 + signals.received
        if self._ended is not None:
            return (Decision.FAIL if self._ended else Decision.SUCCEED), self._ended
        if self.control:
            self.control.set(generation, State.DONE if code == 0 else State.FAILED)
        return decision, code

    def _resume_point(self, generation: int, deadline: float, signals: _Signals) -> tuple[int | None, bool]:
        """With a control channel: waits for the peers and agrees with them on the epoch to resume after.

        A task whose latest checkpoint is older than the agreed one fetches it from a peer first (`_hand_over`).
        Without a control channel (one process, or no restarts) the training process resumes from its own latest
        checkpoint: None.

        Returns:
            The epoch to resume after (None: the process's own latest), and whether a checkpoint was handed over.
        """
        if not self.control:
            return None, False
        self.control.set(generation, State.STARTING)
        peers = self.control.barrier(generation, deadline)
        own = self.home.epoch() if self.home else 0
        epoch, source = agree(own, {a: s.checkpoint for a, s in peers.items()})
        if source and self.home:
            self.control.set(generation, State.FETCHING)
            self._hand_over(epoch, [a for a, s in peers.items() if s.checkpoint == epoch], signals)
        if epoch:
            how = f"handed over by {source}" if source else "its own"
            log.info("%s: generation %d resumes after epoch %d (checkpoint: %s)", self.name, generation, epoch, how)
        elif generation:
            log.info(
                "%s: generation %d: no worker holds a checkpoint, so all start again at epoch 1", self.name, generation
            )
        return epoch, bool(source and self.home)

    def _hand_over(self, epoch: int, sources: Sequence[str], signals: _Signals) -> None:
        """Receives the checkpoint of `epoch` from one of `sources`, resuming after every broken connection.

        Its limit is its own, not the start-up timeout: it fails (PeerUnavailableError, 138) only once no byte has
        arrived for `handover_stall` seconds, however long the whole takes. Progress lines every few seconds.

        Raises:
            PeerUnavailableError: no byte for `handover_stall` seconds.
            NoSpaceError: the home's disk cannot take it (exit 3, not restarted).
            _Stopped: SIGTERM or SIGINT arrived.
        """
        assert self.control and self.home

        def check() -> None:
            if signals.received is not None:
                raise _Stopped

        handover = self.home.hand_over(epoch, self.name, check)
        for attempt in itertools.count():
            source = sources[attempt % len(sources)]
            offset, prefix = handover.resume_point()
            log.info(
                "%s: fetching the checkpoint of epoch %d from the supervisor at %s%s",
                self.name,
                epoch,
                source,
                f" from byte {offset} on (kept from a broken transfer)" if offset else "",
            )
            try:
                self.control.fetch(source, epoch, handover.receive, (offset, prefix), self.handover_stall)
                return
            except PeerUnavailableError as err:
                idle = time.monotonic() - handover.last_byte
                if idle >= self.handover_stall:
                    raise PeerUnavailableError(
                        f"the hand-over of the checkpoint of epoch {epoch} stalled: no byte for {idle:.0f}s "
                        f"(limit {self.handover_stall:g}s) after {handover.received} bytes; last: {err}"
                    ) from None
                log.warning("%s: %s; resuming the hand-over", self.name, err)
            retry = time.monotonic() + PEER_POLL_SECONDS
            while time.monotonic() < retry:
                check()
                time.sleep(POLL_SECONDS)

    def _attempt(self, generation: int, signals: _Signals, resume: int | None, deadline: float) -> tuple[int, bool]:
        """Runs one generation's process; its code, and whether the process exited by itself."""
        read_fd, write_fd = os.pipe()
        env = dict(self.task.env, **{STATUS_FD_ENV: str(write_fd), SUPERVISOR_PID_ENV: str(os.getpid())})
        if self.task.tf_config:
            env["TF_CONFIG"] = json.dumps(dict(self.task.tf_config))
        if resume is not None:
            env[RESUME_ENV] = str(resume)
        child = subprocess.Popen(list(self.task.command), env=env, pass_fds=(write_fd,), start_new_session=True)
        os.close(write_fd)
        if self.control:
            self.control.set(generation, State.RUNNING)
        try:
            return self._watch(child, read_fd, generation, signals, deadline)
        finally:
            os.close(read_fd)
            if child.poll() is None:
                _stop(child, self.grace)

    def _watch(
        self, child: subprocess.Popen[bytes], read_fd: int, generation: int, signals: _Signals, deadline: float
    ) -> tuple[int, bool]:
        formed = self.task.tf_config is None
        probed = self.task.readiness is not Readiness.REPORTED
        next_peer_check = time.monotonic() + PEER_POLL_SECONDS
        next_formed_check = next_over_check = time.monotonic()
        while True:
            code = child.poll()
            if code is not None:
                return shell_code(code), True
            if signals.received is not None:
                log.info("%s: received signal %d; stopping the training process", self.name, signals.received)
                _stop(child, self.grace)
                return EXIT_TERMINATED, False
            if self.task.serves_until is not None and time.monotonic() >= next_over_check:
                next_over_check = time.monotonic() + PEER_POLL_SECONDS
                self._ended = self._over(self.task.serves_until)
                if self._ended is not None:
                    _stop(child, self.grace)
                    return self._ended, False
            ready, _, _ = select.select([read_fd], [], [], POLL_SECONDS)
            now = time.monotonic()
            reported = ready and os.read(read_fd, 64).startswith(FORMED)
            if not formed and probed and now >= next_formed_check:
                next_formed_check = now + PEER_POLL_SECONDS
                reported = self._probe()
            if reported and not formed:
                formed = True
                if self.control:
                    self.control.set(generation, State.FORMED)
            if not formed and now > deadline and self._handing_over(generation, refresh=True):
                deadline = now + self.task.startup_timeout
            if not formed and now > deadline:
                self._startup_timeout()
                _stop(child, 0)
                return EXIT_STARTUP_TIMEOUT, False
            if self.control and now >= next_peer_check:
                next_peer_check = now + PEER_POLL_SECONDS
                peer = self.control.failed_peer(generation)
                if not formed and self._handing_over(generation):
                    deadline = max(deadline, now + self.task.startup_timeout)
                if peer:
                    print(
                        f"error: {self.name}: the supervisor at {peer} reports its training process failed or "
                        "restarted; stopping this one to restart together",
                        file=sys.stderr,
                        flush=True,
                    )
                    _stop(child, self.grace)
                    return EXIT_PEER_UNAVAILABLE, False

    def _probe(self) -> bool:
        """Whether the cluster formed, for a process that does not say so (`Readiness.PROBED`, `AT_START`)."""
        if self.task.readiness is Readiness.AT_START or not self.task.tf_config:
            return True
        training = [t for t in tasks(self.task.tf_config["cluster"]) if t.job != "evaluator"]
        return not unreachable(training)

    def _handing_over(self, generation: int, refresh: bool = False) -> bool:
        """Whether a peer is receiving a checkpoint for this generation.

        Such a peer joins once it has it, so the start-up watchdog counts from then. With `refresh` the peers are
        asked now rather than going by their last answers.
        """
        if not self.control:
            return False
        if refresh:
            self.control.peer_states()
        peer = self.control.fetching_peer(generation)
        if peer and (generation, peer) not in self._waited_for:
            self._waited_for.add((generation, peer))
            log.info(
                "%s: the supervisor at %s is receiving a checkpoint; the start-up watchdog waits for it",
                self.name,
                peer,
            )
        return peer is not None

    def _over(self, watch: Watch) -> int | None:
        """The task's exit code once `watch` says the job is over (0) or raises (its code); None meanwhile."""
        try:
            return 0 if watch.over() else None
        except Exception as err:
            print(f"error: {err}", file=sys.stderr, flush=True)
            return exit_code(err)

    def _ask_peers(self, code: int, generation: int) -> int:
        """138 when, within two seconds, a peer's supervisor reports its own failure or stops answering; else `code`."""
        assert self.control
        deadline = time.monotonic() + 2 * PEER_POLL_SECONDS
        while (peer := self.control.lost_peer(generation)) is None and time.monotonic() < deadline:
            time.sleep(POLL_SECONDS)
        if peer is None:
            return code
        print(
            f"error: {self.name}: the training process exited with code {code} while the supervisor at {peer} "
            "reports its own failed or does not answer: a lost peer; restarting together",
            file=sys.stderr,
            flush=True,
        )
        return EXIT_PEER_UNAVAILABLE

    def _startup_timeout(self) -> None:
        peers = topology.peers(self.task.tf_config) if self.task.tf_config else []
        missing = unreachable(peers)
        if missing:
            detail = "unreachable: " + "; ".join(missing)
        else:
            detail = (
                "every peer accepts connections but the cluster did not form ("
                + ", ".join(task.address for task in peers)
                + ")"
            )
        print(
            f"error: {self.name}: cluster start-up did not finish within {self.task.startup_timeout:g}s; {detail}",
            file=sys.stderr,
            flush=True,
        )
