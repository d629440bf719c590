"""The model-kind interface: everything that differs between the models the trainer trains, behind one interface.

    kind = kinds.choose(config.model)          # trainer.modeling.kinds: BuiltInCnn, or UserModel for a model_fn
    kind.check_settings(strategy=...)          # refusals of settings this kind cannot honour
    kind.check_data(data_dir, meta)            # refusals of a dataset it cannot train on
    reader = kind.reader(data_dir, meta)       # how the dataset is read into (features, label)
    model = kind.build(reader, compiled, gate) # in the strategy's scope; the gate's metric checked first
    kind.signatures(model)                     # the SavedModel's serving signature
    results, sample = kind.evaluate(model_dir, data_dir, examples)
    kind.serving_check(saved_model_dir, sample)

The runners (`trainer.training.mirrored`, `trainer.training.parameter_server`), the export, the evaluate step and the
local runner call these methods and never ask which kind they have; `trainer.modeling.kinds.choose` is the only
place that does.

Adding a kind (a Keras model your own code saved, say) is one new module, `trainer/modeling/saved_keras.py`, with a
subclass of `ModelKind`:

    class SavedKeras(ModelKind):
        name = "the saved Keras model"

        @classmethod
        def claims(cls, model): return bool(model.keras_file)     # a new ModelConfig setting
        @classmethod
        def of(cls, model): return cls(model.keras_file)
        def build(self, reader, compiled, gate): ...             # load it, compiled; check the gate's metric
        def signatures(self, model): return None                 # its own inputs and outputs
        def evaluate(self, model_dir, data_dir, examples, split="test"): ...   # e.g. user.UserModel's
        def serving_check(self, saved_model_dir, sample): ...

and its class in `trainer.modeling.kinds.kinds()`, before the built-in CNN (which claims every model nothing else
claims). The defaults of `check_settings`, `check_data`, `load`, `reader`, `learning_rate` and
`recorded_learning_rate` fit a model that comes compiled and reads either dataset format; override what differs.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import TYPE_CHECKING, Any

from trainer.evaluation.results import Results, Sample

if TYPE_CHECKING:
    from trainer.config.contract import ModelConfig
    from trainer.config.gate import Gate
    from trainer.data.readers import Reader
    from trainer.records.dataset import DatasetMetadata
    from trainer.serving.serving_check import ServingCheck


@dataclasses.dataclass(frozen=True)
class Compiled:
    """What the trainer compiles a model it builds with (a kind whose model comes compiled ignores it).

    Attributes:
        learning_rate: the peak learning rate (already scaled by the runner).
        decay_steps: steps of the cosine decay to 5% of it (0: constant).
        steps_per_execution: steps per call of the compiled training function.
    """

    learning_rate: float
    decay_steps: int = 0
    steps_per_execution: int = 1


class ModelKind(abc.ABC):
    """One kind of model: how it reads the data, is built, exported, evaluated and checked served, and what it refuses.

    Attributes:
        name: what it is, in messages (`the built-in CNN`, `model_fn 'diagnosis:model'`).
    """

    name: str = ""

    @classmethod
    @abc.abstractmethod
    def claims(cls, model: ModelConfig) -> bool:
        """Whether the model settings ask for this kind."""

    @classmethod
    @abc.abstractmethod
    def of(cls, model: ModelConfig) -> ModelKind:
        """This kind for the model settings it claims."""

    def check_settings(self, *, strategy: str = "", source: str = "", gate: str = "") -> None:
        """Refuses settings this kind cannot honour, before anything runs (empty: not known yet, not checked).

        Args:
            strategy: the distribution strategy.
            source: the data source to prepare.
            gate: the quality gate as set (`auc>=0.9`; empty: accuracy).

        Raises:
            UsageError: naming the setting and what is allowed.
        """
        return None

    def check_data(self, data_dir: str, meta: DatasetMetadata) -> None:
        """Refuses a prepared dataset this kind cannot train on (UsageError)."""
        return None

    def load(self) -> None:
        """Imports what the kind needs of your code, before the cluster forms (a wrong name fails fast)."""
        return None

    def reader(self, data_dir: str, meta: DatasetMetadata) -> Reader:
        """How the prepared dataset is read into `(features, label)` pairs: by default its format's reader."""
        from trainer.data import readers

        return readers.of(data_dir, meta)

    @abc.abstractmethod
    def build(self, reader: Reader, compiled: Compiled, gate: Gate | None) -> Any:
        """The compiled tf-keras model, built inside the caller's strategy scope.

        Args:
            reader: the dataset's reader (the features' spec, an example to build the metrics on).
            compiled: how the trainer compiles a model it builds.
            gate: the quality gate the run's evaluation applies, if known: its metric must be one the model reports.

        Raises:
            UsageError: the model does not report the gate's metric, or cannot be built.
        """

    def learning_rate(self, model: Any, configured: float) -> float:
        """The peak learning rate the model trains with: by default what its optimizer was compiled with."""
        return current_learning_rate(model.optimizer)

    def recorded_learning_rate(self, setting: float, used: float) -> float:
        """The learning rate history.json's `parameters` record: by default the one the model used."""
        return used

    @abc.abstractmethod
    def signatures(self, model: Any) -> dict[str, Any] | None:
        """The SavedModel's serving signatures (`tf.saved_model.save`'s); None: the model's own inputs and outputs."""

    @abc.abstractmethod
    def evaluate(self, model_dir: str, data_dir: str, examples: int, split: str = "test") -> tuple[Results, Sample]:
        """The model in `model_dir` (the chief's export) on `split`, and a sample of `examples` for the serving check.

        Raises:
            UsageError: the model directory or the dataset is not what the kind needs.
        """

    @abc.abstractmethod
    def serving_check(self, saved_model_dir: str, sample: Sample) -> ServingCheck:
        """Serves the SavedModel the way TF Serving does, sends it `sample.features`, checks the answers."""

    def html_name(self) -> str:
        """What the model is, as HTML, in the report."""
        import html

        return html.escape(self.name)


def current_learning_rate(optimizer: Any) -> float:
    """The learning rate of the optimizer's next step, read the way tf_keras' own TensorBoard callback reads it."""
    import tf_keras as keras

    rate = getattr(optimizer, "_learning_rate", None)
    if rate is None:
        rate = optimizer.learning_rate
    if isinstance(rate, keras.optimizers.schedules.LearningRateSchedule):
        rate = rate(optimizer.iterations)
    return float(keras.backend.get_value(rate))
