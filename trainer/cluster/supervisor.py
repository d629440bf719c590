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
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from trainer.cluster.control import PEER_POLL_SECONDS, SECRET_ENV, STALL_TIMEOUT, Control, check_secret
from trainer.cluster.peers import unreachable
from trainer.cluster.resume import CheckpointHome, agree
from trainer.cluster.tf_config import peers as peers_of
from trainer.core.errors import (
    EXIT_FAILED,
    EXIT_PEER_UNAVAILABLE,
    EXIT_STARTUP_TIMEOUT,
    EXIT_TERMINATED,
    RETRYABLE_EXIT_CODES,
    PeerFinishedError,
    PeerUnavailableError,
    StartupTimeoutError,
    StorageFaultError,
    exit_code,
)
from trainer.core.processes import shell_code

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


class Supervisor:
    """Runs `command` as the training task described by `tf_config` and supervises it (see the module docstring)."""

    def __init__(
        self,
        command: Sequence[str],
        env: Mapping[str, str],
        tf_config: Mapping[str, Any] | None,
        startup_timeout: float,
        max_restarts: int = 0,
        control: Control | None = None,
        grace: float = GRACE_SECONDS,
        home: CheckpointHome | None = None,
        retryable: Callable[[int], bool] = RETRYABLE_EXIT_CODES.__contains__,
        formed: Callable[[], bool] | None = None,
        blame_peers: bool = False,
        over: Callable[[], bool] | None = None,
        handover_stall: float = STALL_TIMEOUT,
    ) -> None:
        """Sets up the supervision; `run` does it.

        Args:
            command: the training process's command line.
            env: its environment (TF_CONFIG is added from `tf_config`).
            tf_config: this task's TF_CONFIG dict; None for a single process.
            startup_timeout: seconds the cluster may take to form, per generation.
            max_restarts: restarts in place after a retryable exit.
            control: the control channel the workers' supervisors restart together through.
            grace: seconds between SIGTERM and SIGKILL when stopping the child.
            home: this task's checkpoints, handed over between supervisors.
            retryable: which exit codes restart the child (the contract's by default; a user's command follows its
                TFJob restart policy).
            formed: for a child that does not report that the cluster formed (a user's command), whether it has,
                polled once a second (every task's TensorFlow port accepts connections).
            blame_peers: for a child that cannot say that a lost peer made it fail (a user's command exits 1 with
                TensorFlow's traceback): an exit its restart policy would not retry counts as a lost peer (exit 138)
                when, within two seconds, a peer's supervisor reports its own failure or stops answering.
            over: for a child that serves until another task is done (a parameter server of a user's job, which
                never exits on its own): polled once a second; True stops the child and ends the task with exit 0,
                an exception stops it and ends the task with the exception's exit code (no restart either way).
            handover_stall: seconds a checkpoint hand-over may go without receiving a byte, over every broken
                connection and retry together, before it fails (exit 138). The hand-over has no total deadline.
        """
        self.command = list(command)
        self.env = dict(env)
        self.tf_config = tf_config
        self.startup_timeout = startup_timeout
        self.max_restarts = max_restarts
        self.control = control
        self.grace = grace
        self.home = home
        self.retryable = retryable
        self.formed = formed
        self.blame_peers = blame_peers
        self.over = over
        self.handover_stall = handover_stall
        self._ended: int | None = None
        self._waited_for: set[tuple[int, str]] = set()
        task = tf_config["task"] if tf_config else {"type": "worker", "index": 0}
        self.name = f"{task['type']} {task['index']}"

    def run(self) -> int:
        """Supervises until the task succeeds, fails for good or is stopped; returns the exit code."""
        with _Signals() as signals:
            generation = self.control.first_generation() if self.control else 0
            self.restarts = 0
            while True:
                deadline = time.monotonic() + self.startup_timeout
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
                        deadline = time.monotonic() + self.startup_timeout
                    code = self._attempt(generation, signals, resume, deadline)
                if signals.received is not None:
                    return 128 + signals.received
                if self._ended is not None:
                    return self._ended
                if self.control:
                    self.control.set(generation, "done" if code == 0 else "failed")
                if code == 0 or not self.retryable(code) or self.restarts >= self.max_restarts:
                    return code
                self.restarts += 1
                nxt = max(generation + 1, self.control.first_generation() if self.control else 0)
                log.info(
                    "%s: restart %d of %d in place (exit code %d); generation %d",
                    self.name,
                    self.restarts,
                    self.max_restarts,
                    code,
                    nxt,
                )
                generation = nxt

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
        self.control.set(generation, "starting")
        peers = self.control.barrier(generation, deadline)
        own = self.home.epoch() if self.home else 0
        epoch, source = agree(own, {a: s.checkpoint for a, s in peers.items()})
        if source and self.home:
            self.control.set(generation, "fetching")
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

    def _attempt(self, generation: int, signals: _Signals, resume: int | None, deadline: float) -> int:
        read_fd, write_fd = os.pipe()
        env = dict(self.env, **{STATUS_FD_ENV: str(write_fd), SUPERVISOR_PID_ENV: str(os.getpid())})
        if self.tf_config:
            env["TF_CONFIG"] = json.dumps(dict(self.tf_config))
        if resume is not None:
            env[RESUME_ENV] = str(resume)
        child = subprocess.Popen(self.command, env=env, pass_fds=(write_fd,), start_new_session=True)
        os.close(write_fd)
        if self.control:
            self.control.set(generation, "running")
        try:
            return self._watch(child, read_fd, generation, signals, deadline)
        finally:
            os.close(read_fd)
            if child.poll() is None:
                _stop(child, self.grace)

    def _watch(
        self, child: subprocess.Popen[bytes], read_fd: int, generation: int, signals: _Signals, deadline: float
    ) -> int:
        formed = self.tf_config is None
        next_peer_check = time.monotonic() + PEER_POLL_SECONDS
        next_formed_check = next_over_check = time.monotonic()
        while True:
            code = child.poll()
            if code is not None:
                return self._exit(shell_code(code), generation)
            if signals.received is not None:
                log.info("%s: received signal %d; stopping the training process", self.name, signals.received)
                _stop(child, self.grace)
                return EXIT_TERMINATED
            if self.over and time.monotonic() >= next_over_check:
                next_over_check = time.monotonic() + PEER_POLL_SECONDS
                self._ended = self._over()
                if self._ended is not None:
                    _stop(child, self.grace)
                    return self._ended
            ready, _, _ = select.select([read_fd], [], [], POLL_SECONDS)
            now = time.monotonic()
            reported = ready and os.read(read_fd, 64).startswith(FORMED)
            if not formed and self.formed and now >= next_formed_check:
                next_formed_check = now + PEER_POLL_SECONDS
                reported = self.formed()
            if reported and not formed:
                formed = True
                if self.control:
                    self.control.set(generation, "formed")
            if not formed and now > deadline and self._handing_over(generation, refresh=True):
                deadline = now + self.startup_timeout
            if not formed and now > deadline:
                self._startup_timeout()
                _stop(child, 0)
                return EXIT_STARTUP_TIMEOUT
            if self.control and now >= next_peer_check:
                next_peer_check = now + PEER_POLL_SECONDS
                peer = self.control.failed_peer(generation)
                if not formed and self._handing_over(generation):
                    deadline = max(deadline, now + self.startup_timeout)
                if peer:
                    print(
                        f"error: {self.name}: the supervisor at {peer} reports its training process failed or "
                        "restarted; stopping this one to restart together",
                        file=sys.stderr,
                        flush=True,
                    )
                    _stop(child, self.grace)
                    return EXIT_PEER_UNAVAILABLE

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

    def _over(self) -> int | None:
        """The task's exit code once `over` says the job is over (0) or raises (its code); None meanwhile."""
        try:
            return 0 if self.over() else None
        except Exception as err:
            print(f"error: {err}", file=sys.stderr, flush=True)
            return exit_code(err)

    def _exit(self, code: int, generation: int) -> int:
        """The child's exit code, or 138 when `blame_peers` finds a peer lost at the same time (see `__init__`)."""
        if not code or self.retryable(code) or not (self.blame_peers and self.control):
            return code
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
        peers = peers_of(self.tf_config) if self.tf_config else []
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
            f"error: {self.name}: cluster start-up did not finish within {self.startup_timeout:g}s; {detail}",
            file=sys.stderr,
            flush=True,
        )


