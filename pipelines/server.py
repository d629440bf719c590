"""The server actions of the pipeline CLI: --upload, --run, --schedule CRON and --every DURATION.

Everything that can be checked without the server (cron syntax, durations, parameter names, types and the
contract's allowed values, the token file, times) is checked before the first request.
"""

import os
import time
from typing import Any

from pipelines.kfp_client import (
    check_cron,
    experiment_id,
    make_client,
    parse_duration,
    pipeline_name,
    pipeline_parameters,
    schedule,
    start_run,
    typed_params,
    upload,
)
from trainer import __version__
from trainer.config import settings
from trainer.core.errors import UsageError


def add_server_arguments(parser: Any, action: str, pipeline_name: str) -> None:
    """The options of --upload, --run, --schedule and --every (only the ones `action` uses)."""
    server = parser.add_argument_group("the KFP server")
    server.add_argument(
        "--host",
        default=os.environ.get("KF_PIPELINES_ENDPOINT"),
        help="KFP API endpoint (default: $KF_PIPELINES_ENDPOINT)",
    )
    server.add_argument(
        "--token-file",
        default=None,
        help="file holding a bearer token (default: $KF_PIPELINES_TOKEN, "
        "else /var/run/secrets/kubeflow/pipelines/token when present)",
    )
    server.add_argument("--namespace", default=None, help="Kubeflow profile namespace (multi-user Kubeflow)")
    server.add_argument(
        "--pipeline-name",
        default=None,
        help=f"default: the strategy's pipeline name ({pipeline_name} for multi_worker_mirrored)",
    )
    if action == "upload":
        return
    runs = parser.add_argument_group("the run")
    runs.add_argument(
        "--experiment", default=None, help="experiment for runs, created if missing (default: the pipeline name)"
    )
    runs.add_argument("--run-name", default=None, help="name of the run or recurring run")
    runs.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="pipeline parameter, checked against the pipeline and the contract before anything is sent",
    )
    if action in ("schedule", "every"):
        recurring = parser.add_argument_group("the recurring run")
        recurring.add_argument("--max-concurrency", type=int, default=1, help="at most this many runs at once")
        recurring.add_argument("--no-catchup", action="store_true", help="skip missed intervals instead of backfilling")
        recurring.add_argument("--start", default=None, help="RFC 3339 start time, e.g. 2027-01-01T00:00:00Z")
        recurring.add_argument("--end", default=None, help="RFC 3339 end time")


def _token(token_file: str | None, default_file: str) -> str | None:
    if token_file:
        try:
            with open(token_file) as f:
                return f.read().strip()
        except OSError as err:
            raise UsageError(f"--token-file {token_file!r} cannot be read: {err.strerror}") from None
    if os.environ.get("KF_PIPELINES_TOKEN"):
        return os.environ["KF_PIPELINES_TOKEN"]
    if os.path.isfile(default_file):
        with open(default_file) as f:
            return f.read().strip()
    return None


def _rfc3339(name: str, value: str | None) -> str | None:
    from datetime import datetime

    if value is None:
        return None
    try:
        datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise UsageError(f"{name} {value!r} is not an RFC 3339 time; allowed: e.g. 2027-01-01T02:00:00Z") from None
    return value


def to_server(args: Any, action: str, package: str, token_file: str) -> int:
    """--upload / --run / --schedule / --every with a compiled package: everything is checked before the first request.

    Raises:
        UsageError: bad input, found before anything is sent.
        ServerError: the server refused or could not be reached (exit 1).
    """
    if not args.host:
        raise UsageError("no KFP host: pass --host URL or set KF_PIPELINES_ENDPOINT")
    cron = check_cron(args.schedule) if action == "schedule" else None
    interval = parse_duration(args.every) if action == "every" else None
    params = typed_params(getattr(args, "param", []), pipeline_parameters(package))
    for key, value in params.items():
        settings.check(key, value)
    if getattr(args, "max_concurrency", 1) < 1:
        raise UsageError(f"--max-concurrency {args.max_concurrency} is not allowed; allowed: 1 or more")
    start, end = _rfc3339("--start", getattr(args, "start", None)), _rfc3339("--end", getattr(args, "end", None))
    token = _token(args.token_file, token_file)
    name = args.pipeline_name or pipeline_name(package)
    host = args.host.rstrip("/")
    client = make_client(host, token, args.namespace)
    pipeline_id, version_id = upload(client, host, package, name, __version__)
    print(f"pipeline {pipeline_id} version {version_id}")
    print(f"{host}/#/pipelines/details/{pipeline_id}/version/{version_id}")
    if action == "upload":
        return 0
    run_name = args.run_name or f"{name}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}"
    experiment = experiment_id(client, host, args.experiment or name, args.namespace)
    if action == "run":
        run_id = start_run(client, host, experiment, run_name, pipeline_id, version_id, params)
        print(f"run {run_id}: {host}/#/runs/details/{run_id}")
        return 0
    recurring = schedule(
        client,
        host,
        experiment,
        run_name,
        pipeline_id,
        version_id,
        params,
        cron=cron,
        interval_seconds=interval,
        max_concurrency=args.max_concurrency,
        no_catchup=args.no_catchup,
        start_time=start,
        end_time=end,
    )
    print(f"recurring run {recurring}: {host}/#/recurringruns/details/{recurring}")
    return 0
