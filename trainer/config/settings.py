"""The contract's settings looked up by name, whichever group of `trainer.config.contract` declares them.

The CLIs, the components and the pipeline address a setting by its name (`epochs`, `startup_timeout`): its
declaration, default, help text and check all come from here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

from trainer.config.checks import checked
from trainer.config.contract import GROUPS


def fields() -> Iterator[dataclasses.Field]:
    """Every setting of the contract, group by group."""
    for group in GROUPS.values():
        yield from dataclasses.fields(group)


def field(name: str) -> dataclasses.Field:
    """The declaration of the setting `name`."""
    for f in fields():
        if f.name == name:
            return f
    raise KeyError(f"{name!r} is not a setting of the contract")


def default(name: str) -> Any:
    """The contract's default of a setting (what the trainer CLIs use)."""
    f = field(name)
    if f.default is dataclasses.MISSING:
        raise KeyError(f"setting {name!r} has no default")
    return f.default


def help_text(name: str) -> str:
    """The help text of the setting `name`: its CLI help and its pipeline description."""
    return field(name).metadata["help"]


def check(name: str, value: Any) -> Any:
    """Checks one value against its setting's declaration and returns it (ints widened to float where declared)."""
    return checked(field(name), value)
