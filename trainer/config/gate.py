"""The quality gate: one metric the evaluation reports, a direction and a threshold (`gate`, `min_accuracy`)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping

from trainer.config.checks import GATE_FORM, parse_gate
from trainer.core.errors import UsageError


@dataclasses.dataclass(frozen=True)
class Gate:
    """A model passes when `metric` is at least (or at most) `threshold`; the same order ranks published models.

    Attributes:
        metric: the name of a metric the evaluation reports (`accuracy`, `loss`, `auc`, ...).
        higher_is_better: True for `>=` (accuracy, AUC), False for `<=` (loss, error).
        threshold: the gate's bound.
    """

    metric: str
    higher_is_better: bool
    threshold: float

    @classmethod
    def of(cls, gate: str, min_accuracy: float) -> Gate:
        """The gate the settings describe: `gate` ('auc>=0.98', 'loss<=0.1'), else accuracy >= `min_accuracy`.

        Raises:
            UsageError: `gate` is not of that form.
        """
        if not gate:
            return cls("accuracy", True, float(min_accuracy))
        parsed = parse_gate(gate)
        if parsed is None:
            raise UsageError(f"gate {gate!r} is not allowed; allowed: {GATE_FORM}")
        metric, comparison, threshold = parsed
        return cls(metric, comparison == ">=", threshold)

    def __str__(self) -> str:
        return f"{self.metric} {'>=' if self.higher_is_better else '<='} {self.threshold:g}"

    def value(self, metrics: Mapping[str, float]) -> float:
        """The gate's metric among `metrics`.

        Raises:
            UsageError: the evaluation does not report it, naming the metrics it does report.
        """
        if self.metric not in metrics:
            raise UsageError(
                f"gate {str(self)!r} names metric {self.metric!r}; allowed: a metric the evaluation reports: "
                f"{', '.join(sorted(metrics))}"
            )
        return float(metrics[self.metric])

    def check_reported(self, reported: Iterable[str], model: str) -> None:
        """Checks, before training, that the model will report the gate's metric.

        Args:
            reported: the names of the metrics the compiled model reports (`trainer.modeling.user.reported_metrics`).
            model: what the model is, for the line (`model_fn 'diagnosis:model'`).

        Raises:
            UsageError: it does not, naming the gate's metric and the metrics it reports.
        """
        names = list(dict.fromkeys(reported))
        if self.metric not in names:
            raise UsageError(
                f"gate {str(self)!r} names metric {self.metric!r}, which {model} does not report; allowed: a metric "
                f"it reports: {', '.join(names) or 'none'} (compile it with metrics=[...(name={self.metric!r})])"
            )

    def passes(self, metrics: Mapping[str, float]) -> bool:
        """Whether the gate's metric is on the right side of the threshold (never when it is NaN)."""
        value = self.value(metrics)
        return value >= self.threshold if self.higher_is_better else value <= self.threshold

    def worse(self, value: float, than: float) -> bool:
        """Whether `value` of the gate's metric is strictly worse than `than`."""
        return value < than if self.higher_is_better else value > than

    def failure(self, metrics: Mapping[str, float]) -> str:
        """Why the metrics do not pass, in words; empty when they do."""
        if self.passes(metrics):
            return ""
        value = self.value(metrics)
        if not math.isfinite(value):
            return f"{self.metric} is {value} (the model diverged), not a number the gate {self.threshold:.4f} takes"
        side = "below" if self.higher_is_better else "above"
        return f"{self.metric} {value:.4f} is {side} the gate {self.threshold:.4f}"
