"""Storage faults named for what they are (`trainer.core.faults`), each injected for real.

A full disk is a small tmpfs mounted for the test (we run as root, as CI does; without root the fixture fails, it
does not skip); a read-only one is a tmpfs remounted read-only (EROFS) or a directory made immutable (`chattr +i`:
EPERM even for root). S3 is moto's server behind a proxy that answers 503 SlowDown; GCS is a stand-in of the JSON
API's list, get, upload and delete, driven through the real gcsfs (`STORAGE_EMULATOR_HOST`). Every case checks the
one line, the exit code (`run_step`, as a pipeline step ends, or `exit_code`) and that nothing half-written is left.

EDQUOT cannot be made here (this kernel's tmpfs has no quotas, and root is exempt from ext4's), so the quota fault
is checked on GCS (a 403 naming the quota) and by classifying the errno.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import re
import socket
import ssl
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from urllib.parse import unquote

import pytest
from werkzeug import Request, Response

from tests.standins.s3 import BUCKET, FaultyProxy, S3Server
from tests.standins.serving import serve
from trainer.core import faults
from trainer.core.entry import run_step
from trainer.core.errors import (
    DeniedError,
    NoSpaceError,
    QuotaError,
    StoreUnavailableError,
    exit_code,
)
from trainer.core.files import write_json
from trainer.publishing.publish import publish
from trainer.storage.locations import Location

LINEAGE = {"run_id": "run-1", "dataset": "sample", "model_uri": "m", "parameters": {}}
NO_SPACE = "no space left on the device (ENOSPC); free space there or give the task a larger volume"
READ_ONLY = "read-only file system (EROFS); mount it read-write or choose another location"
THROTTLED = re.escape(faults._TRANSIENT_ADVICE)  # its wording is the publishing side's


# --- disks ---------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def tmpfs(path: Path, size: str):
    """A tmpfs of `size` mounted at `path` for the block; needs root (CI runs as root): fails loudly without."""
    if os.geteuid() != 0:
        pytest.fail("these tests mount a tmpfs to fill it: run them as root (CI does)")
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)


@pytest.fixture
def small_disk(tmp_path):
    with tmpfs(tmp_path / "disk", "256k") as disk:
        yield disk


def _fill(disk: Path) -> None:
    """Fills `disk` up to its last byte with one file, `filler`."""
    with open(disk / "filler", "wb", buffering=0) as f, contextlib.suppress(OSError):
        while True:
            f.write(b"\0" * 4096)


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def _fake_model(root: Path, data_bytes: int) -> str:
    """A directory publish takes for a SavedModel (it copies files, it does not load them)."""
    (root / "variables").mkdir(parents=True)
    (root / "saved_model.pb").write_bytes(b"pb" * 1000)
    (root / "variables" / "variables.index").write_bytes(b"i" * 100)
    (root / "variables" / "variables.data-00000-of-00001").write_bytes(os.urandom(data_bytes))
    return str(root)


def _errors(capsys) -> list[str]:
    err = capsys.readouterr().err
    assert "Traceback" not in err, err[-3000:]
    return [line for line in err.splitlines() if line.startswith("error:")]


def test_a_full_disk_while_publishing_ends_3_with_one_line_and_the_published_version_intact(
    small_disk, tmp_path, capsys
):
    target = small_disk / "models"
    first = publish(_fake_model(tmp_path / "small", 10_000), {"accuracy": 0.5}, str(target), LINEAGE)
    before = _tree(small_disk)
    with pytest.raises(SystemExit) as exit_info:
        run_step(
            publish,
            saved_model_dir=_fake_model(tmp_path / "big", 400_000),
            metrics={"accuracy": 0.9},
            publish_uri=str(target),
            lineage=LINEAGE,
        )
    errors = _errors(capsys)
    assert exit_info.value.code == 3 and len(errors) == 1, errors
    assert re.fullmatch(
        rf"error: write '{target}/\.staging-\d+-\w+/variables/variables\.data-00000-of-00001': {re.escape(NO_SPACE)}",
        errors[0],
    ), errors[0]
    assert _tree(small_disk) == before, "no staging directory, no new version, latest.json unchanged"
    assert json.loads((target / "latest.json").read_text())["version"] == first.version


def test_a_json_document_on_a_full_disk_is_not_half_written(small_disk):
    status = Location(str(small_disk))
    status.write_json({"state": "running"}, "status.json")
    _fill(small_disk)
    with pytest.raises(NoSpaceError) as raised:
        status.write_json({"state": "running", "detail": "x" * 20_000}, "status.json")
    assert exit_code(raised.value) == 3
    assert str(raised.value) == f"write '{small_disk}/status.json': {NO_SPACE}"
    assert sorted(os.listdir(small_disk)) == ["filler", "status.json"], "no temporary copy left"
    assert status.read_json("status.json") == {"state": "running"}


def test_a_read_only_volume_is_denied_with_exit_4_and_left_unchanged(tmp_path, capsys):
    with tmpfs(tmp_path / "ro", "1m") as disk:
        target = disk / "models"
        publish(_fake_model(tmp_path / "first", 1000), {"accuracy": 0.5}, str(target), LINEAGE)
        subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
        before = _tree(disk)
        with pytest.raises(SystemExit) as exit_info:
            run_step(
                publish,
                saved_model_dir=_fake_model(tmp_path / "second", 1000),
                metrics={"accuracy": 0.9},
                publish_uri=str(target),
                lineage=LINEAGE,
            )
        errors = _errors(capsys)
        assert exit_info.value.code == 4 and len(errors) == 1, errors
        assert re.fullmatch(rf"error: write '{target}/\.staging-\d+-\w+/\S+': {re.escape(READ_ONLY)}", errors[0])
        assert _tree(disk) == before
        with pytest.raises(DeniedError, match=r"is on a read-only file system \(EROFS\); mount it read-write"):
            write_json(str(disk / "history.json"), {})


def test_an_immutable_directory_is_denied_even_to_root(small_disk, tmp_path):
    home = small_disk / "home"
    home.mkdir()
    subprocess.run(["chattr", "+i", str(home)], check=True)
    try:
        with pytest.raises(DeniedError) as raised:
            Location(str(home)).upload(_fake_model(tmp_path / "model", 100), "ckpt")
        assert exit_code(raised.value) == 4
        assert re.fullmatch(
            rf"write '{home}/ckpt/\S+': permission denied \(EPERM\); let the task's user \(uid 0\) write there or "
            "choose another location",
            str(raised.value),
        ), raised.value
        assert os.listdir(home) == []
    finally:
        subprocess.run(["chattr", "-i", str(home)], check=True)


@pytest.mark.slow  # TensorFlow
def test_a_full_disk_under_a_checkpoint_or_a_saved_model_is_no_space_and_leaves_no_file(small_disk):
    import tensorflow as tf

    from trainer.cluster.resume import CheckpointHome
    from trainer.core.files import atomic_directory
    from trainer.training.callbacks import EpochCheckpoints, ThroughputHistory

    module = tf.Module()
    module.weights = tf.Variable(tf.zeros([100_000]))  # 400 kB, more than the disk holds
    home = CheckpointHome(str(small_disk / "worker-0"))
    checkpoints = EpochCheckpoints(module, home, ThroughputHistory(10))
    with pytest.raises(NoSpaceError) as raised:
        checkpoints.write(3)
    assert exit_code(raised.value) == 3
    assert str(raised.value) == (
        f"write the checkpoint of epoch 3 to '{small_disk}/worker-0/ckpt-3': no space left on the device (ENOSPC, "
        "ResourceExhaustedError); free space there or give the task a larger volume"
    )
    assert os.listdir(small_disk / "worker-0") == [], "no checkpoint file, no _temp directory"

    with pytest.raises(NoSpaceError, match=rf"^write '{small_disk}/model': no space left on the device"):
        with atomic_directory(str(small_disk / "model")) as tmp:
            tf.saved_model.save(module, tmp)
    assert os.listdir(small_disk) == ["worker-0"], "no half-written SavedModel"


# --- S3 ------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    server = S3Server(tmp_path_factory.mktemp("s3"))
    yield server
    server.stop()


class SlowDown(FaultyProxy):
    """A proxy to the S3 server that answers 503 SlowDown to the PUTs `throttled(path, n)` picks (n: 1, 2, ...)."""

    def __init__(self, upstream, throttled):
        super().__init__(upstream, lambda request: False)
        self.throttled = throttled
        self.puts: dict[str, int] = {}

    def __call__(self, environ, start_response):
        request = Request(environ)
        if request.method == "PUT":
            self.puts[request.path] = self.puts.get(request.path, 0) + 1
            if self.throttled(request.path, self.puts[request.path]):
                body = b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>"
                return Response(body, status=503, content_type="application/xml")(environ, start_response)
        return super().__call__(environ, start_response)


@pytest.fixture
def publisher(s3, monkeypatch):
    for name, value in s3.publisher.env().items():
        monkeypatch.setenv(name, value)
    return s3


@pytest.mark.slow  # a server process
def test_s3_throttled_twice_then_answered_succeeds_with_each_retry_logged(publisher, caplog):
    prefix = f"t-{uuid.uuid4().hex[:6]}"
    proxy = SlowDown(publisher.url, lambda path, n: path.endswith("/latest.json") and n <= 2)
    try:
        with caplog.at_level(logging.WARNING, logger="trainer.core.faults"):
            Location(f"s3://{BUCKET}/{prefix}", proxy.url).write_json({"version": 7}, "latest.json")
    finally:
        proxy.stop()
    assert proxy.puts == {f"/{BUCKET}/{prefix}/latest.json": 3}, "one request per attempt: no retries below ours"
    retries = [r.getMessage() for r in caplog.records if "retrying in" in r.getMessage()]
    assert len(retries) == 2, retries
    assert re.fullmatch(
        rf"s3://{BUCKET} at {proxy.url}: write '{BUCKET}/{prefix}/latest.json': 503 SlowDown: Please reduce your "
        r"request rate; attempt 1 of 5 failed, retrying in (0\.[5-9]|1\.0) s",
        retries[0],
    ), retries[0]
    assert json.loads(publisher.read(f"{prefix}/latest.json")) == {"version": 7}


@pytest.mark.slow  # a server process
def test_s3_always_throttled_ends_142_after_5_attempts_with_one_line_and_nothing_left(
    publisher, tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr(faults, "FIRST_DELAY", 0.01)  # the schedule is the same, only shorter
    prefix = f"t-{uuid.uuid4().hex[:6]}"
    proxy = SlowDown(publisher.url, lambda path, n: True)
    try:
        with pytest.raises(SystemExit) as exit_info:
            run_step(
                publish,
                saved_model_dir=_fake_model(tmp_path / "model", 1000),
                metrics={"accuracy": 0.9},
                publish_uri=f"s3://{BUCKET}/{prefix}",
                lineage=LINEAGE,
                s3_endpoint=proxy.url,
            )
    finally:
        proxy.stop()
    errors = _errors(capsys)
    assert exit_info.value.code == 142 and len(errors) == 1, errors
    assert re.fullmatch(
        rf"error: s3://{BUCKET} at {proxy.url}: write '{BUCKET}/{prefix}/\.staging-\d+-\w+/\S+': the store stayed "
        r"throttled or unavailable through 5 attempts in \d+\.\d s \(last: 503 SlowDown: Please reduce your request "
        rf"rate\); {THROTTLED}",
        errors[0],
    ), errors[0]
    assert list(proxy.puts.values()) == [5], "5 requests in all: s3fs's and botocore's retries are off"
    assert publisher.keys(prefix) == [], "nothing half-written"


@pytest.mark.slow  # a server process
def test_s3_refused_credentials_end_4_with_the_line_naming_bucket_key_permission_and_credentials(s3, monkeypatch):
    for name, value in s3.reader.env().items():
        monkeypatch.setenv(name, value)
    prefix = f"t-{uuid.uuid4().hex[:6]}"
    with pytest.raises(DeniedError) as raised:
        Location(f"s3://{BUCKET}/{prefix}", s3.url).write_json({}, "latest.json")
    assert exit_code(raised.value) == 4
    assert str(raised.value) == (
        f"s3://{BUCKET} at {s3.url} refused to write '{BUCKET}/{prefix}/latest.json': access denied (AccessDenied); "
        f"the credentials (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY) need s3:PutObject on bucket '{BUCKET}'"
    )
    assert s3.keys(prefix) == []


def test_s3_an_endpoint_that_refuses_connections_is_retried_then_142(monkeypatch, caplog):
    monkeypatch.setattr(faults, "FIRST_DELAY", 0.01)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIA0000")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "x")
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        endpoint = f"http://127.0.0.1:{closed.getsockname()[1]}"
    with caplog.at_level(logging.WARNING, logger="trainer.core.faults"):
        with pytest.raises(StoreUnavailableError) as raised:
            Location(f"s3://{BUCKET}/p", endpoint).read_json("latest.json")
    assert exit_code(raised.value) == 142
    assert re.fullmatch(
        rf"s3://{BUCKET} at {endpoint}: read '{BUCKET}/p/latest.json': the store stayed throttled or unavailable "
        rf"through 5 attempts in \d+\.\d s \(last: EndpointConnectionError: .*\); {THROTTLED}",
        str(raised.value),
    ), raised.value
    assert sum("retrying in" in r.getMessage() for r in caplog.records) == 4


def test_s3_without_credentials_is_denied(monkeypatch):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        endpoint = f"http://127.0.0.1:{closed.getsockname()[1]}"
    with pytest.raises(DeniedError) as raised:
        Location(f"s3://{BUCKET}/p", endpoint).write_json({}, "latest.json")
    assert exit_code(raised.value) == 4
    assert str(raised.value) == (
        f"s3://{BUCKET} at {endpoint}: write '{BUCKET}/p/latest.json': no credentials found; give the task "
        "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (a Secret) or an IAM role"
    )


# --- GCS -----------------------------------------------------------------------------------------------------


class GcsStandIn:
    """The part of the GCS JSON API gcsfs uses to list, read, write and delete small objects; `refuse(method,
    name)` may answer an error instead ((status, reason, message) or None)."""

    def __init__(self):
        self.objects: dict[str, bytes] = {}
        self.requests: list[tuple[str, str]] = []
        self.refuse = lambda method, name: None
        self._served = serve(self, "127.0.0.1", 0)
        self.url = self._served.url

    def stop(self):
        self._served.stop()

    def __call__(self, environ, start_response):
        request = Request(environ)
        self.requests.append((request.method, request.full_path))
        return self._answer(request)(environ, start_response)

    @staticmethod
    def _json(body, status=200):
        return Response(json.dumps(body), status=status, content_type="application/json")

    def _item(self, bucket, name):
        data = self.objects[name]
        return {"kind": "storage#object", "bucket": bucket, "name": name, "size": str(len(data)), "generation": "1"}

    def _answer(self, request):
        path = request.path
        if path.startswith("/upload/storage/v1/b/"):
            bucket = path.split("/")[5]
            body = request.get_data()
            meta, _, rest = body.partition(b"\n\n")[2].partition(b"\n--==0==\n")
            data = rest.partition(b"\n\n")[2].removesuffix(b"\n--==0==--")
            return self._store(bucket, json.loads(meta)["name"], data)
        if path.startswith("/download/storage/v1/b/"):
            return self._get(path.split("/")[5], unquote(path.split("/o/", 1)[1]), media=True)
        parts = path.split("/")
        if path.startswith("/storage/v1/b/") and len(parts) >= 6 and parts[5] == "o":
            bucket, name = parts[4], unquote("/".join(parts[6:]))
            if not name:
                return self._list(bucket, request.args.get("prefix", ""), request.args.get("delimiter", ""))
            if request.method == "DELETE":
                return self._delete(bucket, name)
            return self._get(bucket, name, media=request.args.get("alt") == "media")
        return self._json({"error": {"code": 400, "message": f"the stand-in does not serve {path}"}}, 400)

    def _refused(self, method, name):
        refusal = self.refuse(method, name)
        if refusal is None:
            return None
        status, reason, message = refusal
        error = {"code": status, "message": message, "errors": [{"reason": reason, "message": message}]}
        return self._json({"error": error}, status)

    def _store(self, bucket, name, data):
        if refused := self._refused("PUT", name):
            return refused
        self.objects[name] = data
        return self._json(self._item(bucket, name))

    def _get(self, bucket, name, media):
        if refused := self._refused("GET", name):
            return refused
        if name not in self.objects:
            return self._json({"error": {"code": 404, "message": "No such object"}}, 404)
        return Response(self.objects[name]) if media else self._json(self._item(bucket, name))

    def _delete(self, bucket, name):
        if name not in self.objects:
            return self._json({"error": {"code": 404, "message": "No such object"}}, 404)
        del self.objects[name]
        return Response(status=204)

    def _list(self, bucket, prefix, delimiter):
        items, prefixes = [], set()
        for name in sorted(self.objects):
            if not name.startswith(prefix):
                continue
            rest = name[len(prefix) :]
            if delimiter and delimiter in rest:
                prefixes.add(prefix + rest.split(delimiter)[0] + delimiter)
            else:
                items.append(self._item(bucket, name))
        return self._json({"kind": "storage#objects", "items": items, "prefixes": sorted(prefixes)})


@pytest.fixture
def gcs(monkeypatch):
    standin = GcsStandIn()
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", standin.url)
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    yield standin
    standin.stop()


def test_gs_listings_are_fresh_a_file_another_writer_adds_is_listed(gcs, tmp_path):
    """The checkpoint manifest is built from a listing: one cached from before the epoch's files names none."""
    home = Location("gs://bkt/run/worker-0")
    other = Location("gs://bkt/run/worker-0")  # another process writing to the same home
    other.write_json({"epoch": 1}, "resume.json")
    assert home.children() == ["resume.json"]
    (tmp_path / "ckpt-2.index").write_bytes(b"i")
    (tmp_path / "ckpt-2.data-00000-of-00001").write_bytes(b"d")
    other.upload(str(tmp_path))
    assert home.children() == ["ckpt-2.data-00000-of-00001", "ckpt-2.index", "resume.json"]
    assert home.files() == ["ckpt-2.data-00000-of-00001", "ckpt-2.index", "resume.json"]
    assert not home.fs.dircache.use_listings_cache


