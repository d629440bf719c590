"""InferenceService bodies checked against KServe's own published model types, taken from the `kserve` SDK package.

The SDK's `kserve.models` are generated from KServe's OpenAPI definitions: each class lists its JSON fields
(`attribute_map`) and their types (`openapi_types`), and refuses a missing required field on construction. `problems`
walks a JSON body through those classes: an unknown field, a misspelt one or a value of the wrong type is reported
with its path. Object metadata is checked against the `kubernetes` client's V1ObjectMeta, as the SDK itself does.
Nothing of KServe's schema is copied here; a newer SDK brings its own.
"""

from __future__ import annotations

import importlib
import json
import re
from typing import Any

import kserve
import kserve.models
from kserve.constants import constants
from kubernetes import client as k8s_client

GROUP = constants.KSERVE_GROUP
VERSION = constants.KSERVE_V1BETA1_VERSION
PLURAL = constants.KSERVE_PLURAL_INFERENCESERVICE
KIND = constants.KSERVE_KIND_INFERENCESERVICE
# Go types with their own JSON form (a string) that the generated classes describe as objects.
STRINGS = {"KnativeURL", "KnativeVolatileTime", "V1Time", "datetime"}
PRIMITIVES = {"str": (str,), "int": (int,), "bool": (bool,), "float": (int, float), "object": (object,)}


def model_class(name: str) -> type | None:
    """The generated class of a type name: kserve.models, its unexported Knative modules, or the kubernetes client."""
    found = getattr(kserve.models, name, None) or getattr(k8s_client, name, None)
    if found is None:
        module = re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()
        try:
            found = getattr(importlib.import_module(f"kserve.models.{module}"), name, None)
        except ImportError:
            return None
    return found


def problems(value: Any, type_name: str, path: str = "") -> list[str]:
    """What in `value` (JSON) does not fit the generated type `type_name`; empty when it fits."""
    if value is None:
        return []
    if type_name in STRINGS:
        return [] if isinstance(value, str) else [f"{path}: {value!r} is not a string ({type_name})"]
    if type_name in PRIMITIVES:
        ok = isinstance(value, PRIMITIVES[type_name]) and not (type_name != "bool" and isinstance(value, bool))
        return [] if ok else [f"{path}: {value!r} is not {type_name}"]
    if match := re.fullmatch(r"list\[(.+)\]", type_name):
        if not isinstance(value, list):
            return [f"{path}: {value!r} is not a list"]
        return [p for i, v in enumerate(value) for p in problems(v, match[1], f"{path}[{i}]")]
    if match := re.fullmatch(r"dict\(str, (.+)\)", type_name):
        if not isinstance(value, dict):
            return [f"{path}: {value!r} is not an object"]
        return [p for k, v in value.items() for p in problems(v, match[1], f"{path}.{k}")]
    cls = model_class(type_name)
    if cls is None:
        return []  # a type the SDK references but does not ship (e.g. Knative's TrafficTarget): not checkable
    if not isinstance(value, dict):
        return [f"{path}: {value!r} is not an object ({type_name})"]
    fields = {json_name: cls.openapi_types[attr] for attr, json_name in cls.attribute_map.items()}
    found = []
    for key, item in value.items():
        if key not in fields:
            found.append(f"{path}.{key}: not a field of {type_name} (it has {', '.join(sorted(fields))})")
        else:
            found += problems(item, fields[key], f"{path}.{key}")
    return found


def construct(value: dict[str, Any], type_name: str) -> Any:
    """Builds the SDK object from JSON; its constructors refuse a missing required field (ValueError)."""

    class Response:
        data = json.dumps(value)

    return kserve.ApiClient().deserialize(Response(), type_name)


def inference_service_problems(body: dict[str, Any]) -> list[str]:
    """An InferenceService body against KServe's types: apiVersion and kind, metadata, spec, and status if present."""
    found = []
    if body.get("apiVersion") != f"{GROUP}/{VERSION}" or body.get("kind") != KIND:
        found.append(f"apiVersion/kind {body.get('apiVersion')}/{body.get('kind')} is not {GROUP}/{VERSION}/{KIND}")
    extra = set(body) - {"apiVersion", "kind", "metadata", "spec", "status"}
    found += [f".{k}: not a field of V1beta1InferenceService" for k in sorted(extra)]
    found += problems(body.get("metadata"), "V1ObjectMeta", ".metadata")
    found += problems(body.get("spec"), "V1beta1InferenceServiceSpec", ".spec")
    found += problems(body.get("status"), "V1beta1InferenceServiceStatus", ".status")
    try:
        construct(body.get("spec") or {}, "V1beta1InferenceServiceSpec")
    except ValueError as err:
        found.append(f".spec: {err}")
    return found
