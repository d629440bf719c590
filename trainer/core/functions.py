"""Your own code, named by a setting as `package.module:function` (`source` 'fn:...', `model_fn`)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from trainer.config.checks import FUNCTION_FORM, is_function
from trainer.core.errors import UsageError


def load(spec: str, named_by: str) -> Callable[..., Any]:
    """The function `spec` names, imported.

    Args:
        spec: `package.module:function`.
        named_by: the setting and value that named it, for error messages (`model_fn 'm:f'`).

    Raises:
        UsageError: `spec` is not of that form, its module cannot be imported (or fails while it is), or it has no
            such function.
    """
    if not is_function(spec):
        raise UsageError(f"{named_by} is not allowed; allowed: {FUNCTION_FORM}")
    module_name, name = spec.split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise UsageError(
            f"{named_by}: module {module_name!r} cannot be imported ({err}); allowed: a module installed in the "
            "image or on PYTHONPATH"
        ) from None
    except Exception as err:
        raise UsageError(f"{named_by}: importing module {module_name!r} failed: {_one_line(err)}") from None
    function = getattr(module, name, None)
    if not callable(function):
        raise UsageError(f"{named_by}: module {module_name!r} has no function {name!r}")
    return function


def call(function: Callable[..., Any], named_by: str, *args: Any) -> Any:
    """`function(*args)`; an exception it raises becomes one line naming the setting that named it.

    Raises:
        UsageError: the function raised.
    """
    try:
        return function(*args)
    except Exception as err:
        shown = ", ".join(repr(a) if isinstance(a, str) else type(a).__name__ for a in args)
        raise UsageError(f"{named_by} failed when called with ({shown}): {_one_line(err)}") from None


def _one_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0][:300] if text else ''}".rstrip(": ")
