"""What every runner of local processes needs alike.

Exit codes as a shell reports them, stopping a process group, telling a process's error line from its other lines.
"""

from __future__ import annotations

import os
import re
import subprocess

_UNCAUGHT = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception): ")


def shell_code(code: int) -> int:
    """Exit status as a shell reports it: a process killed by signal N is 128 + N."""
    return 128 - code if code < 0 else code


def signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    """Sends `sig` to the process group `proc` leads (started with `start_new_session`), if it still exists."""
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def is_error_line(line: str) -> bool:
    """Whether a process's output line says why it failed: an `error:` line or an uncaught exception's last line."""
    return line.startswith("error:") or _UNCAUGHT.match(line) is not None


def process_seconds() -> float:
    """Seconds since this process started (Linux's /proc; 0 where it is missing)."""
    try:
        with open("/proc/self/stat") as stat, open("/proc/uptime") as uptime:
            started = int(stat.read().rsplit(")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")
            return float(uptime.read().split()[0]) - started
    except (OSError, ValueError, IndexError):
        return 0.0