def test_gs_a_quota_refusal_ends_5_and_a_permission_refusal_4(gcs):
    home = Location("gs://bkt/models")
    gcs.refuse = lambda method, name: (
        (403, "storageQuotaExceeded", "The project's storage quota is exceeded.") if name.endswith("a.json") else None
    )
    with pytest.raises(QuotaError) as raised:
        home.write_json({}, "a.json")
    assert exit_code(raised.value) == 5
    assert str(raised.value) == (
        "gs://bkt: write 'bkt/models/a.json': quota exceeded (403 Forbidden: The project's storage quota is "
        "exceeded); raise the quota or remove old files or versions there"
    )
    gcs.refuse = lambda method, name: (403, "forbidden", "caller does not have storage.objects.create access.")
    with pytest.raises(DeniedError) as raised:
        home.write_json({}, "b.json")
    assert exit_code(raised.value) == 4
    assert str(raised.value) == (
        "gs://bkt refused to write 'bkt/models/b.json': access denied (403); the credentials (the pod's Google "
        "service account (workload identity or GOOGLE_APPLICATION_CREDENTIALS)) need storage.objects.create on "
        "bucket 'bkt'"
    )
    assert gcs.objects == {}
    assert sum(1 for method, path in gcs.requests if method == "POST") == 2, "a refusal is not retried"


