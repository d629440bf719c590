"""`python -m trainer.command.exec CMD ARG...`: becomes CMD, set to die with the supervisor that started it.

A user's command does not call `die_with_supervisor` itself; the kernel's parent-death signal survives `execve`, so
this shim sets it and then replaces itself with the command (no TensorFlow import, a few milliseconds).
"""

import os
import sys

from trainer.cluster.supervisor import die_with_supervisor

# The container's workingDir: the directory the command runs in (KFP cannot set a task's working directory).
WORKDIR_ENV = "TRAINER_WORKDIR"


def main() -> int:
    """Execs argv[1:] after arming the parent-death signal; exits 2 with one line when there is nothing to run."""
    die_with_supervisor()
    command = sys.argv[1:]
    if not command:
        print("error: no command given; usage: python -m trainer.command.exec CMD [ARG...]", file=sys.stderr)
        return 2
    workdir = os.environ.pop(WORKDIR_ENV, "")
    try:
        if workdir:
            os.chdir(workdir)
        os.execvp(command[0], command)
    except OSError as err:
        where = f" in {workdir}" if workdir else ""
        print(f"error: cannot run {command[0]!r}{where}: {err.strerror}", file=sys.stderr)
        return 127
    return 0


if __name__ == "__main__":
    sys.exit(main())
