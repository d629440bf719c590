"""The serving check before publishing, after TFX's InfraValidator (load the model in a server and query it).

A fresh process (`python -m trainer.tfserving`) loads the exported SavedModel the way TensorFlow Serving does (the
session loader, the `serving_default` SignatureDef by name) and answers TF Serving's REST API on loopback. This
process then asks it for the model's status and signature, sends held-out raw `uint8` images as
`{"instances": [...]}` and checks the answer: the signature's names, dtypes and shapes, one prediction per
instance with `probabilities` (one per class, finite, in [0, 1], summing to 1) and `class_ids` (their argmax), and
agreement with the evaluation, which loaded the same SavedModel through `tf.saved_model.load` in another
process. A model that fails any of it is not published; the result says which check failed and why.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

EXAMPLES = 256
LOAD_TIMEOUT = 300.0
SUM_TOLERANCE = 1e-3
AGREEMENT_TOLERANCE = 1e-4
NAME = "model"
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback only: no proxy from the env


@dataclasses.dataclass(frozen=True)
class Check:
    """One check of the serving check: its name, whether it passed, and what was seen."""

    name: str
    passed: bool
    detail: str


@dataclasses.dataclass(frozen=True)
class ServingCheck:
    """The serving check's result: whether every check passed, each check, how many images and how long.

    Attributes:
        passed: every check passed.
        summary: "passed: ..." or "failed: <check>: <why>" (the evaluate step's output and the model's metadata).
        reason: the first failed check and why; empty when passed.
        checks: every check that ran, in order.
        examples: held-out images sent.
        seconds: wall time, loading included.
    """

    passed: bool
    summary: str
    reason: str
    checks: tuple[Check, ...]
    examples: int
    seconds: float

    def to_json(self) -> dict[str, Any]:
        """The result as plain JSON-ready values."""
        return dataclasses.asdict(self)


class CheckFailed(Exception):
    """One check failed; the rest cannot run (the message is the detail)."""

    def __init__(self, check: str, detail: str) -> None:
        super().__init__(detail)
        self.check = check


class _Server:
    """The serving process: started, its address read from its first line, stopped by closing its stdin."""

    def __init__(self, saved_model_dir: str, timeout: float) -> None:
        import trainer

        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL=os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"))
        root = os.path.dirname(os.path.dirname(os.path.abspath(trainer.__file__)))
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
        self.stderr = tempfile.TemporaryFile(mode="w+")
        started = time.monotonic()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "trainer.serving.tfserving", "--model-dir", saved_model_dir, "--name", NAME],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            text=True,
            env=env,
        )
        first: list[str] = []
        reader = threading.Thread(target=lambda: first.append(self.process.stdout.readline()), daemon=True)
        reader.start()
        reader.join(timeout)
        self.load_seconds = time.monotonic() - started
        line = first[0].strip() if first else ""
        if not line.startswith(f"serving {NAME} on "):
            self.stop()
            if not first:
                raise CheckFailed("loads", f"the model did not load in a fresh process within {timeout:g}s")
            raise CheckFailed(
                "loads", f"the model did not load in a fresh process (exit {self.process.returncode}): {self._why()}"
            )
        self.url = f"http://{line.rsplit(' ', 1)[1]}/v1/models/{NAME}"

    def _why(self) -> str:
        self.stderr.seek(0)
        lines = [line.strip() for line in self.stderr.read().splitlines() if line.strip()]
        errors = [line for line in lines if line.startswith("error:")]
        return (errors or lines or ["no output"])[-1][:500]

    def request(self, path: str = "", body: Any = None) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, headers={"Content-Type": "application/json"})
        try:
            with _OPENER.open(req, timeout=120) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read() or b"{}")

    def stop(self) -> None:
        try:
            self.process.stdin.close()
            self.process.wait(timeout=20)
        except (OSError, subprocess.TimeoutExpired):
            self.process.kill()
            self.process.wait()


def _shape(info: dict[str, Any]) -> list[int]:
    return [int(d.get("size", -1)) for d in info.get("tensor_shape", {}).get("dim", [])]


def _check_signature(metadata: dict[str, Any], image_shape: tuple[int, ...], classes: int) -> str:
    signatures = metadata.get("metadata", {}).get("signature_def", {}).get("signature_def", {})
    if "serving_default" not in signatures:
        named = sorted(k for k in signatures if not k.startswith("__"))  # not __saved_model_init_op, TF's own
        raise CheckFailed("signature", f"no serving_default signature; the model has {named}")
    signature = signatures["serving_default"]
    inputs, outputs = signature.get("inputs", {}), signature.get("outputs", {})
    height, width, channels = image_shape
    wanted_in = [-1, height, width] if channels == 1 else [-1, height, width, channels]
    problems = []
    if list(inputs) != ["images"]:
        problems.append(f"inputs are {sorted(inputs)}, not ['images']")
    elif inputs["images"].get("dtype") != "DT_UINT8" or _shape(inputs["images"]) != wanted_in:
        got = f"{inputs['images'].get('dtype')} {_shape(inputs['images'])}"
        problems.append(f"input images is {got}, not raw DT_UINT8 images {wanted_in}")
    wanted_out = {"probabilities": ("DT_FLOAT", [-1, classes]), "class_ids": ("DT_INT64", [-1])}
    for name, (dtype, shape) in wanted_out.items():
        got = outputs.get(name)
        if got is None or got.get("dtype") != dtype or _shape(got) != shape:
            found = "missing" if got is None else f"{got.get('dtype')} {_shape(got)}"
            problems.append(f"output {name} is {found}, not {dtype} {shape}")
    if problems:
        raise CheckFailed("signature", "; ".join(problems))
    return f"serving_default: images DT_UINT8 {wanted_in} -> probabilities DT_FLOAT [-1, {classes}], class_ids DT_INT64"


def _check_predictions(predictions: Any, rows: int, classes: int) -> tuple[np.ndarray, np.ndarray]:
    if not isinstance(predictions, list) or len(predictions) != rows:
        got = len(predictions) if isinstance(predictions, list) else type(predictions).__name__
        raise CheckFailed("response", f"{got} predictions for {rows} instances")
    bad = [
        i
        for i, p in enumerate(predictions)
        if not isinstance(p, dict)
        or set(p) != {"probabilities", "class_ids"}
        or not isinstance(p["class_ids"], int)
        or not isinstance(p["probabilities"], list)
        or len(p["probabilities"]) != classes
        or not all(isinstance(v, float | int) and not isinstance(v, bool) for v in p["probabilities"])
    ]
    if bad:
        raise CheckFailed(
            "shapes and dtypes",
            f"{len(bad)} of {rows} predictions are not {{probabilities: {classes} numbers, class_ids: an integer}}, "
            f"e.g. #{bad[0]}: {json.dumps(predictions[bad[0]])[:200]}",
        )
    probabilities = np.array([p["probabilities"] for p in predictions], dtype=np.float64)
    return probabilities, np.array([p["class_ids"] for p in predictions])


def _verdicts(probabilities: np.ndarray, class_ids: np.ndarray, expected: np.ndarray) -> list[Check]:
    rows = len(probabilities)
    finite = np.isfinite(probabilities).all(axis=1)
    sums = np.where(finite, probabilities.sum(axis=1), np.nan)
    ok = finite & (probabilities >= 0).all(axis=1) & (probabilities <= 1).all(axis=1)
    ok &= np.abs(sums - 1) <= SUM_TOLERANCE
    worst = int(np.argmin(ok)) if not ok.all() else None
    verdicts = [
        Check(
            "probabilities sum to 1",
            bool(ok.all()),
            f"all {rows} rows finite, in [0, 1], summing to 1 within {SUM_TOLERANCE:g}"
            if ok.all()
            else f"{rows - int(ok.sum())} of {rows} rows are not (non-finite: {rows - int(finite.sum())}); "
            f"e.g. row {worst} sums to {sums[worst]:.6g}",
        )
    ]
    argmax = np.argmax(np.nan_to_num(probabilities, nan=-1.0), axis=1)
    same = int((argmax == class_ids).sum())
    verdicts.append(
        Check(
            "class_ids are the argmax",
            same == rows,
            f"{same} of {rows} class_ids equal the argmax of their probabilities",
        )
    )
    agree = int((class_ids == expected.argmax(axis=1)).sum())
    delta = float(np.nanmax(np.abs(probabilities - expected))) if finite.all() else float("nan")
    verdicts.append(
        Check(
            "agrees with the evaluation",
            agree == rows and delta <= AGREEMENT_TOLERANCE,
            f"{agree} of {rows} predicted classes equal the evaluation's; "
            f"largest probability difference {delta:.3g} (allowed {AGREEMENT_TOLERANCE:g})",
        )
    )
    return verdicts


def _session(
    saved_model_dir: str,
    timeout: float,
    rows: int,
    queries: Callable[[_Server, dict[str, Any]], list[Check]],
    passed: str,
) -> ServingCheck:
    """Serves the SavedModel in a fresh process, checks it loads and its status, then runs `queries` on it."""
    started = time.monotonic()
    checks: list[Check] = []
    server = None
    try:
        server = _Server(saved_model_dir, timeout)
        checks.append(Check("loads", True, f"in a fresh process in {server.load_seconds:.1f}s"))
        code, status = server.request()
        states = [s.get("state") for s in status.get("model_version_status", [])] if code == 200 else []
        if states != ["AVAILABLE"]:
            raise CheckFailed("status", f"HTTP {code}: {json.dumps(status)[:300]}")
        code, metadata = server.request("/metadata")
        if code != 200:
            raise CheckFailed("signature", f"metadata: HTTP {code}: {metadata.get('error', metadata)}")
        checks += queries(server, metadata)
    except CheckFailed as failure:
        checks.append(Check(failure.check, False, str(failure)))
    finally:
        if server is not None:
            server.stop()
    failed = [c for c in checks if not c.passed]
    reason = f"{failed[0].name}: {failed[0].detail}" if failed else ""
    summary = f"failed: {reason}" if failed else f"passed: {passed}"
    log.info("serving check %s", summary)
    return ServingCheck(not failed, summary, reason, tuple(checks), rows, round(time.monotonic() - started, 1))


def _predict(server: _Server, instances: list[Any]) -> list[Any]:
    code, answer = server.request(":predict", {"signature_name": "serving_default", "instances": instances})
    if code != 200:
        raise CheckFailed("response", f"HTTP {code}: {answer.get('error', answer)}")
    predictions = answer.get("predictions")
    if not isinstance(predictions, list) or len(predictions) != len(instances):
        got = len(predictions) if isinstance(predictions, list) else type(predictions).__name__
        raise CheckFailed("response", f"{got} predictions for {len(instances)} instances")
    return predictions


def run(saved_model_dir: str, images: np.ndarray, expected: np.ndarray, timeout: float = LOAD_TIMEOUT) -> ServingCheck:
    """Serves the built-in CNN's SavedModel in a fresh process, queries it with `images` and checks the answers.

    Args:
        saved_model_dir: the SavedModel directory (holding saved_model.pb).
        images: held-out raw images, uint8 `[n, height, width, channels]`.
        expected: the evaluation's probabilities for those images, `[n, classes]`.
        timeout: seconds the fresh process may take to load the model.

    Returns:
        The result, one `Check` per check that ran.
    """
    rows, classes = len(images), int(expected.shape[1])

    def queries(server: _Server, metadata: dict[str, Any]) -> list[Check]:
        checks = [Check("signature", True, _check_signature(metadata, tuple(images.shape[1:]), classes))]
        instances = (images[..., 0] if images.shape[-1] == 1 else images).tolist()
        probabilities, class_ids = _check_predictions(_predict(server, instances), rows, classes)
        checks.append(Check("response", True, f"{rows} predictions for {rows} instances"))
        checks.append(Check("shapes and dtypes", True, f"{classes} probabilities, 1 class id"))
        return checks + _verdicts(probabilities, class_ids, expected.astype(np.float64))

    return _session(
        saved_model_dir,
        timeout,
        rows,
        queries,
        f"{rows} held-out uint8 images as TF Serving REST instances to serving_default in a fresh process; shapes "
        f"and dtypes as signed, probabilities sum to 1, class_ids are their argmax, and all {rows} agree with the "
        "evaluation",
    )


def _listed(value: Any) -> Any:
    """An array as JSON values: numbers as they are, bytes (tf.string) as UTF-8 text, as TF Serving's REST API takes."""
    if isinstance(value, bytes):
        try:
            return value.decode()
        except UnicodeDecodeError:
            raise CheckFailed("response", "a string feature is not UTF-8 text (binary needs {'b64': ...})") from None
    if isinstance(value, list):
        return [_listed(v) for v in value]
    return value


