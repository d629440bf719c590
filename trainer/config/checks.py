"""What a setting of the contract allows: a predicate over the value and the words that say it.

`trainer.config.contract` declares each setting with one of these checks; the message of a refused value is
`"<setting> <value> is not allowed; allowed: <words>"`. Numbers must be finite (NaN and infinities are refused) and
booleans are not integers.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable
from typing import Any

from trainer.core.errors import UsageError
from trainer.core.functions import is_function

SOURCE_FORMS = (
    "'sample', 'idx:DIR_OR_URI', a TFDS name such as 'mnist' or 'tfds:fashion_mnist', or 'fn:package.module:function'"
)
_DNS_SUBDOMAIN = re.compile(r"^$|^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_SERVING_NAME = re.compile(r"^([a-z]([-a-z0-9]*[a-z0-9])?)?$")
_IMAGE_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_TFDS_NAME = re.compile(r"^[a-z][a-z0-9_]*(/[A-Za-z0-9_.-]+)?(:[0-9.*]+)?$")


@dataclasses.dataclass(frozen=True)
class Check:
    """What a setting allows: a predicate over the value and the words that say it."""

    ok: Callable[[Any], bool]
    allowed: str


def is_int(value: Any) -> bool:
    """Whether `value` is an integer and not a boolean."""
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return (is_int(value) or isinstance(value, float)) and math.isfinite(value)


def at_least(low: int, what: str = "an integer") -> Check:
    """Allows integers from `low` up."""
    return Check(lambda v: is_int(v) and v >= low, f"{what} of at least {low}")


def int_between(low: int, high: int) -> Check:
    """Allows integers from `low` to `high`."""
    return Check(lambda v: is_int(v) and low <= v <= high, f"an integer from {low} to {high}")


def above(low: float, what: str = "a number") -> Check:
    """Allows finite numbers above `low`."""
    return Check(lambda v: _is_number(v) and v > low, f"{what} above {low:g}")


def not_below(low: float, what: str = "a number") -> Check:
    """Allows finite numbers from `low` up."""
    return Check(lambda v: _is_number(v) and v >= low, f"{what} of at least {low:g}")


def number_between(low: float, high: float) -> Check:
    """Allows finite numbers from `low` to `high`."""
    return Check(lambda v: _is_number(v) and low <= v <= high, f"a number from {low:g} to {high:g}")


def one_of(*choices: str) -> Check:
    """Allows exactly these strings."""
    return Check(lambda v: v in choices, ", ".join(choices))


def text(what: str = "text") -> Check:
    """Allows any string."""
    return Check(lambda v: isinstance(v, str), what)


def non_empty(what: str = "a non-empty path") -> Check:
    """Allows strings that are not blank."""
    return Check(lambda v: isinstance(v, str) and bool(v.strip()), what)


FLAG = Check(lambda v: isinstance(v, bool), "true or false")
_URI_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


def location(*schemes: str, what: str = "a local or volume path") -> Check:
    """Empty, a path, or a URI of one of `schemes` (`s3://BUCKET/PREFIX`) with a bucket."""

    def ok(value: Any) -> bool:
        if not isinstance(value, str):
            return False
        match = _URI_SCHEME.match(value)
        if not match:
            return True
        scheme = match.group(1).lower()
        return (scheme == "file" and len(value) > 7) or (scheme in schemes and bool(value[match.end() :].split("/")[0]))

    return Check(ok, ", ".join([f"empty, {what}", *(f"{s}://BUCKET/PREFIX" for s in schemes)]))


def s3_endpoint() -> Check:
    """Empty (AWS, or `$AWS_ENDPOINT_URL_S3`) or `http(s)://HOST[:PORT]`."""
    return Check(
        lambda v: isinstance(v, str) and (v == "" or bool(re.match(r"^https?://[^/\s]+/?$", v))),
        "empty or http(s)://HOST[:PORT]",
    )


def comma_list(what: str = "names") -> Check:
    """Allows "" or comma-separated items, none empty and no two alike (spaces around an item do not count)."""

    def ok(value: Any) -> bool:
        if not isinstance(value, str):
            return False
        if not value.strip():
            return True
        items = [item.strip() for item in value.split(",")]
        return all(items) and len(set(items)) == len(items)

    return Check(ok, f"empty, or comma-separated {what}, none empty and no two alike")


def is_source(value: Any) -> bool:
    """Whether `value` is one of the data source forms (`SOURCE_FORMS`)."""
    if not isinstance(value, str):
        return False
    if value == "sample" or (value.startswith("idx:") and len(value) > 4):
        return True
    if value.startswith("fn:"):
        return is_function(value[3:])
    return bool(_TFDS_NAME.match(value[5:] if value.startswith("tfds:") else value))


def dns_subdomain_or_empty(what: str) -> Check:
    """Allows "" or a Kubernetes object name (a DNS-1123 subdomain)."""
    return Check(lambda v: isinstance(v, str) and bool(_DNS_SUBDOMAIN.match(v)), what)


def setting(default: Any = dataclasses.MISSING, help: str = "", *, check: Check, flag: str | None = None) -> Any:
    """A dataclass field with the metadata the CLIs and the pipeline read: help text, check and flag name."""
    metadata = {"help": help, "check": check, "flag": flag}
    if default is dataclasses.MISSING:
        return dataclasses.field(metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def checked(declaration: dataclasses.Field, value: Any) -> Any:
    """`value` checked against a setting's declaration (an int widened to float where a float is declared).

    Raises:
        UsageError: naming the setting, the value and what is allowed.
    """
    if declaration.type in ("float", float) and is_int(value):
        value = float(value)
    return require(declaration.name, value, declaration.metadata["check"])


def require(name: str, value: Any, check: Check) -> Any:
    """`value` if `check` allows it; every refusal of a value, a setting's or not, is worded here.

    Raises:
        UsageError: `"<name> <value> is not allowed; allowed: <what>"`.
    """
    if not check.ok(value):
        raise UsageError(f"{name} {value!r} is not allowed; allowed: {check.allowed}")
    return value


class Checked:
    """A frozen dataclass of settings whose every field is checked on construction."""

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            object.__setattr__(self, f.name, checked(f, getattr(self, f.name)))


def kserve_name_or_empty() -> Check:
    """Allows "" or a name KServe accepts for an InferenceService."""
    return Check(
        lambda v: isinstance(v, str) and len(v) <= 63 and bool(_SERVING_NAME.match(v)),
        "empty, or lowercase letters, digits and '-', starting with a letter and ending with a letter or "
        "digit, at most 63 characters (KServe's rule for InferenceService names)",
    )


def image_tag() -> Check:
    """Allows a container image tag."""
    return Check(lambda v: isinstance(v, str) and bool(_IMAGE_TAG.match(v)), "an image tag such as 2.20.0")


# A gate's metric is named as KFP names a run metric. The SDK takes any key (kfp 2.17.3, kfp/dsl/types/
# artifact_types.py: Metrics.log_metric sets `self.metadata[metric] = value`); the API server refuses a run metric
# named otherwise than `metricNamePattern` (kubeflow/pipelines backend/src/apiserver/server/util.go): a letter, then
# letters, digits, '-' and '_', ending with a letter or a digit, at most 64 characters.
METRIC_NAME = r"[A-Za-z](?:[-_A-Za-z0-9]{0,62}[A-Za-z0-9])?"
_GATE = re.compile(rf"^\s*({METRIC_NAME})\s*(>=|<=)\s*([-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?)\s*$")
GATE_FORM = (
    "empty (accuracy >= min_accuracy), or METRIC>=VALUE or METRIC<=VALUE such as 'auc>=0.98', 'pr-auc>=0.9' or "
    "'loss<=0.1', METRIC named as KFP names a metric: a letter, then letters, digits, '-' and '_', ending with a "
    "letter or digit, at most 64 characters"
)


def parse_gate(value: str) -> tuple[str, str, float] | None:
    """A gate's metric, comparison (`>=` or `<=`) and threshold; None when `value` is not one."""
    match = _GATE.match(value) if isinstance(value, str) else None
    if not match or not math.isfinite(float(match.group(3))):
        return None
    return match.group(1), match.group(2), float(match.group(3))