# --- GCS through TensorFlow's own client (the epoch checkpoints) -----------------------------------------------


class TensorFlowGcsStandIn:
    """GCS as TensorFlow's gs:// client reaches it: an HTTPS proxy (`https_proxy`) that accepts the tunnel to
    www.googleapis.com and answers inside it with a certificate of a test CA (`CURL_CA_BUNDLE`). Object metadata: 404,
    listings: empty, every upload: 503. `env()` is what a process needs to write gs:// through it."""

    def __init__(self, tmp_path: Path):
        import trustme

        ca = trustme.CA()
        self._context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ca.issue_cert("www.googleapis.com", "storage.googleapis.com").configure_cert(self._context)
        self._ca_file = tmp_path / "gcs-ca.pem"
        ca.cert_pem.write_to_path(str(self._ca_file))
        self.requests: list[str] = []
        self._server = socket.create_server(("127.0.0.1", 0))
        self._server.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def env(self, retries: int) -> dict[str, str]:
        return {
            "https_proxy": f"http://127.0.0.1:{self._server.getsockname()[1]}",
            "CURL_CA_BUNDLE": str(self._ca_file),
            "GOOGLE_AUTH_TOKEN_FOR_TESTING": "token",  # no metadata server
            "GCS_RETRY_CONFIG_MAX_RETRIES": str(retries),
            "GCS_RETRY_CONFIG_INIT_DELAY_TIME_US": "1000",
            "GCS_RETRY_CONFIG_MAX_DELAY_TIME_US": "2000",
        }

    def stop(self):
        self._stop.set()
        self._thread.join()
        self._server.close()

    def _serve(self):
        while not self._stop.is_set():
            with contextlib.suppress(TimeoutError):
                conn, _ = self._server.accept()
                conn.settimeout(30)
                threading.Thread(target=self._tunnel, args=(conn,), daemon=True).start()

    @staticmethod
    def _head(stream) -> list[str]:
        lines = []
        while (line := stream.readline()) not in (b"", b"\r\n"):
            lines.append(line.decode().strip())
        return lines

    def _tunnel(self, conn):
        with conn, contextlib.suppress(OSError):
            if not self._head(conn.makefile("rb"))[0].startswith("CONNECT www.googleapis.com:443 "):
                return
            conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            with self._context.wrap_socket(conn, server_side=True) as tls:
                stream = tls.makefile("rb")
                while head := self._head(stream):
                    method, target = head[0].split()[:2]
                    self.requests.append(f"{method} {target}")
                    length = [int(h.split(":")[1]) for h in head if h.lower().startswith("content-length:")]
                    stream.read(length[0] if length else 0)
                    if method == "GET" and "/o/" in target:
                        status, body = "404 Not Found", {"error": {"code": 404, "message": "No such object"}}
                    elif method == "GET":
                        status, body = "200 OK", {"kind": "storage#objects"}
                    else:
                        status, body = "503 Service Unavailable", {"error": {"code": 503, "message": "Backend Error"}}
                    data = json.dumps(body).encode()
                    reply = f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n"
                    tls.sendall(f"{reply}\r\n".encode() + data)


