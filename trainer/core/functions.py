"""Your own code, named by a setting as `package.module:function` (`source` 'fn:...', `model_fn`)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from trainer.config.checks import FUNCTION_FORM, is_function
from trainer.core.errors import UsageError


def load(spec: str, setting: str) -> Callable[..., Any]:
    """The function `spec` names, imported.

    Args:
        spec: `package.module:function`.
        setting: the setting that named it, for the error message.

    Raises:
        UsageError: `spec` is not of that form, its module cannot be imported, or it has no such function.
    """
    if not is_function(spec):
        raise UsageError(f"{setting} {spec!r} is not allowed; allowed: {FUNCTION_FORM}")
    module_name, name = spec.split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise UsageError(
            f"{setting} {spec!r}: module {module_name!r} cannot be imported ({err}); allowed: a module installed in "
            "the image or on PYTHONPATH"
        ) from None
    function = getattr(module, name, None)
    if not callable(function):
        raise UsageError(f"{setting} {spec!r}: module {module_name!r} has no function {name!r}")
    return function
