"""What the evaluate step decides: the quality gate on the results, the serving check, and so whether to publish."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from trainer.config.gate import Gate
from trainer.evaluation.results import Results
from trainer.serving.serving_check import ServingCheck

PUBLISH = "publish"
# What the evaluate step's Metrics artifact records besides the model's own metrics, which may not use these names.
BOOKKEEPING = ("gate_threshold", "passed_gate", "serving_check_passed", "test_examples")


@dataclasses.dataclass(frozen=True)
class Verdict:
    """The evaluation of the chief's model, the gate it had to pass, and its serving check.

    Attributes:
        evaluation: the model's results on the held-out split, the record its kind returns
            (`trainer.evaluation.results.Results`): the built-in CNN's classification results, or the metrics a
            model_fn's model was compiled with.
        gate: the quality gate.
        serving_check: the serving check's result.
        model_dir: the chief's model directory that was evaluated.
    """

    evaluation: Results
    gate: Gate
    serving_check: ServingCheck
    model_dir: str = ""

    @property
    def passed_gate(self) -> bool:
        """Whether the gate's metric is on the gate's side of its threshold."""
        return self.gate.passes(self.evaluation.scalars())

    @property
    def decision(self) -> str:
        """`publish` when the model passed the gate and the serving check, else `hold: ` and why not.

        The pipeline publishes inside `dsl.If(decision == "publish")`: one condition on one output, the only kind
        kfp.local resolves (its condition evaluator finds a task's `Output`, not its other named outputs).
        """
        reasons = []
        if not self.passed_gate:
            reasons.append(self.gate.failure(self.evaluation.scalars()))
        if not self.serving_check.passed:
            reasons.append(f"the serving check failed: {self.serving_check.reason}")
        return "hold: " + "; ".join(reasons) if reasons else PUBLISH

    def metrics(self) -> dict[str, float]:
        """The scalars of the step's Metrics artifact (what the publish step compares and records).

        A metric that is not a finite number (a diverged model's NaN loss) is left out: the artifact is JSON, which
        has no NaN; the decision says why the model was held.
        """
        finite = {name: value for name, value in self.evaluation.scalars().items() if math.isfinite(value)}
        return {
            **finite,
            "gate_threshold": self.gate.threshold,
            "passed_gate": int(self.passed_gate),
            "serving_check_passed": int(self.serving_check.passed),
            "test_examples": self.evaluation.num_examples,
        }

    def to_json(self) -> dict[str, Any]:
        """The whole verdict as plain JSON-ready values (the report reads it)."""
        return {
            **self.evaluation.to_json(),
            **self.metrics(),
            "gate": str(self.gate),
            "serving_check": self.serving_check.to_json(),
            "decision": self.decision,
        }