_WRITE_A_CHECKPOINT = """
import sys
import tensorflow as tf
from trainer.cluster.resume import CheckpointHome
from trainer.core.errors import exit_code
from trainer.training.callbacks import EpochCheckpoints, ThroughputHistory

module = tf.Module()
module.weights = tf.Variable(tf.zeros([1000]))
try:
    EpochCheckpoints(module, CheckpointHome("gs://bkt/run/worker-0"), ThroughputHistory(10)).write(3)
except Exception as err:
    print(f"error: {err}", file=sys.stderr)
    sys.exit(exit_code(err))
"""


@pytest.mark.slow  # TensorFlow in a process of its own: its gs:// client reads its retry settings once
def test_a_gs_checkpoint_write_that_tensorflows_own_retries_give_up_on_ends_142(tmp_path):
    """TensorFlow retries a 503 itself and then raises AbortedError "All N retry attempts failed": that is the
    store's fault (142, retried), not a bug (1) nor, under MultiWorkerMirroredStrategy, a lost peer (138)."""
    gcs = TensorFlowGcsStandIn(tmp_path)
    try:
        result = subprocess.run(
            [sys.executable, "-c", _WRITE_A_CHECKPOINT],
            env=dict(os.environ, PYTHONPATH=str(Path(__file__).parents[1]), TF_CPP_MIN_LOG_LEVEL="2", **gcs.env(2)),
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        gcs.stop()
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == 142 and len(errors) == 1, result.stderr[-3000:]
    assert re.fullmatch(
        r"error: write the checkpoint of epoch 3 to 'gs://bkt/run/worker-0/ckpt-3': the store is throttled or "
        r"unavailable \(AbortedError: All 2 retry attempts failed\. The last failure: Error executing an HTTP request: "
        rf"HTTP response code 503 with body .*\); {THROTTLED}",
        errors[0],
    ), errors[0]
    uploads = [r for r in gcs.requests if r.startswith("POST /upload/")]
    assert len(uploads) == 3, f"TensorFlow's client tried the upload 1 + 2 times itself: {gcs.requests}"


@pytest.mark.slow  # TensorFlow
def test_tensorflow_resource_exhausted_is_no_space_only_by_its_message_and_unavailable_a_stores_only_when_writing():
    import tensorflow as tf

    with pytest.raises(tf.errors.ResourceExhaustedError, match="OOM when allocating tensor") as oom:
        tf.zeros([2**40])  # 4 TiB: the allocator refuses at once
    too_many_files = tf.errors.ResourceExhaustedError(None, None, "/data/train-00001.tfrecord; Too many open files")
    for error in (oom.value, too_many_files):
        assert faults.classify(error, "write 'x'", store_operation=True) is None, "memory and files are not space"
    full = tf.errors.ResourceExhaustedError(None, None, "/ckpt/ckpt-3_temp/part-00000; No space left on device")
    assert exit_code(faults.classify(full, "write 'x'")) == 3

    unavailable = tf.errors.UnavailableError(None, None, "Error executing an HTTP request: libcurl code 7")
    deadline = tf.errors.DeadlineExceededError(None, None, "Error executing an HTTP request: libcurl code 28")
    retried = tf.errors.AbortedError(None, None, "All 10 retry attempts failed. The last failure: HTTP response 503")
    for error in (unavailable, deadline, retried):
        fault = faults.classify(error, "write the checkpoint of epoch 2 to 'gs://b/w/ckpt-2'", store_operation=True)
        assert isinstance(fault, StoreUnavailableError) and exit_code(fault) == 142, error
        assert str(fault).startswith(
            f"write the checkpoint of epoch 2 to 'gs://b/w/ckpt-2': the store is throttled or unavailable "
            f"({type(error).__name__}: "
        ), str(fault)
        assert faults.classify(error, "write 'x'") is None, "outside a store operation: a lost peer's, maybe"
    peer_lost = [
        tf.errors.UnavailableError(None, None, "Collective ops is aborted by: Socket closed"),
        tf.errors.UnavailableError(None, None, "Task /job:worker/replica:0/task:1 heartbeat timeout"),
        tf.errors.AbortedError(None, None, "The coordination service has stopped"),
    ]
    for error in peer_lost:
        assert faults.classify(error, "write 'x'", store_operation=True) is None, error


# --- the classifier on each provider's own errors ------------------------------------------------------------


def _s3_error(code: str, status: int, message: str = "m") -> BaseException:
    from botocore.exceptions import ClientError
    from s3fs.errors import translate_boto_error

    error = ClientError(
        {"Error": {"Code": code, "Message": message}, "ResponseMetadata": {"HTTPStatusCode": status}}, "PutObject"
    )
    return translate_boto_error(error)  # as s3fs raises it


def _gcs_error(code: int, reason: str = "", message: str = "m") -> BaseException:
    from gcsfs.retry import HttpError

    return HttpError({"code": code, "message": message, "errors": [{"reason": reason}]})


@pytest.mark.parametrize(
    ("error", "code", "line"),
    [
        (OSError(errno.EDQUOT, "Disk quota exceeded"), 5, "disk quota exceeded (EDQUOT); raise the quota"),
        (OSError(errno.ENOSPC, "No space left on device"), 3, NO_SPACE),
        (PermissionError(errno.EACCES, "Permission denied"), 4, "permission denied (EACCES); let the task's user"),
        (OSError(errno.EROFS, "Read-only file system"), 4, READ_ONLY),
        (_s3_error("SlowDown", 503, "Please reduce your request rate."), 142, "throttled or unavailable (503 SlowDown"),
        (_s3_error("InternalError", 500), 142, "the store is throttled or unavailable (500 InternalError: m)"),
        (_s3_error("AccessDenied", 403), 4, "access denied (403 AccessDenied: m)"),
        (_s3_error("SignatureDoesNotMatch", 403), 4, "access denied (403 SignatureDoesNotMatch"),
        (_s3_error("XMinioStorageFull", 507), 3, "the store has no space left (507 XMinioStorageFull"),
        (_gcs_error(429, "rateLimitExceeded"), 142, "throttled or unavailable (429: m, 429 rateLimitExceeded)"),
        (_gcs_error(503), 142, "the store is throttled or unavailable (503: m, 503)"),
        (_gcs_error(403, "quotaExceeded"), 5, "quota exceeded (403: m, 403 quotaExceeded)"),
        (ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused"), 142, "(ConnectionRefusedError: "),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_each_provider_error_is_named_with_its_exit_code(error, code, line):
    fault = faults.classify(error, "write 'x'")
    assert fault is not None and exit_code(fault) == code
    assert str(fault).startswith("write 'x': ") and line in str(fault), str(fault)


def test_what_is_no_storage_fault_is_left_as_it_is():
    assert faults.classify(FileNotFoundError(errno.ENOENT, "gone"), "read 'x'") is None
    assert faults.classify(ValueError("not JSON"), "read 'x'") is None
    assert faults.classify(_s3_error("NoSuchBucket", 404), "read 'x'") is None


def test_a_fault_the_client_has_retried_is_not_retried_again():
    calls = []

    def throttled():
        calls.append(1)
        raise _gcs_error(429)

    with pytest.raises(StoreUnavailableError, match=r"through its client's retries in \d+\.\d s \(last: 429"):
        faults.retrying(throttled, "gs://b: read 'k'", client_retried=lambda err: True)
    assert len(calls) == 1