def _instances(features: Any, inputs: dict[str, Any]) -> list[Any]:
    """TF Serving row-format instances of `features` (an array, or a dict of arrays by input name)."""
    if isinstance(features, dict):
        if set(features) != set(inputs):
            raise CheckFailed("signature", f"inputs are {sorted(inputs)}, the features are {sorted(features)}")
        rows = len(next(iter(features.values())))
        columns = {name: _listed(np.asarray(value).tolist()) for name, value in features.items()}
        return [{name: column[i] for name, column in columns.items()} for i in range(rows)]
    if len(inputs) != 1:
        raise CheckFailed("signature", f"inputs are {sorted(inputs)}; the features are one tensor")
    return _listed(np.asarray(features).tolist())


def _by_output(expected: dict[str, Any], outputs: list[str]) -> dict[str, np.ndarray]:
    """The Keras model's predictions by signature output name (one output on each side: whatever the names)."""
    if len(expected) == 1 and len(outputs) == 1:
        return {outputs[0]: np.asarray(next(iter(expected.values())), dtype=np.float64)}
    if set(expected) != set(outputs):
        raise CheckFailed("signature", f"outputs are {outputs}, the model's are {sorted(expected)}")
    return {name: np.asarray(expected[name], dtype=np.float64) for name in outputs}


