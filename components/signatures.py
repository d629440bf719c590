"""Component and pipeline signatures whose defaults and descriptions come from the configuration contract.

A component or pipeline function names its contract settings as parameters without defaults (the embedded source of
a lightweight component cannot import the contract); `declare` returns a copy of the function whose signature
carries each setting's pipeline default (`pipeline_default`) and whose docstring's `Args:` section
carries its help text. KFP reads both when it builds the component or pipeline spec, and both the KFP backend and
kfp.local hand every input, defaults included, to the function when it runs.
"""

import dataclasses
import inspect
import re
import types
from collections.abc import Callable
from typing import Any

from trainer.config import settings


@dataclasses.dataclass(frozen=True)
class Override:
    """A default a pipeline run on a cluster changes, and why."""

    value: Any
    reason: str


PIPELINE_OVERRIDES: dict[str, Override] = {
    "startup_timeout": Override(
        600.0,
        "on a cluster every worker waits for the slowest pod to be scheduled and to pull "
        "the 2.7 GB image, which takes minutes on a fresh node",
    ),
    "max_restarts": Override(
        2,
        "pods see transient peer losses (node drains, preemption, network blips) that a "
        "restart in place survives; KFP's own retry does not reach tasks inside a ParallelFor on "
        "every backend version and restarts the whole pod",
    ),
}


def pipeline_default(name: str) -> Any:
    """The default a pipeline parameter or component input of this name gets: the override, else the contract's."""
    return PIPELINE_OVERRIDES[name].value if name in PIPELINE_OVERRIDES else settings.default(name)


def is_setting(name: str) -> bool:
    """Whether `name` is a setting of the contract."""
    try:
        settings.field(name)
    except KeyError:
        return False
    return True


def _docstring(func: Callable[..., Any], names: list[str]) -> str:
    lines = inspect.cleandoc(func.__doc__ or "").splitlines()
    own = {m.group(1) for line in lines if (m := re.match(r"^    (\w+):", line))}
    added = [f"    {name}: {settings.help_text(name)}" for name in names if name not in own]
    if added and "Args:" in lines:
        end = lines.index("Args:") + 1
        while end < len(lines) and lines[end].startswith(" "):
            end += 1
        lines[end:end] = added
    elif added:
        at = next((i for i, line in enumerate(lines) if line in ("Returns:", "Raises:")), None)
        if at is None:
            lines += ["", "Args:", *added]
        else:
            lines[at:at] = ["Args:", *added, ""]
    return "\n".join(lines)


def declare(func: Callable[..., Any], overrides: dict[str, Any] | None = None) -> Callable[..., Any]:
    """A copy of `func` whose contract parameters default to the pipeline defaults and are described in its docstring.

    Args:
        func: a component or pipeline function whose last parameters are contract settings.
        overrides: defaults a compile-time option changes (`pipelines.storage.StorageSettings.overrides`).

    Raises:
        TypeError: when a parameter that is not a setting follows one that is (defaults must come last).
    """
    names = list(inspect.signature(func).parameters)
    declared = [n for n in names if is_setting(n)]
    if names[len(names) - len(declared) :] != declared:
        raise TypeError(f"{func.__name__}: contract settings {declared} must be its last parameters")
    copy = types.FunctionType(
        func.__code__,
        func.__globals__,
        func.__name__,
        tuple((overrides or {}).get(n, pipeline_default(n)) for n in declared) or None,
        func.__closure__,
    )
    copy.__doc__ = _docstring(func, declared)
    copy.__annotations__ = dict(func.__annotations__)
    copy.__module__ = func.__module__
    copy.__qualname__ = func.__qualname__
    return copy
