"""What a supervisor decides after its task's process exits, and when it counts the task's cluster as formed: data.

A `RestartPolicy` is a set of exit codes (and a floor: every code from it on) that restart the task in place, a limit
on how many times, and whether an exit it does not retry may be a lost peer's doing. The contract's policy
(`CONTRACT`, the retryable codes of `trainer.core.errors`) and TFJob's four (`trainer.command.tfjob_spec`) are
instances; `decide` turns an exit code into a `Decision`. `Readiness` says how the supervisor learns that the cluster
formed. No process or TensorFlow here.
"""

from __future__ import annotations

import dataclasses
import enum

from trainer.core.errors import RETRYABLE_EXIT_CODES

# Exit codes are 0 to 255 (`trainer.core.processes.shell_code`): a floor above them retries no code by itself.
_NO_FLOOR = 256


class Decision(enum.Enum):
    """What follows an exit of the task's process."""

    SUCCEED = "succeed"
    """The process succeeded: the task ends with exit 0."""
    RESTART = "restart"
    """A retryable failure with restarts left: the process starts again in place."""
    FAIL = "fail"
    """The task ends with the exit code: not retryable, or no restart left."""
    ASK_PEERS = "ask_peers"
    """Not retryable by itself, but counted as a lost peer (exit 138, decided again) when a peer failed at the same
    time: a user's command that exits 1 with TensorFlow's traceback cannot say that a lost peer made it fail."""

    @property
    def is_final(self) -> bool:
        """Whether the task ends here."""
        return self in (Decision.SUCCEED, Decision.FAIL)


@dataclasses.dataclass(frozen=True)
class RestartPolicy:
    """Which exits of a task's process restart it in place, and how many times.

    Attributes:
        name: as logs and errors name it (`contract`, `Never`, `OnFailure`, `Always`, `ExitCode`).
        codes: exit codes that restart the task.
        from_code: every exit code from this one on restarts the task too (1: any failure; 256: none).
        blame_peers: an exit the policy does not retry asks the peers first (`Decision.ASK_PEERS`).
        max_restarts: restarts in place after retryable exits, over the task's whole life.
    """

    name: str
    codes: frozenset[int] = frozenset()
    from_code: int = _NO_FLOOR
    blame_peers: bool = False
    max_restarts: int = 0

    def retries(self, exit_code: int) -> bool:
        """Whether `exit_code` is one this policy restarts after (restarts left or not)."""
        return exit_code != 0 and (exit_code in self.codes or exit_code >= self.from_code)

    def decide(self, exit_code: int, restarts: int = 0, peers_asked: bool = False) -> Decision:
        """What follows the exit `exit_code` after `restarts` restarts in place.

        Args:
            exit_code: the process's exit code (`shell_code`: 128 + N for signal N).
            restarts: restarts in place so far.
            peers_asked: the peers were asked already (`ASK_PEERS` was decided): a code not retried fails.
        """
        if exit_code == 0:
            return Decision.SUCCEED
        if self.retries(exit_code):
            return Decision.RESTART if restarts < self.max_restarts else Decision.FAIL
        return Decision.ASK_PEERS if self.blame_peers and not peers_asked else Decision.FAIL

    def limited(self, max_restarts: int) -> RestartPolicy:
        """This policy with `max_restarts` restarts in place."""
        return dataclasses.replace(self, max_restarts=max_restarts)


CONTRACT = RestartPolicy("contract", codes=RETRYABLE_EXIT_CODES)
"""This project's own training process: the contract's retryable exit codes (`trainer.core.errors`)."""


class Readiness(enum.Enum):
    """How a supervisor learns that its task's cluster formed, which disarms the start-up watchdog."""

    REPORTED = "reported"
    """The training process says so (`trainer.cluster.supervisor.report_formed`)."""
    PROBED = "probed"
    """Every training task's TensorFlow port accepts connections, probed once a second (a user's command)."""
    AT_START = "at_start"
    """Nothing to wait for: a task outside the training cluster (an Evaluator)."""
