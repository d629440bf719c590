"""The Kubernetes API's rules for selecting and patching objects, as plain functions over manifest dicts.

Only what the stand-in needs: label selectors (equality, inequality, `in`, `notin`, exists), field selectors
(`path=value`, `path!=value` over dotted paths), JSON merge patch (RFC 7386), a strategic merge patch that merges
the lists the API server merges by key (ownerReferences by uid, conditions by type, ...), JSON patch (RFC 6902:
add, remove, replace, test) and `Status` bodies.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Mapping
from typing import Any

# List fields that a strategic merge patch merges by key instead of replacing (None: a set of plain values).
STRATEGIC_LIST_KEYS: dict[str, str | None] = {
    "ownerReferences": "uid",
    "conditions": "type",
    "containers": "name",
    "initContainers": "name",
    "volumes": "name",
    "env": "name",
    "finalizers": None,
}

_SET = re.compile(r"^\s*(?P<key>[^\s!=()]+)\s+(?P<op>in|notin)\s+\((?P<values>[^()]*)\)\s*$")
_COMPARE = re.compile(r"^\s*(?P<key>[^\s!=()]+)\s*(?P<op>==|=|!=)\s*(?P<value>[^\s!=(),]*)\s*$")
_EXISTS = re.compile(r"^\s*(?P<neg>!?)\s*(?P<key>[^\s!=()]+)\s*$")


class SelectorError(ValueError):
    """A selector the API server would reject with 400 BadRequest."""


class PatchError(ValueError):
    """A patch the API server would reject (422 for a failed JSON-patch `test`, else 400)."""


def _requirements(selector: str) -> list[str]:
    """Splits a selector at the commas that are not inside `( )`."""
    parts, depth, current = [], 0, ""
    for char in selector:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    return [p for p in parts if p.strip()]


def label_matcher(selector: str | None) -> Callable[[Mapping[str, str]], bool]:
    """Parses a label selector such as `a=b,c!=d,e in (x,y),!f` into a predicate over a labels dict.

    Raises:
        SelectorError: when a requirement cannot be parsed.
    """
    tests: list[Callable[[Mapping[str, str]], bool]] = []
    for part in _requirements(selector or ""):
        if m := _SET.match(part):
            values = {v.strip() for v in m["values"].split(",") if v.strip()}
            key, negate = m["key"], m["op"] == "notin"
            tests.append(lambda labels, k=key, vs=values, n=negate: (labels.get(k) in vs) != n)
        elif m := _COMPARE.match(part):
            key, value, negate = m["key"], m["value"], m["op"] == "!="
            tests.append(lambda labels, k=key, v=value, n=negate: (labels.get(k) == v) != n)
        elif m := _EXISTS.match(part):
            key, negate = m["key"], bool(m["neg"])
            tests.append(lambda labels, k=key, n=negate: (k in labels) != n)
        else:
            raise SelectorError(f"unable to parse requirement: {part.strip()!r}")
    return lambda labels: all(test(labels or {}) for test in tests)


def field_value(obj: Mapping[str, Any], path: str) -> str:
    """The value at a dotted path (`metadata.name`, `involvedObject.name`) as a string; "" when absent."""
    value: Any = obj
    for key in path.split("."):
        value = value.get(key) if isinstance(value, Mapping) else None
    return "" if value is None else str(value)


def field_matcher(selector: str | None) -> Callable[[Mapping[str, Any]], bool]:
    """Parses a field selector such as `metadata.name=x,status.phase!=Running` into a predicate over an object.

    Raises:
        SelectorError: when a requirement is not `path=value`, `path==value` or `path!=value`.
    """
    tests = []
    for part in _requirements(selector or ""):
        m = _COMPARE.match(part)
        if not m:
            raise SelectorError(f"invalid field selector: {part.strip()!r}")
        tests.append((m["key"], m["value"], m["op"] == "!="))
    return lambda obj: all((field_value(obj, path) == value) != negate for path, value, negate in tests)


def merge_patch(target: Any, patch: Any, strategic: bool = False) -> Any:
    """Applies a JSON merge patch (RFC 7386) to a copy of `target`; `strategic` merges keyed lists instead.

    A strategic merge patch also honours `{"$patch": "delete"}` on an item of a keyed list.
    """
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        elif strategic and key in STRATEGIC_LIST_KEYS and isinstance(value, list):
            result[key] = _merge_list(result.get(key) or [], value, STRATEGIC_LIST_KEYS[key])
        else:
            result[key] = merge_patch(result.get(key), value, strategic)
    return result


def _merge_list(current: list, patch: list, key: str | None) -> list:
    merged = copy.deepcopy(current)
    for item in patch:
        if key is None or not isinstance(item, Mapping):
            if item not in merged:
                merged.append(copy.deepcopy(item))
            continue
        same = [i for i, old in enumerate(merged) if isinstance(old, Mapping) and old.get(key) == item.get(key)]
        at = same[0] if same else None
        if item.get("$patch") == "delete":
            if at is not None:
                del merged[at]
        elif at is None:
            merged.append(copy.deepcopy(item))
        else:
            merged[at] = merge_patch(merged[at], item, strategic=True)
    return merged


def _pointer(path: str) -> list[str]:
    if path and not path.startswith("/"):
        raise PatchError(f"invalid JSON pointer {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path.split("/")[1:]]


def _parent(doc: Any, tokens: list[str]) -> Any:
    for token in tokens[:-1]:
        try:
            doc = doc[int(token)] if isinstance(doc, list) else doc[token]
        except (KeyError, IndexError, ValueError, TypeError):
            raise PatchError(f"path /{'/'.join(tokens)} does not exist") from None
    return doc


def json_patch(target: Any, operations: list[Mapping[str, Any]]) -> Any:
    """Applies a JSON patch (RFC 6902: add, remove, replace, test) to a copy of `target`.

    Raises:
        PatchError: on an unknown operation, a missing path, or a failed `test`.
    """
    doc = copy.deepcopy(target)
    for op in operations:
        tokens = _pointer(op.get("path", ""))
        if not tokens:
            raise PatchError("operations on the whole document are not supported")
        parent, last = _parent(doc, tokens), tokens[-1]
        kind = op.get("op")
        if isinstance(parent, list):
            index = len(parent) if last == "-" else int(last) if last.isdigit() else -1
            if not 0 <= index <= len(parent) - (kind != "add"):
                raise PatchError(f"index {last} is out of range at {op['path']}")
        elif not isinstance(parent, dict) or (kind != "add" and last not in parent):
            raise PatchError(f"path {op['path']} does not exist")
        slot = index if isinstance(parent, list) else last
        if kind == "add":
            if isinstance(parent, list):
                parent.insert(slot, copy.deepcopy(op["value"]))
            else:
                parent[slot] = copy.deepcopy(op["value"])
        elif kind == "remove":
            del parent[slot]
        elif kind == "replace":
            parent[slot] = copy.deepcopy(op["value"])
        elif kind == "test":
            if parent[slot] != op.get("value"):
                raise PatchError(f"test failed at {op['path']}")
        else:
            raise PatchError(f"unsupported JSON patch operation {kind!r}")
    return doc


def status(code: int, reason: str, message: str, details: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A `Status` body as the API server sends it with an error (or with a successful delete)."""
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success" if code < 400 else "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details:
        body["details"] = dict(details)
    if code < 400:
        body.pop("reason")
        body.pop("message")
    return body


