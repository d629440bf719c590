"""The model kinds there are, and the one place that chooses among them (`trainer.modeling.kind` is the interface).

`choose(config.model)` serves a training task and the local runner's up-front checks; `of_history(history)` the
evaluate step (the kind of the model a run wrote).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainer.config.contract import ModelConfig
    from trainer.modeling.kind import ModelKind
    from trainer.records.history import History


def kinds() -> tuple[type[ModelKind], ...]:
    """Every kind, asked in order which claims the model settings: the built-in CNN last (it claims the rest)."""
    from trainer.modeling.cnn import BuiltInCnn
    from trainer.modeling.user import UserModel

    return (UserModel, BuiltInCnn)


def choose(model: ModelConfig) -> ModelKind:
    """The kind the model settings ask for: the first in `kinds()` that claims them."""
    return next(kind for kind in kinds() if kind.claims(model)).of(model)


def of_history(history: History) -> ModelKind:
    """The kind of the model a training run wrote, by what its history records."""
    from trainer.config.contract import ModelConfig

    return choose(ModelConfig(model_fn=history.model_fn))


def of_model_dir(model_dir: str) -> ModelKind:
    """The kind of the model in `model_dir`: by its history.json, else (a bare SavedModel directory) the CNN's."""
    from trainer.config.contract import ModelConfig
    from trainer.core.errors import UsageError
    from trainer.records.history import History

    try:
        return of_history(History.read(model_dir))
    except UsageError:
        return choose(ModelConfig())
