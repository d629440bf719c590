"""Exceptions and exit codes shared by every command-line entry point.

Exit codes follow the convention Kubeflow's TFJob `ExitCode` restart policy reads: codes it treats as
retryable (130, 137, 138, 143) mean "run me again and I may succeed", everything else is permanent.
"""

EXIT_BAD_INPUT = 2
EXIT_FAILED = 1
EXIT_PEER_UNAVAILABLE = 138
RETRYABLE_EXIT_CODES = frozenset({130, 137, 138, 143})


class UsageError(ValueError):
    """Bad input: a value that can never work. Permanent; the message names the value and what is allowed."""


class PeerUnavailableError(RuntimeError):
    """A cluster peer could not be reached or vanished. Retryable: a restart may find it."""


class KubernetesError(RuntimeError):
    """A Kubernetes API call failed; the message names the verb, resource and namespace."""