def clone(obj: Any) -> Any:
    """A deep copy of a JSON value."""
    return copy.deepcopy(obj)


def role_grants(role: Mapping[str, Any], group: str, resource: str, verb: str, name: str | None) -> bool:
    """Whether an RBAC Role's rules allow `verb` on `resource` (of API `group`, "" for core), by name if set."""

    def allows(rule: Mapping[str, Any], field: str, value: str | None) -> bool:
        return value in rule.get(field, []) or "*" in rule.get(field, [])

    return any(
        allows(rule, "apiGroups", group)
        and allows(rule, "resources", resource)
        and allows(rule, "verbs", verb)
        and (not rule.get("resourceNames") or name in rule["resourceNames"])
        for rule in role.get("rules", [])
    )


def pod_ready(pod: Mapping[str, Any]) -> bool:
    """Running and not marked un-Ready: what an endpoints controller would publish."""
    conditions = {c.get("type"): c.get("status") for c in pod.get("status", {}).get("conditions", [])}
    return pod.get("status", {}).get("phase") == "Running" and conditions.get("Ready", "True") == "True"


def pod_terminal(pod: Mapping[str, Any]) -> bool:
    """Whether the pod has ended (Failed or Succeeded): its containers will not run again."""
    return pod.get("status", {}).get("phase") in ("Failed", "Succeeded")


def running_conditions(ready: bool = True) -> list[dict[str, str]]:
    """The conditions of a started pod; `ready=False` leaves ContainersReady and Ready False."""
    return [
        {"type": kind, "status": "True" if ready or kind in ("PodScheduled", "Initialized") else "False"}
        for kind in ("PodScheduled", "Initialized", "ContainersReady", "Ready")
    ]
