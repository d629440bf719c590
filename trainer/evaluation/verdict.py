"""What the evaluate step decides: the quality gate on the results, the serving check, and so whether to publish."""

from __future__ import annotations

import dataclasses
from typing import Any

from trainer.evaluation.metrics import Evaluation
from trainer.serving.check import ServingCheck

PUBLISH = "publish"


@dataclasses.dataclass(frozen=True)
class Verdict:
    """The evaluation of the chief's model, the gate it had to pass, and its serving check.

    Attributes:
        evaluation: the model's results on the held-out split.
        min_accuracy: the quality gate.
        serving_check: the serving check's result.
        model_dir: the chief's model directory that was evaluated.
    """

    evaluation: Evaluation
    min_accuracy: float
    serving_check: ServingCheck
    model_dir: str = ""

    @property
    def passed_gate(self) -> bool:
        """Whether the test accuracy reaches the gate."""
        return self.evaluation.accuracy >= self.min_accuracy

    @property
    def decision(self) -> str:
        """`publish` when the model passed the gate and the serving check, else `hold: ` and why not.

        The pipeline publishes inside `dsl.If(decision == "publish")`: one condition on one output, the only kind
        kfp.local resolves (its condition evaluator finds a task's `Output`, not its other named outputs).
        """
        reasons = []
        if not self.passed_gate:
            reasons.append(f"accuracy {self.evaluation.accuracy:.4f} is below the gate {self.min_accuracy:.4f}")
        if not self.serving_check.passed:
            reasons.append(f"the serving check failed: {self.serving_check.reason}")
        return "hold: " + "; ".join(reasons) if reasons else PUBLISH

    def metrics(self) -> dict[str, float]:
        """The scalars of the step's Metrics artifact (what the publish step compares and records)."""
        return {
            "accuracy": self.evaluation.accuracy,
            "loss": self.evaluation.loss,
            "min_accuracy": self.min_accuracy,
            "passed_gate": int(self.passed_gate),
            "serving_check_passed": int(self.serving_check.passed),
            "test_examples": self.evaluation.num_examples,
        }

    def to_json(self) -> dict[str, Any]:
        """The whole verdict as plain JSON-ready values (the report reads it)."""
        return {
            **self.evaluation.to_json(),
            **self.metrics(),
            "serving_check": self.serving_check.to_json(),
            "decision": self.decision,
        }
