"""A SavedModel served the way TensorFlow Serving serves it, for the serving check (`trainer.serving.serving_check`).

    python -m trainer.tfserving --model-dir MODEL/saved_model [--name model]

TF Serving loads a SavedModel with the C++ loader into a session (tag `serve`), looks the request's signature up
in the MetaGraphDef's SignatureDefs (`serving_default` unless the request names another) and runs its input and
output tensors by name; it never runs the Python code, nor the object graph that `tf.saved_model.load` rebuilds.
This module does the same through TensorFlow's session loader, in a process of its own, and answers TF Serving's
REST API on loopback:

    GET  /v1/models/NAME            {"model_version_status": [{"version": "1", "state": "AVAILABLE", ...}]}
    GET  /v1/models/NAME/metadata   {"model_spec": ..., "metadata": {"signature_def": {"signature_def": {...}}}}
    POST /v1/models/NAME:predict    {"instances": [...]}  ->  {"predictions": [...]}   (errors: {"error": "..."})

Requests use TF Serving's row format: each instance is one example's value of the single input (or an object of
named inputs); with several outputs each prediction is an object of named outputs. It prints
`serving NAME on 127.0.0.1:PORT` once the model is loaded and serves until its standard input closes.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np

from trainer.config.flags import Parser
from trainer.core.entry import run_cli
from trainer.core.errors import UsageError

log = logging.getLogger(__name__)

SIGNATURE = "serving_default"
VERSION = "1"


class RequestError(ValueError):
    """A request TF Serving would refuse with HTTP 400; the message is its `error`."""


class ServedModel:
    """A SavedModel loaded into a session through its MetaGraphDef, as TF Serving's loader does."""

    def __init__(self, saved_model_dir: str) -> None:
        import tensorflow as tf

        self._tf = tf
        self.graph = tf.Graph()
        self.session = tf.compat.v1.Session(graph=self.graph)
        with self.graph.as_default():
            meta_graph = tf.compat.v1.saved_model.loader.load(self.session, ["serve"], saved_model_dir)
        self.signatures = dict(meta_graph.signature_def)

    def metadata(self, name: str) -> dict[str, Any]:
        """TF Serving's GetModelMetadata answer: every SignatureDef as proto JSON with proto field names."""
        from google.protobuf.json_format import MessageToDict

        signature_defs = {k: MessageToDict(v, preserving_proto_field_name=True) for k, v in self.signatures.items()}
        return {
            "model_spec": {"name": name, "signature_name": "", "version": VERSION},
            "metadata": {"signature_def": {"signature_def": signature_defs}},
        }

    def predict(self, request: Any) -> dict[str, Any]:
        """Answers a REST predict request in the row format; raises RequestError where TF Serving answers 400."""
        if not isinstance(request, dict) or "instances" not in request:
            raise RequestError("the request needs 'instances' (the row format)")
        name = request.get("signature_name") or SIGNATURE
        if name not in self.signatures:
            raise RequestError(
                f'Serving signature name: "{name}" not found in signature def; it has: {sorted(self.signatures)}'
            )
        signature = self.signatures[name]
        instances = request["instances"]
        if not isinstance(instances, list) or not instances:
            raise RequestError("'instances' must be a non-empty list")
        inputs = sorted(signature.inputs)
        if all(isinstance(i, dict) for i in instances):
            columns = {k: [i.get(k) for i in instances] for k in inputs}
        elif len(inputs) == 1:
            columns = {inputs[0]: instances}
        else:
            raise RequestError(f"the signature has inputs {inputs}: each instance must be an object naming them")
        feeds = {signature.inputs[k].name: self._tensor(k, v, signature.inputs[k]) for k, v in columns.items()}
        fetched = self.session.run({k: v.name for k, v in signature.outputs.items()}, feeds)
        rows = len(instances)
        for key, value in fetched.items():
            if np.ndim(value) == 0 or len(value) != rows:
                raise RequestError(f"output {key!r} has shape {np.shape(value)}, not one row per instance ({rows})")
        if len(fetched) == 1:
            (value,) = fetched.values()
            return {"predictions": value.tolist()}
        return {"predictions": [{k: v[i].tolist() for k, v in fetched.items()} for i in range(rows)]}

    def _tensor(self, key: str, values: list[Any], info: Any) -> np.ndarray:
        dtype = self._tf.dtypes.as_dtype(info.dtype)
        try:
            array = np.asarray(values)
        except ValueError as err:
            raise RequestError(f"input {key!r} is not a rectangular array: {err}") from None
        if dtype.is_integer:
            if array.dtype.kind not in "iu":
                raise RequestError(f"input {key!r} needs integers for {dtype.name}, got {array.dtype.name} values")
            if array.size and (array.min() < dtype.min or array.max() > dtype.max):
                raise RequestError(f"input {key!r} has values outside {dtype.name}'s range {dtype.min}..{dtype.max}")
        elif dtype.is_floating and array.dtype.kind not in "iuf":
            raise RequestError(f"input {key!r} needs numbers for {dtype.name}, got {array.dtype.name} values")
        expected = [d.size for d in info.tensor_shape.dim]
        if not info.tensor_shape.unknown_rank and (
            len(expected) != array.ndim or any(e not in (-1, a) for e, a in zip(expected, array.shape, strict=True))
        ):
            raise RequestError(f"input {key!r} has shape {list(array.shape)}; the signature takes {expected}")
        return array.astype(dtype.as_numpy_dtype)


