"""Exceptions and the one exit-code contract of every command-line entry point and pipeline step.

| code | meaning                                                                   | restarted in place |
| ---- | ------------------------------------------------------------------------- | ------------------ |
| 0    | success                                                                   |                    |
| 1    | anything else (a Kubernetes call refused, an unexpected error)            | no                 |
| 2    | bad input: one `error:` line names the value and what is allowed          | no                 |
| 3    | no space left on a disk or volume the task writes (ENOSPC)                | no                 |
| 4    | storage refused the task's credentials or file permissions                | no                 |
| 5    | a quota of the store or volume is exceeded (EDQUOT, a bucket's quota)     | no                 |
| 137  | killed by SIGKILL (the OOM killer, `kill -9`)                             | yes                |
| 138  | a peer was lost during training                                           | yes                |
| 140  | start-up timeout: the cluster did not form, or a lost peer never came back | watchdog only     |
| 142  | a store stayed throttled or unavailable (503 SlowDown, 429) through retries | yes               |
| 143  | stopped by SIGTERM                                                        | no (it was asked)  |

138, 140 and 142 sit beside the codes a signal gives (128 + N; 10, 12 and 14 are SIGUSR1, SIGUSR2 and SIGALRM, which
nothing sends here), so the retry rules of Kubeflow's old TFJob (`ExitCode`: 128 and above retryable) treat them as
retryable. 3, 4 and 5 stay below 128: a full disk, refused credentials and an exceeded quota are not fixed by a
restart, so TFJob's `ExitCode` policy does not retry them either.
"""

EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_NO_SPACE = 3
EXIT_DENIED = 4
EXIT_QUOTA = 5
EXIT_KILLED = 137
EXIT_PEER_UNAVAILABLE = 138
EXIT_STARTUP_TIMEOUT = 140
EXIT_STORE_UNAVAILABLE = 142
EXIT_TERMINATED = 143
EXIT_INTERRUPTED = 130
RETRYABLE_EXIT_CODES = frozenset(
    {
        EXIT_INTERRUPTED,
        EXIT_KILLED,
        EXIT_PEER_UNAVAILABLE,
        EXIT_STARTUP_TIMEOUT,
        EXIT_STORE_UNAVAILABLE,
        EXIT_TERMINATED,
    }
)


class UsageError(ValueError):
    """Bad input: a value that can never work. Permanent; the message names the value and what is allowed."""


class PeerUnavailableError(RuntimeError):
    """A cluster peer could not be reached or vanished. Retryable: a restart may find it."""


class StartupTimeoutError(RuntimeError):
    """The cluster did not form within the start-up timeout. Retryable: the missing peer may come later."""


class ServiceError(RuntimeError):
    """A remote service (the Kubernetes API, a KFP server, object storage) refused a call or could not be reached."""


class KubernetesError(ServiceError):
    """A Kubernetes API call failed; the message names the verb, resource and namespace."""


class StorageFaultError(ServiceError):
    """A store or a disk failed in a way named by its kind; `code` is the contract's exit code for it."""

    code = EXIT_FAILED


class NoSpaceError(StorageFaultError):
    """No space left on a disk or volume (ENOSPC). Permanent for this pod: a restart writes to the same disk."""

    code = EXIT_NO_SPACE


class DeniedError(StorageFaultError):
    """The store refused the credentials, or a path's permissions refuse this user. Permanent."""

    code = EXIT_DENIED


class QuotaError(StorageFaultError):
    """A quota is exceeded (EDQUOT on a volume, a bucket's or project's storage quota). Permanent."""

    code = EXIT_QUOTA


class StoreUnavailableError(StorageFaultError):
    """The store stayed throttled (S3 503 SlowDown, GCS 429) or unreachable through every retry. Retryable."""

    code = EXIT_STORE_UNAVAILABLE


class PeerFinishedError(RuntimeError):
    """A restart would wait for a peer that already finished successfully. Permanent (exit 1): it never comes back."""


class ChiefFailedError(RuntimeError):
    """Parameter-server mode: the chief reported that training failed (exit 1; the line carries the chief's reason)."""


class TaskFailedError(RuntimeError):
    """A supervised training process failed with `code`; it has written its own `error:` line.

    `reason`, when given, is the `error:` line of a runner whose task failed (its name and code, its own line).
    """

    def __init__(self, code: int, reason: str = "") -> None:
        super().__init__(reason or f"the training process exited with code {code}")
        self.code = code
        self.reason = reason


def exit_code(error: BaseException) -> int:
    """The contract's exit code for an exception raised by a step or a CLI."""
    if isinstance(error, TaskFailedError):
        return error.code
    if isinstance(error, UsageError):
        return EXIT_BAD_INPUT
    if isinstance(error, StorageFaultError):
        return error.code
    if isinstance(error, PeerUnavailableError):
        return EXIT_PEER_UNAVAILABLE
    if isinstance(error, StartupTimeoutError):
        return EXIT_STARTUP_TIMEOUT
    return EXIT_FAILED