def supervise(
    config: Any,
    tf_config: Mapping[str, Any],
    control_spec: Mapping[str, Sequence[str]] | None = None,
    env: Mapping[str, str] | None = None,
    secret: str = "",
) -> int:
    """Runs the training task `tf_config` describes in a supervised child process; returns its exit code.

    Args:
        config: the task's `TrainConfig` (handed to the child as JSON).
        tf_config: this task's TF_CONFIG dict.
        control_spec: the supervisors' control addresses, shaped like the cluster; with it (and restarts allowed)
            the workers converge on each restart and agree on the epoch to resume after.
        env: the child's environment (default: this process's).
        secret: the run's control secret (the cluster record's); empty: `TRAINER_CONTROL_SECRET` of `env`, which
            the child does not inherit.

    Raises:
        UsageError: the control channel is needed and no secret of the run is given.
    """
    from trainer.cluster.resume import checkpoint_root, clean_before_training, home_for

    clean_before_training(checkpoint_root(config), config.runtime.run_id, tf_config)
    child_env = dict(os.environ if env is None else env, **{CONFIG_ENV: json.dumps(config.to_dict())})
    secret = secret or child_env.pop(SECRET_ENV, "")
    child_env.pop(SECRET_ENV, None)
    control = None
    home = None
    if control_spec and config.cluster.max_restarts and config.cluster.strategy == "multi_worker_mirrored":
        secret = check_secret(secret, f"the environment variable {SECRET_ENV}")
        home = home_for(config, tf_config)
        control = Control.of_task(control_spec, tf_config, home.epoch, home.send, secret=secret)
    try:
        return Supervisor(
            [sys.executable, "-m", "trainer.training.task"],
            child_env,
            tf_config,
            config.cluster.startup_timeout,
            config.cluster.max_restarts,
            control,
            home=home,
        ).run()
    finally:
        if control:
            control.close()