def run_outputs(
    saved_model_dir: str, features: Any, expected: dict[str, Any], timeout: float = LOAD_TIMEOUT
) -> ServingCheck:
    """Serves a model_fn's SavedModel in a fresh process, queries it with `features` and compares with `expected`.

    The SavedModel's `serving_default` signature is the model's own (its inputs and outputs); each answer must be
    finite and equal the Keras model's prediction within a relative and absolute AGREEMENT_TOLERANCE.

    Args:
        saved_model_dir: the SavedModel directory (holding saved_model.pb).
        features: held-out examples' features, an array `[n, ...]` or a dict of them by input name.
        expected: the Keras model's predictions for them by output name (`Sample.predictions`).
        timeout: seconds the fresh process may take to load the model.
    """
    rows = len(next(iter(features.values()))) if isinstance(features, dict) else len(features)

    def queries(server: _Server, metadata: dict[str, Any]) -> list[Check]:
        signatures = metadata.get("metadata", {}).get("signature_def", {}).get("signature_def", {})
        if "serving_default" not in signatures:
            named = sorted(k for k in signatures if not k.startswith("__"))
            raise CheckFailed("signature", f"no serving_default signature; the model has {named}")
        inputs = signatures["serving_default"].get("inputs", {})
        outputs = sorted(signatures["serving_default"].get("outputs", {}))
        wanted = _by_output(expected, outputs)
        described = ", ".join(f"{n} {_shape(i)}" for n, i in sorted(inputs.items()))
        checks = [Check("signature", True, f"serving_default: {described} -> {', '.join(outputs)}")]
        predictions = _predict(server, _instances(features, inputs))
        checks.append(Check("response", True, f"{rows} predictions for {rows} instances"))
        try:
            columns = (
                {n: [p[n] for p in predictions] for n in outputs} if len(outputs) > 1 else {outputs[0]: predictions}
            )
            answers = {name: np.asarray(values, dtype=np.float64) for name, values in columns.items()}
        except (KeyError, TypeError, ValueError) as err:
            raise CheckFailed(
                "shapes and dtypes", f"predictions are not numbers of the signed outputs ({err})"
            ) from None
        for name in outputs:
            if answers[name].size != wanted[name].size:
                got, want = list(answers[name].shape), list(wanted[name].shape)
                raise CheckFailed("shapes and dtypes", f"output {name} has shape {got}, the model's {want}")
            wanted[name] = wanted[name].reshape(answers[name].shape)
        checks.append(Check("shapes and dtypes", True, ", ".join(f"{n} {list(answers[n].shape)}" for n in outputs)))
        finite = all(np.isfinite(a).all() for a in answers.values())
        delta = max(float(np.max(np.abs(answers[n] - wanted[n]))) for n in outputs)
        tolerance = {"rtol": AGREEMENT_TOLERANCE, "atol": AGREEMENT_TOLERANCE}
        agree = finite and all(np.allclose(answers[n], wanted[n], **tolerance) for n in outputs)
        checks.append(
            Check(
                "agrees with the evaluation",
                agree,
                f"all values finite: {finite}; largest difference from the Keras model's predictions {delta:.3g} "
                f"(allowed {AGREEMENT_TOLERANCE:g} + {AGREEMENT_TOLERANCE:g} x |value|)",
            )
        )
        return checks

    return _session(
        saved_model_dir,
        timeout,
        rows,
        queries,
        f"{rows} held-out examples as TF Serving REST instances to serving_default in a fresh process; shapes as "
        "signed, all finite and equal to the evaluated Keras model's predictions",
    )
