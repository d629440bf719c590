"""Command-line flags generated from the configuration contract (`trainer.config.contract`).

A setting `batch_size` becomes `--batch-size` with the setting's type, default and help text, so a default changed in
the contract is the default of every CLI. Values are checked by the config classes, not by argparse, so a bad value
gives the contract's one-line message.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Iterable
from typing import Any

from trainer.config import settings
from trainer.core.errors import UsageError

_TYPES = {"int": int, "float": float, "str": str, "bool": bool}


def flag_name(f: dataclasses.Field) -> str:
    """The flag of a setting: its declared `flag`, else `--name-with-dashes`."""
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def add_settings(parser: argparse.ArgumentParser | Any, names: Iterable[str]) -> None:
    """Adds one flag per named setting, with the contract's type, default and help."""
    for name in names:
        f = settings.field(name)
        kind = _TYPES[f.type if isinstance(f.type, str) else f.type.__name__]
        help_text = f.metadata["help"].replace("%", "%%")
        if f.default is dataclasses.MISSING:
            parser.add_argument(flag_name(f), dest=name, required=True, type=kind, help=help_text)
        elif kind is bool:
            parser.add_argument(
                flag_name(f), dest=name, action=argparse.BooleanOptionalAction, default=f.default, help=help_text
            )
        else:
            shown = f" (default: {f.default!r})" if isinstance(f.default, str) else f" (default: {f.default})"
            parser.add_argument(
                flag_name(f),
                dest=name,
                type=_parser(kind, name),
                default=f.default,
                metavar=name.upper(),
                help=help_text + shown.replace("%", "%%"),
            )


def _parser(kind: type, name: str):
    def parse(text: str) -> Any:
        try:
            return kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{name} {text!r} is not {'an integer' if kind is int else 'a number'}"
            ) from None

    parse.__name__ = kind.__name__
    return parse


def settings_from(args: argparse.Namespace, group: type) -> Any:
    """The config group `group` built from the parsed flags that belong to it (others keep the contract default)."""
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(group) if hasattr(args, f.name)}
    return group(**values)


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors follow the exit-code contract: one `error:` line, exit 2."""

    def error(self, message: str) -> Any:
        """Raises the usage error as a UsageError, so it becomes one `error:` line and exit 2."""
        raise UsageError(message)
