"""Uploading, running and scheduling a compiled pipeline on a KFP v2 server through `kfp.Client`.

Everything that can be checked without the server (cron syntax, durations, parameter names and types) is checked
before the first request, and refused as bad input (`UsageError`, exit 2). Server errors become one `ServerError`
line (exit 1), never a traceback of the generated client.
"""

import hashlib
import json
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from trainer.core.errors import ServiceError, UsageError

_CRON_DESCRIPTORS = {"@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly"}
_CRON_FIELDS = (
    ("second", 0, 59, ()),
    ("minute", 0, 59, ()),
    ("hour", 0, 23, ()),
    ("day of month", 1, 31, ("?",)),
    ("month", 1, 12, ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC")),
    ("day of week", 0, 6, ("?", "SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT")),
)
_DURATION = re.compile(r"^(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")


class ServerError(ServiceError):
    """The KFP server refused a request or could not be reached; one line says which and why."""


def check_cron(cron: str) -> str:
    """Checks a KFP cron expression: six fields, seconds first (robfig/cron), or a descriptor such as @daily.

    Raises:
        UsageError: for a 5-field cron, with the 6-field form it probably meant.
    """
    text = " ".join(cron.split())
    if text in _CRON_DESCRIPTORS:
        return text
    fields = text.split(" ")
    if len(fields) == 5:
        raise UsageError(f"cron {cron!r} has 5 fields; KFP cron has 6 with seconds first: '0 {text}'")
    if len(fields) != 6:
        raise UsageError(
            f"cron {cron!r} has {len(fields)} fields; KFP cron has 6: second minute hour day-of-month month day-of-week"
        )
    for value, (name, low, high, words) in zip(fields, _CRON_FIELDS, strict=True):
        for part in value.split(","):
            base, _, step = part.partition("/")
            if step and not step.isdigit():
                raise UsageError(f"cron {cron!r}: {name} step {step!r} is not a number")
            if base in ("*", *words) or base.upper() in words:
                continue
            for bound in base.split("-"):
                if bound.upper() in words:
                    continue
                if not bound.isdigit() or not low <= int(bound) <= high:
                    raise UsageError(
                        f"cron {cron!r}: {name} {bound!r} is not allowed; allowed: {low}-{high}, '*'"
                        + (f", {', '.join(w for w in words if w != '?')}" if len(words) > 1 else "")
                    )
    return text


def parse_duration(text: str) -> int:
    """'1d', '24h', '1h30m', '90s' -> seconds."""
    m = _DURATION.match(text.strip())
    if not text.strip() or not m or not any(m.groups()):
        raise UsageError(f"duration {text!r} is not allowed; allowed: e.g. 90s, 30m, 1h30m, 24h, 1d")
    d, h, mi, s = (int(g or 0) for g in m.groups())
    seconds = ((d * 24 + h) * 60 + mi) * 60 + s
    if seconds < 60:
        raise UsageError(f"duration {text!r} is {seconds}s; allowed: at least 60s")
    return seconds


def pipeline_name(package_path: str) -> str:
    """The name a compiled pipeline declares (`pipelineInfo.name`)."""
    with open(package_path) as f:
        return next(yaml.safe_load_all(f))["pipelineInfo"]["name"]


def pipeline_parameters(package_path: str) -> dict[str, dict[str, Any]]:
    """The root parameters of a compiled pipeline: name -> {'type': ..., 'default': ...}."""
    with open(package_path) as f:
        spec = next(yaml.safe_load_all(f))
    params = spec["root"]["inputDefinitions"]["parameters"]
    return {name: {"type": p["parameterType"], "default": p.get("defaultValue")} for name, p in params.items()}


def typed_params(assignments: Sequence[str], parameters: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Turns `key=value` strings into values of the pipeline parameters' types.

    Raises:
        UsageError: naming an unknown parameter (and the known ones) or a value of the wrong type.
    """
    result: dict[str, Any] = {}
    for item in assignments:
        key, sep, raw = item.partition("=")
        if not sep:
            raise UsageError(f"--param {item!r} is not key=value")
        if key not in parameters:
            raise UsageError(
                f"--param {key!r} is not a parameter of this pipeline; allowed: {', '.join(sorted(parameters))}"
            )
        kind = parameters[key]["type"]
        try:
            if kind == "NUMBER_INTEGER":
                value: Any = int(raw)
            elif kind == "NUMBER_DOUBLE":
                value = float(raw)
            elif kind == "BOOLEAN":
                if raw.lower() not in ("true", "false"):
                    raise ValueError(raw)
                value = raw.lower() == "true"
            elif kind in ("LIST", "STRUCT"):
                value = json.loads(raw)
            else:
                value = raw
        except ValueError:
            raise UsageError(f"--param {key}={raw!r} is not a valid {kind.lower().replace('number_', '')}") from None
        result[key] = value
    return result


def version_name(package_path: str, package_version: str) -> str:
    """`v<package version>-<UTC timestamp>-<first 8 hex of the YAML's SHA-256>`: unique, and says what it holds."""
    with open(package_path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()[:8]
    return f"v{package_version}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{digest}"


def make_client(host: str, token: str | None = None, namespace: str | None = None) -> Any:
    """A `kfp.Client` for `host`, with a bearer token and a profile namespace when given."""
    import logging
    import warnings

    import kfp

    logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)
    kwargs: dict[str, Any] = {"host": host.rstrip("/")}
    if token:
        kwargs["existing_token"] = token
    if namespace:
        kwargs["namespace"] = namespace
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="This client only works with Kubeflow Pipeline v2")
        logging.disable(logging.CRITICAL)  # kfp.Client logs tracebacks while its namespace probe retries
        try:
            return _server_call("connect", host, kfp.Client, **kwargs)
        finally:
            logging.disable(logging.NOTSET)


def _server_call(what: str, server: str, call, *args, **kwargs):
    from kfp_server_api.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    try:
        return call(*args, **kwargs)
    except ApiException as err:
        detail = ""
        try:
            body = json.loads(err.body or "{}")
            detail = body.get("message") or body.get("error") or ""
        except (ValueError, AttributeError):
            detail = (err.body or "")[:200] if isinstance(err.body, str) else ""
        detail = " ".join(str(detail).split())[:300]
        raise ServerError(
            f"KFP server {server} answered HTTP {err.status} {err.reason or ''} to {what}"
            + (f": {detail}" if detail else "")
        ) from None
    except (HTTPError, OSError) as err:
        raise ServerError(f"KFP server {server} could not be reached for {what}: {type(err).__name__}") from None


def upload(
    client: Any, host: str, package_path: str, name: str, package_version: str, description: str = ""
) -> tuple[str, str]:
    """Uploads the pipeline, or a new version of it when the name exists. Returns (pipeline id, version id)."""
    pipeline_id = _server_call("list pipelines", host, client.get_pipeline_id, name)
    version = version_name(package_path, package_version)
    if pipeline_id is None:
        pipeline = _server_call(
            "upload pipeline", host, client.upload_pipeline, package_path, pipeline_name=name, description=description
        )
        pipeline_id = pipeline.pipeline_id
        versions = _server_call("list pipeline versions", host, client.list_pipeline_versions, pipeline_id)
        version_id = versions.pipeline_versions[0].pipeline_version_id
    else:
        created = _server_call(
            "upload pipeline version",
            host,
            client.upload_pipeline_version,
            package_path,
            pipeline_version_name=version,
            pipeline_id=pipeline_id,
            description=description,
        )
        version_id = created.pipeline_version_id
    return pipeline_id, version_id


def experiment_id(client: Any, host: str, name: str, namespace: str | None) -> str:
    """The id of the named experiment, created if missing."""
    from kfp_server_api.exceptions import ApiException

    try:
        found = client.get_experiment(experiment_name=name, namespace=namespace)
        return found.experiment_id
    except ValueError:
        pass
    except ApiException as err:
        if err.status != 404:
            _server_call("get experiment", host, _raise, err)
    return _server_call("create experiment", host, client.create_experiment, name, namespace=namespace).experiment_id


def _raise(err: Exception) -> None:
    raise err


def start_run(
    client: Any, host: str, experiment: str, job_name: str, pipeline_id: str, version_id: str, params: dict[str, Any]
) -> str:
    """Starts one run of the pipeline version in the experiment; returns the run's id."""
    run = _server_call(
        "create run",
        host,
        client.run_pipeline,
        experiment_id=experiment,
        job_name=job_name,
        pipeline_id=pipeline_id,
        version_id=version_id,
        params=params,
    )
    return run.run_id


def schedule(
    client: Any,
    host: str,
    experiment: str,
    job_name: str,
    pipeline_id: str,
    version_id: str,
    params: dict[str, Any],
    *,
    cron: str | None = None,
    interval_seconds: int | None = None,
    max_concurrency: int = 1,
    no_catchup: bool = False,
    start_time: str | None = None,
    end_time: str | None = None,
) -> str:
    """Creates a recurring run (cron or interval) of the pipeline version; returns its id."""
    recurring = _server_call(
        "create recurring run",
        host,
        client.create_recurring_run,
        experiment_id=experiment,
        job_name=job_name,
        pipeline_id=pipeline_id,
        version_id=version_id,
        params=params,
        cron_expression=cron,
        interval_second=interval_seconds,
        max_concurrency=max_concurrency,
        no_catchup=no_catchup,
        start_time=start_time,
        end_time=end_time,
        enabled=True,
    )
    return recurring.recurring_run_id
