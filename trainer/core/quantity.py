"""Kubernetes resource quantities (`500m`, `1.5Gi`, `1e9`): read as Kubernetes reads them, written as KFP accepts them.

KFP 2.17's task API takes a narrower form than Kubernetes (memory: an integer with an optional suffix; CPU: a decimal
with an optional `m`), so `1.5Gi` or `1e9` written in a manifest is given to KFP as the same amount in its form.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal

from trainer.core.errors import UsageError

_FORM = re.compile(r"^(?P<number>\d+(?:\.\d*)?|\.\d+)(?P<suffix>[numkMGTPE]|[KMGTPE]i|[eE][+-]?\d+)?$")
_BINARY = {f"{p}i": 1024**n for n, p in enumerate("KMGTPE", start=1)}
_DECIMAL = {"n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1)}
_DECIMAL.update({p: Decimal(1000) ** n for n, p in enumerate("kMGTPE", start=1)})
ALLOWED = "a Kubernetes quantity such as 500m, 2, 0.5, 512Mi, 1.5Gi or 1e9"


def parse(value: object, field: str) -> Decimal:
    """The amount a quantity stands for (cores, bytes); every form Kubernetes accepts, none negative.

    Raises:
        UsageError: `value` is not such a quantity; the message names `field`.
    """
    text = str(value).strip() if isinstance(value, (str, int, float)) and not isinstance(value, bool) else None
    match = _FORM.match(text) if text else None
    if not match:
        raise UsageError(f"{field} {value!r} is not allowed; allowed: {ALLOWED}")
    number, suffix = Decimal(match["number"]), match["suffix"] or ""
    if suffix in _BINARY:
        return number * _BINARY[suffix]
    if suffix in _DECIMAL:
        return number * _DECIMAL[suffix]
    return number * Decimal(10) ** int(suffix[1:])


def cpu(value: object, field: str) -> str:
    """A CPU quantity as KFP's `set_cpu_request/limit` take it: whole cores, or millicores (rounded up)."""
    millis = math.ceil(parse(value, field) * 1000)
    if millis == 0:
        raise UsageError(f"{field} {value!r} is not allowed; allowed: at least 1m")
    return str(millis // 1000) if millis % 1000 == 0 else f"{millis}m"


def memory(value: object, field: str) -> str:
    """A memory quantity as KFP's `set_memory_request/limit` take it: the written form when KFP takes it, else bytes."""
    amount = parse(value, field)
    if amount < 1:
        raise UsageError(f"{field} {value!r} is not allowed; allowed: at least 1 byte")
    text = str(value).strip()
    if re.match(r"^\d+(?:[KMGTPE]i?)?$", text) and not text.endswith("k"):
        return text
    return str(math.ceil(amount))
