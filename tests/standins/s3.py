"""A real S3-compatible server for tests: moto's standalone server (`moto_server`) on 127.0.0.1, with IAM enforced.

`S3Server` starts it as its own process, creates the bucket and IAM users through the real boto3 client, then
switches authentication on (`/moto-api/reset-auth`), so from then on a request needs a known access key, a
matching signature and a policy that allows the action, as on MinIO or AWS. `FaultyProxy` forwards to it and
fails requests that match a rule, to break a transfer in the middle.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from werkzeug import Request, Response

from tests.standins.serving import Served, serve

BUCKET = "models"
REGION = "us-east-1"


@dataclass(frozen=True)
class Keys:
    """An IAM user's access key, as a Kubernetes Secret would hand it to a pod."""

    access_key: str
    secret_key: str

    def env(self) -> dict[str, str]:
        return {"AWS_ACCESS_KEY_ID": self.access_key, "AWS_SECRET_ACCESS_KEY": self.secret_key}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def profile_policy(namespace: str, bucket: str = "mlpipeline") -> dict:
    """The policy KFP 2.17's profile controller gives a namespace's keys (`pipelines-profile-controller/sync.py`).

    Its objects statement is sync.py's, word for word; listing the bucket is what 2.17's bucket policy
    (`ensure_bucket_list_policy`) adds, with the same prefixes (moto checks the resource, not the prefix condition).
    """
    prefixes = ["artifacts/", f"private-artifacts/{namespace}/", f"private/{namespace}/", "shared/"]
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Action": ["s3:Put*", "s3:Get*", "s3:List*", "s3:DeleteObject"],
                "Resource": [f"arn:aws:s3:::{bucket}/{prefix}*" for prefix in prefixes],
            },
            {
                "Effect": "Allow",
                "Action": ["s3:ListBucket"],
                "Resource": [f"arn:aws:s3:::{bucket}"],
                "Condition": {"StringLike": {"s3:prefix": [f"{prefix}*" for prefix in prefixes]}},
            },
        ],
    }


class S3Server:
    """moto_server on a free loopback port: bucket `models`, users `publisher` (s3:*) and `reader` (get, list).

    With `kfp_namespaces`, also KFP's bucket `mlpipeline` and, per namespace, keys under the profile controller's
    policy (`profile_policy`), in `self.namespace_keys`.
    """

    def __init__(self, log_dir: Path, kfp_namespaces: tuple[str, ...] = ()) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = open(log_dir / "moto_server.log", "w")  # noqa: SIM115 - closed in stop()
        server = Path(sys.executable).parent / "moto_server"
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        self.proc = subprocess.Popen(
            [str(server), "-H", "127.0.0.1", "-p", str(self.port)], env=env, stdout=self._log, stderr=self._log
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.2).close()
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto_server did not start: see {log_dir / 'moto_server.log'}") from None
                time.sleep(0.1)
        self.publisher = self._user("publisher", ["s3:*"])
        self.reader = self._user("reader", ["s3:GetObject", "s3:ListBucket"])
        self.client(self.publisher).create_bucket(Bucket=BUCKET)
        self.namespace_keys = {ns: self._user(ns, policy=profile_policy(ns)) for ns in kfp_namespaces}
        if kfp_namespaces:
            self.client(self.publisher).create_bucket(Bucket="mlpipeline")
        request = urllib.request.Request(
            f"{self.url}/moto-api/reset-auth", data=b"0", method="POST", headers={"Content-Type": "text/plain"}
        )
        urllib.request.urlopen(request, timeout=10).close()

    def client(self, keys: Keys, service: str = "s3"):
        import boto3

        return boto3.client(
            service,
            endpoint_url=self.url,
            region_name=REGION,
            aws_access_key_id=keys.access_key,
            aws_secret_access_key=keys.secret_key,
        )

    def _user(self, name: str, actions: list[str] = (), policy: dict | None = None) -> Keys:
        iam = self.client(Keys("setup", "setup"), "iam")
        iam.create_user(UserName=name)
        policy = policy or {
            "Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Action": list(actions), "Resource": "*"}],
        }
        iam.put_user_policy(UserName=name, PolicyName=f"{name}-s3", PolicyDocument=json.dumps(policy))
        key = iam.create_access_key(UserName=name)["AccessKey"]
        return Keys(key["AccessKeyId"], key["SecretAccessKey"])

    def keys(self, prefix: str = "", bucket: str = BUCKET) -> list[str]:
        """Every object key in the bucket (under `prefix`), sorted; read with the publisher's key."""
        pages = self.client(self.publisher).get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        return sorted(o["Key"] for page in pages for o in page.get("Contents", []))

    def read(self, key: str) -> bytes:
        return self.read_from(BUCKET, key)

    def read_from(self, bucket: str, key: str) -> bytes:
        return self.client(self.publisher).get_object(Bucket=bucket, Key=key)["Body"].read()

    def empty(self) -> None:
        client = self.client(self.publisher)
        for key in self.keys():
            client.delete_object(Bucket=BUCKET, Key=key)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log.close()


class FaultyProxy:
    """An HTTP proxy to `upstream` that answers 500 to every request `fails(request)` picks, and records them all.

    Requests pass through unchanged (Host included, so S3 signatures still match); a failed one never reaches
    the server, as when the network drops during a transfer. `answered` records the body bytes of every answer
    the server gave, by method and path (what a client read through the proxy).
    """

    def __init__(self, upstream: str, fails: Callable[[Request], bool] = lambda _: False) -> None:
        self.upstream = upstream
        self.fails = fails
        self.requests: list[tuple[str, str, bool]] = []
        self.answered: list[tuple[str, str, int]] = []
        self._served: Served = serve(self, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._served.port}"

    def __call__(self, environ, start_response):
        request = Request(environ)
        failed = self.fails(request)
        self.requests.append((request.method, request.full_path, failed))
        if failed:
            body = b"<Error><Code>InternalError</Code><Message>injected: connection lost</Message></Error>"
            return Response(body, status=500, content_type="application/xml")(environ, start_response)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in ("content-length", "connection")}
        headers.setdefault("Content-Type", "application/octet-stream")  # else urllib says it is a form
        forwarded = urllib.request.Request(
            self.upstream + request.full_path.rstrip("?"),
            data=request.get_data() if request.method in ("PUT", "POST") else None,
            headers=headers,
            method=request.method,
        )
        try:
            with urllib.request.urlopen(forwarded, timeout=30) as reply:
                status, body, reply_headers = reply.status, reply.read(), reply.headers
        except urllib.error.HTTPError as err:
            status, body, reply_headers = err.code, err.read(), err.headers
        kept = [(k, v) for k, v in reply_headers.items() if k.lower() not in ("transfer-encoding", "connection")]
        self.answered.append((request.method, request.path, len(body)))
        response = Response(body, status=status, headers=kept)
        if request.method == "HEAD" and "Content-Length" in reply_headers:
            response.headers["Content-Length"] = reply_headers["Content-Length"]  # the object's size, not the body's
        return response(environ, start_response)

    def stop(self) -> None:
        self._served.stop()
