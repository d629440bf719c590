"""Your own code, named by a setting as `package.module:function` (`source` 'fn:...', `model_fn`)."""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from typing import Any

from trainer.core.errors import UsageError
from trainer.core.user_errors import one_line

FUNCTION_FORM = "package.module:function (a function importable in the image)"
_FUNCTION = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$")


def is_function(value: Any) -> bool:
    """Whether `value` names a function as `package.module:function`."""
    return isinstance(value, str) and bool(_FUNCTION.match(value))


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
        raise UsageError(f"{named_by}: importing module {module_name!r} failed: {one_line(err)}") from None
    function = getattr(module, name, None)
    if not callable(function):
        raise UsageError(f"{named_by}: module {module_name!r} has no function {name!r}")
    return function
