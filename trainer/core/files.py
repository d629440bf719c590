"""Write-then-rename helpers, so a failed step never leaves a half-written artifact at its output path.

A write that fails for a reason of the disk or the store (no space, a refusal, a quota, a throttled store) raises
the fault that names it (`trainer.core.faults.classify`: exit 3, 4, 5 or 142), after the temporary copy is
removed.
"""

from __future__ import annotations

import contextlib
import json
import os
import uuid
from collections.abc import Iterator
from typing import Any

from trainer.core.errors import DeniedError, UsageError


def _gfile():
    import tensorflow as tf

    return tf.io.gfile


def is_local(path: str) -> bool:
    """Whether `path` is a local path rather than a URI."""
    return "://" not in path


def check_writable_parent(path: str) -> None:
    """Fails early, naming the path, when its parent cannot take a new entry.

    Raises:
        UsageError: the nearest existing parent is not a directory (exit 2).
        DeniedError: it is a directory this user may not write, or on a read-only file system (exit 4).
    """
    if not is_local(path):
        return
    parent = os.path.dirname(os.path.abspath(path)) or "."
    probe = parent
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        raise UsageError(f"output location {path!r} is not writable (nearest existing parent: {probe!r})")
    if os.access(probe, os.W_OK | os.X_OK):
        return
    if os.statvfs(probe).f_flag & os.ST_RDONLY:
        raise DeniedError(
            f"output location {path!r} is not writable: {probe!r} is on a read-only file system (EROFS); mount it "
            "read-write or choose another location"
        )
    raise DeniedError(
        f"output location {path!r} is not writable: {probe!r} refuses uid {os.getuid()} (permission denied); let "
        "the task's user write there or choose another location"
    )


def _named(err: BaseException, path: str) -> BaseException:
    """The storage fault `err` is while writing `path` (`trainer.core.faults`), else `err` itself."""
    from trainer.core.faults import classify

    return classify(err, f"write {path!r}", store_operation=True) or err


@contextlib.contextmanager
def atomic_directory(path: str, overwrite: bool = True) -> Iterator[str]:
    """Yields a temporary sibling directory that becomes `path` only when the block succeeds.

    On any exception the temporary directory is removed and `path` is left as it was.
    """
    check_writable_parent(path)
    path = path.rstrip("/")
    tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
    gfile = None if is_local(path) else _gfile()
    try:
        if gfile is None:
            os.makedirs(tmp)
        else:
            gfile.makedirs(tmp)
        yield tmp
        if gfile is None:
            _replace_local(tmp, path, overwrite)
        else:
            if gfile.exists(path) and overwrite:
                gfile.rmtree(path)
            gfile.rename(tmp, path, overwrite=overwrite)
    except BaseException as err:
        remove_tree(tmp)
        named = _named(err, path) if isinstance(err, Exception) else err
        if named is err:
            raise
        raise named from err


def _replace_local(tmp: str, path: str, overwrite: bool) -> None:
    """Moves `tmp` to `path`; a failure leaves `path` as it was."""
    if os.path.isdir(path) and overwrite:
        if os.listdir(path):
            old = f"{path}.old-{uuid.uuid4().hex[:8]}"
            os.rename(path, old)
            try:
                os.rename(tmp, path)
            except BaseException:
                os.rename(old, path)
                raise
            remove_tree(old)
            return
        os.rmdir(path)
    os.rename(tmp, path)


def remove_tree(path: str) -> None:
    """Removes a directory tree, local or at a URI; what is missing is fine."""
    if is_local(path):
        import shutil

        shutil.rmtree(path, ignore_errors=True)
    else:
        gfile = _gfile()
        if gfile.exists(path):
            gfile.rmtree(path)


def write_bytes(path: str, data: bytes) -> None:
    """Writes `data` to `path` through a temporary sibling and a rename: a reader sees all of it or none.

    Every file written whole goes through here (texts, JSON documents, IDX files, `trainer.storage.locations` on a
    path); a bucket has no rename and takes one PUT instead.
    """
    tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
    if is_local(path):
        check_writable_parent(path)
    try:
        if is_local(path):
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        else:
            gfile = _gfile()
            with gfile.GFile(tmp, "wb") as f:
                f.write(data)
            gfile.rename(tmp, path, overwrite=True)
    except Exception as err:
        _remove_file(tmp)
        named = _named(err, path)
        if named is err:
            raise
        raise named from err


def _remove_file(path: str) -> None:
    """Removes a file, local or at a URI, if it is there (a temporary copy left by a failed write)."""
    with contextlib.suppress(Exception):
        if is_local(path):
            if os.path.lexists(path):
                os.remove(path)
        elif _gfile().exists(path):
            _gfile().remove(path)


def write_text(path: str, text: str) -> None:
    """Writes `text` (UTF-8) to `path` whole (`write_bytes`)."""
    write_bytes(path, text.encode())


def json_bytes(data: Any) -> bytes:
    """A JSON document as every file of the project holds one: indented, keys sorted, a final newline."""
    return (json.dumps(data, indent=2, sort_keys=True) + "\n").encode()


def write_json(path: str, data: Any) -> None:
    """Writes JSON to `path` whole (`write_bytes`)."""
    write_bytes(path, json_bytes(data))


def read_json(path: str) -> Any:
    """Reads a JSON document from a local path or a URI."""
    if is_local(path):
        with open(path) as f:
            return json.load(f)
    with _gfile().GFile(path) as f:
        return json.load(f)


def exists(path: str) -> bool:
    """Whether a local path or a URI exists."""
    return os.path.exists(path) if is_local(path) else _gfile().exists(path)