def make_server(model: ServedModel, name: str, host: str = "127.0.0.1", port: int = 0) -> ThreadingHTTPServer:
    """An HTTP server answering TF Serving's REST API for `model` under /v1/models/`name`."""
    base = f"/v1/models/{name}"

    class Handler(BaseHTTPRequestHandler):
        def _answer(self, code: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path.rstrip("/") == base:
                status = {"error_code": "OK", "error_message": ""}
                self._answer(
                    200, {"model_version_status": [{"version": VERSION, "state": "AVAILABLE", "status": status}]}
                )
            elif self.path.rstrip("/") == f"{base}/metadata":
                self._answer(200, model.metadata(name))
            else:
                self._answer(404, {"error": f"no such path {self.path!r}"})

        def do_POST(self) -> None:
            if self.path != f"{base}:predict":
                self._answer(404, {"error": f"no such path {self.path!r}"})
                return
            try:
                request = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                self._answer(200, model.predict(request))
            except (RequestError, ValueError) as err:
                self._answer(400, {"error": str(err)})
            except model._tf.errors.OpError as err:
                self._answer(400, {"error": err.message.strip().splitlines()[0]})

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
            log.debug("%s %s", self.address_string(), format % args)

    return ThreadingHTTPServer((host, port), Handler)


def serve(saved_model_dir: str, name: str) -> None:
    """Loads the model, prints the address, and serves until standard input closes (the check is done)."""
    if not os.path.isfile(os.path.join(saved_model_dir, "saved_model.pb")):
        raise UsageError(f"{saved_model_dir!r} holds no saved_model.pb")
    server = make_server(ServedModel(saved_model_dir), name)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    host, port = server.server_address[:2]
    sys.stdout.write(f"serving {name} on {host}:{port}\n")
    sys.stdout.flush()
    sys.stdin.read()
    server.shutdown()


def main(argv: list[str] | None = None) -> int:
    """The serving process's entry point (`python -m trainer.tfserving`)."""
    parser = Parser(prog="python -m trainer.tfserving", description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", required=True, help="the SavedModel directory (holding saved_model.pb)")
    parser.add_argument("--name", default="model", help="the model's name in the REST paths (default: model)")

    def body() -> None:
        args = parser.parse_args(argv)
        serve(args.model_dir, args.name)

    return run_cli(body)


if __name__ == "__main__":
    sys.exit(main())
