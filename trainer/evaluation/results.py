"""What every model kind's evaluation returns: its results (one protocol) and a sample for the serving check."""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol


class Results(Protocol):
    """A model's results on a held-out split: the one evaluation record every kind returns.

    Attributes:
        num_examples: examples evaluated.
        dataset: the prepared dataset's source; None when not known.
        split: the split evaluated.
    """

    num_examples: int
    dataset: str | None
    split: str

    def scalars(self) -> dict[str, float]:
        """The metrics a gate can name, by name."""

    def confusion(self) -> tuple[list[str], list[list[int]]] | None:
        """Class names and the confusion matrix (rows: true class) for a classifier's results; else None."""

    def classes(self) -> tuple[dict[str, Any], ...]:
        """Per class `class`, `name`, `precision`, `recall`, `f1`, `support`; empty when the task has no classes."""

    def to_json(self) -> dict[str, Any]:
        """The results as plain JSON-ready values (metrics.json)."""


@dataclasses.dataclass(frozen=True)
class Sample:
    """The first held-out examples' features and the evaluated model's predictions for them, by output name.

    The serving check sends `features` to the served SavedModel and compares its answers with `predictions`.
    """

    features: Any
    predictions: Any
