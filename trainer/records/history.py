"""history.json: what a training run did, epoch by epoch, and what produced it (the lineage a published model carries).

The chief writes it beside its model (`trainer.modeling.export`); evaluation, the report, publishing and the local
runner read it, always through `History.read`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from trainer.core.errors import UsageError
from trainer.core.files import exists, read_json, write_json

if TYPE_CHECKING:
    from trainer.config.contract import TrainConfig
    from trainer.records.dataset import DatasetMetadata


@dataclasses.dataclass(frozen=True)
class History:
    """A training run's history.

    Attributes:
        epochs: one entry per epoch (`epoch`, `seconds`, `elapsed`, `examples_per_second`, `ended_at` (Unix time),
            `checkpoint_seconds` and Keras' logs: `loss`, `accuracy`, with validation `validation_seconds`,
            `val_loss`, `val_accuracy`), resumed epochs included.
        workers: training workers (the chief included).
        strategy: `multi_worker_mirrored` or `parameter_server`.
        global_batch_size: examples per step over all workers.
        steps_per_epoch: steps in one epoch.
        learning_rate: the peak learning rate the optimizer used (after scaling by the worker count).
        dataset: the prepared dataset's source (`sample`, `tfds:mnist`, `fn:...`).
        class_names: the classes, in label order (empty for a dataset from a function).
        image_shape: height, width, channels (empty for a dataset from a function).
        run_id: the pipeline run's id.
        tensorboard: where the run's TensorBoard event files are; empty: none.
        parameters: the main settings (`num_workers`, `epochs`, `batch_size`, `learning_rate` (for a model_fn's
            model, the one it was compiled with), `seed`), the lineage a published model carries.
        parameter_servers: parameter servers (parameter-server strategy); 0 otherwise.
        model_fn: the function that built the model (`package.module:function`); empty: the built-in CNN.
        config: the whole training configuration, group by group (`TrainConfig.to_dict()`); empty in histories
            written before it was recorded.
    """

    epochs: tuple[dict[str, Any], ...]
    workers: int
    strategy: str
    global_batch_size: int
    steps_per_epoch: int
    learning_rate: float
    dataset: str | None
    class_names: tuple[str, ...]
    image_shape: tuple[int, ...]
    run_id: str
    tensorboard: str
    parameters: dict[str, Any]
    parameter_servers: int = 0
    model_fn: str = ""
    config: dict[str, Any] = dataclasses.field(default_factory=dict)

    FILE: ClassVar[str] = "history.json"
    OPTIONAL: ClassVar[tuple[str, ...]] = ("parameter_servers", "model_fn", "config")

    def to_json(self) -> dict[str, Any]:
        """The history as history.json holds it (an optional field only when it is set)."""
        data = dataclasses.asdict(self)
        data.update(epochs=list(self.epochs), class_names=list(self.class_names), image_shape=list(self.image_shape))
        return {k: v for k, v in data.items() if v or k not in self.OPTIONAL}

    @classmethod
    def from_json(cls, data: Mapping[str, Any], where: str = FILE) -> History:
        """The history from history.json's content.

        Raises:
            UsageError: naming `where` and the fields it lacks.
        """
        fields = {f.name for f in dataclasses.fields(cls)}
        required = fields - set(cls.OPTIONAL)
        missing = sorted(required - set(data)) if isinstance(data, Mapping) else sorted(required)
        if missing:
            raise UsageError(f"{where!r} is not a training history: it lacks {', '.join(missing)}")
        values = {k: v for k, v in data.items() if k in fields}
        values.update(
            epochs=tuple(data["epochs"]), class_names=tuple(data["class_names"]), image_shape=tuple(data["image_shape"])
        )
        return cls(**values)

    @property
    def lineage(self) -> dict[str, Any]:
        """What a published model records of the run that trained it."""
        lineage = {
            "run_id": self.run_id,
            "dataset": self.dataset,
            "parameters": dict(self.parameters),
            "model_fn": self.model_fn,
        }
        return {k: v for k, v in lineage.items() if v or k not in self.OPTIONAL}

    def write(self, directory: str) -> None:
        """Writes history.json into `directory` (whole, or not at all)."""
        write_json(f"{directory.rstrip('/')}/{self.FILE}", self.to_json())

    @classmethod
    def read(cls, directory: str) -> History:
        """history.json in a model directory.

        Raises:
            UsageError: the directory holds no history.json, or it is not a training history.
        """
        path = f"{directory.rstrip('/')}/{cls.FILE}"
        if not exists(path):
            raise UsageError(
                f"model directory {directory!r} has no {cls.FILE}; allowed: a directory the trainer's chief wrote "
                "(saved_model/, model.keras, history.json)"
            )
        try:
            data = read_json(path)
        except ValueError as err:
            raise UsageError(f"{path!r} is not valid JSON: {err}") from None
        return cls.from_json(data, path)


def of_run(
    config: TrainConfig,
    meta: DatasetMetadata,
    epochs: list[dict[str, Any]],
    workers: int,
    global_batch: int,
    steps: int,
    learning_rate: float,
    parameter_servers: int = 0,
    recorded_learning_rate: float | None = None,
) -> History:
    """The history of a run of `config` on the dataset `meta` describes, with the whole configuration.

    Args:
        config: the run's `TrainConfig`.
        meta: the prepared dataset's metadata.
        epochs: the epochs' records.
        workers: training workers.
        global_batch: examples per step over all workers.
        steps: steps per epoch.
        learning_rate: the peak learning rate the model trained with.
        parameter_servers: parameter servers (parameter-server strategy).
        recorded_learning_rate: the learning rate the parameters record, as the model's kind says
            (`ModelKind.recorded_learning_rate`); None: the learning_rate setting.
    """
    from trainer.core.runs import run_log_dir

    runtime = config.runtime
    return History(
        epochs=tuple(epochs),
        workers=workers,
        strategy=config.cluster.strategy,
        global_batch_size=global_batch,
        steps_per_epoch=steps,
        learning_rate=learning_rate,
        dataset=meta.source,
        class_names=meta.class_names,
        image_shape=tuple(meta.image_shape or ()),
        run_id=runtime.run_id,
        tensorboard=run_log_dir(runtime.tensorboard_dir, runtime.run_id) if runtime.tensorboard_dir else "",
        parameters={
            "num_workers": workers,
            "epochs": config.optim.epochs,
            "batch_size": config.optim.batch_size,
            "learning_rate": config.optim.learning_rate if recorded_learning_rate is None else recorded_learning_rate,
            "seed": config.data.seed,
        },
        parameter_servers=parameter_servers,
        model_fn=config.model.model_fn,
        config=config.to_dict(),
    )
