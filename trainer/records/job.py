"""job.json: what the chief of a command-mode run records beside its model, and what publishing reads as lineage."""

from __future__ import annotations

import dataclasses
import os
from typing import Any, ClassVar

from trainer.core.errors import UsageError
from trainer.core.files import read_json, write_json


@dataclasses.dataclass(frozen=True)
class JobRecord:
    """A finished command-mode task: the run, the task, what it ran, and what its chief reported."""

    run_id: str
    task: str
    command: tuple[str, ...]
    image: str
    restarts: int
    metrics: dict[str, float]

    FILE: ClassVar[str] = "job.json"
    METRICS_FILE: ClassVar[str] = "metrics.json"

    @property
    def lineage(self) -> dict[str, Any]:
        """What a published model records of the run that trained it."""
        return {"run_id": self.run_id, "command": list(self.command), "image": self.image, "task": self.task}

    def write(self, directory: str) -> None:
        """Writes job.json into `directory`."""
        write_json(os.path.join(directory, self.FILE), {**dataclasses.asdict(self), "command": list(self.command)})

    @classmethod
    def read(cls, directory: str) -> JobRecord:
        """job.json of a model directory.

        Raises:
            UsageError: the directory holds no job.json, or a broken one.
        """
        path = os.path.join(directory, cls.FILE)
        if not os.path.isfile(path):
            raise UsageError(f"model directory {directory!r} has no {cls.FILE} (written by a command-mode chief)")
        data = read_json(path)
        try:
            return cls(
                str(data["run_id"]),
                str(data["task"]),
                tuple(data["command"]),
                str(data["image"]),
                int(data["restarts"]),
                {str(k): float(v) for k, v in data["metrics"].items()},
            )
        except (KeyError, TypeError, ValueError) as err:
            raise UsageError(f"{path} is not a job record: {err}") from None


def reported_metrics(model_dir: str) -> dict[str, float]:
    """The numbers a user's chief wrote to `$MODEL_DIR/metrics.json` (`{"accuracy": 0.97, ...}`), else none.

    Raises:
        UsageError: the file exists but is not a JSON object of numbers.
    """
    path = os.path.join(model_dir, JobRecord.METRICS_FILE)
    if not os.path.isfile(path):
        return {}
    data = read_json(path)
    if not isinstance(data, dict) or not all(
        isinstance(v, (int, float)) and not isinstance(v, bool) for v in data.values()
    ):
        raise UsageError(f'{path} must be a JSON object of numbers, like {{"accuracy": 0.97}}; got {data!r}')
    return {str(k): float(v) for k, v in data.items()}
