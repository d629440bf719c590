"""Workers past two: the scaling curve on this machine's cores, the all-reduce among 2 to 8 processes, and a model.

    python bench/curve.py            # Fashion-MNIST, 51,200 examples an epoch, 2 epochs for each N
    python bench/curve.py --quick    # the shipped sample, 2 and 4 processes exchanging

What it measures, each in its own processes:

- the curve: examples/s in epoch 2 for N = 1, 2, 4, 8, 16 workers, as many as the machine has cores (`trainer-launch`
  pins each worker to its own core and runs it on one thread; N = 1 is one `trainer-train` pinned to one core);
- the exchange: `bench/exchange.py collective` for N = 2..8 processes (round-robin on the cores there are), TF's
  ring all-reduce of the model's gradients (one pack, float32) and of 4 KB, milliseconds per all-reduce;
- the wait for the slowest: every step's time of one plain tf-keras worker pinned to one core on one thread
  (`bench/baseline.py --step-times`); with N workers a step lasts as long as the slowest of N such steps.

The model: a step of N workers lasts `t1 + exchange(N) + wait(N)`, where `t1` is one pinned worker's step,
`exchange(N)` the ring's `c + 2 (N - 1) (alpha + bytes / (N bandwidth))` fitted to the exchange measurements, and
`wait(N)` the mean of the slowest of N steps drawn from the measured ones less the mean step. It predicts this
machine's curve, and the recorded 16-core curve (`RECORDED`) from that machine's one-worker rate; where it misses,
the per-message cost that curve implies is fitted from the curve itself. Writes bench/results/curve-<mode>.json and
.md; `bench/run.py` runs `measure` as its section.
"""

import json
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.measure import run, run_alone, train_run  # noqa: E402 - the project's root must be importable first

FASHION = "/usr/share/datasets/fashion-mnist"
BATCH = 64
EPOCHS = 2
WORKER_COUNTS = (1, 2, 4, 8, 16)
EXCHANGE_WORKERS = {"full": (2, 3, 4, 5, 6, 7, 8), "quick": (2, 4)}
EXAMPLES = {"full": 51_200, "quick": 6_400}
SMALL_BYTES = 4096
WAIT_DRAWS = 20_000
TARGET_EFFICIENCY = 0.8
# Measured on 005386c, 2026-12-04, by the procedure of ../shared/notes/many-cores.md (examples/s in epoch 2, each
# worker on its own core, 1 intra-op thread, 51,200 Fashion-MNIST examples an epoch); 2 workers gave 1,979 and, on
# a second run, 0.61 efficiency.
RECORDED = {
    "machine": "16-core x86-64 VM with a user-space kernel (gVisor), no TensorFlow installed but the trainer's",
    "commit": "005386c",
    "examples_per_second": {1: 1374, 2: 1979, 4: 3639, 8: 6319, 16: 11137},
}


def ring_messages(workers: int) -> int:
    """Messages each worker sends in turn in a ring all-reduce: N - 1 to reduce-scatter, N - 1 to all-gather."""
    return 2 * (workers - 1)


def fit_ring(exchanges: list[dict]) -> dict:
    """`c`, `alpha` (ms a message) and `ms_per_mb` fitted to `{"workers", "bytes", "ms"}` all-reduce measurements.

    The ring sends 2 (N - 1) messages in turn, each of 1/N of the tensor: `ms = c + 2 (N - 1) (alpha + bytes / N *
    ms_per_byte)`; least squares over every measurement.
    """
    import numpy as np

    rows = [
        [1.0, ring_messages(e["workers"]), ring_messages(e["workers"]) * e["bytes"] / e["workers"] / 1e6]
        for e in exchanges
    ]
    ms = [e["ms"] for e in exchanges]
    (c, alpha, per_mb), *_ = np.linalg.lstsq(np.array(rows), np.array(ms), rcond=None)
    return {"c_ms": float(c), "alpha_ms": float(alpha), "ms_per_mb": float(per_mb)}


def ring_ms(fit: dict, workers: int, nbytes: int) -> float:
    """The fitted ring's milliseconds for one all-reduce of `nbytes` among `workers`."""
    messages = ring_messages(workers)
    return fit["c_ms"] + messages * (fit["alpha_ms"] + nbytes / workers / 1e6 * fit["ms_per_mb"])


def wait_ms(step_seconds: list[float], workers: int, draws: int = WAIT_DRAWS, seed: int = 0) -> float:
    """Mean of the slowest of `workers` steps drawn from `step_seconds`, less their mean, in milliseconds."""
    import numpy as np

    steps = np.asarray(step_seconds)
    drawn = np.random.default_rng(seed).choice(steps, size=(draws, workers))
    return 1e3 * float(drawn.max(axis=1).mean() - steps.mean())


def predicted_rate(one_worker_rate: float, workers: int, overhead_ms: float, batch: int = BATCH) -> float:
    """Examples/s of `workers` whose step is one worker's (from its rate) plus `overhead_ms`."""
    step_ms = 1e3 * batch / one_worker_rate + overhead_ms
    return workers * batch / step_ms * 1e3


def overhead_ms(rate: float, one_worker_rate: float, workers: int, batch: int = BATCH) -> float:
    """What a step of `workers` at `rate` examples/s takes beyond one worker's step."""
    return 1e3 * batch * (workers / rate - 1 / one_worker_rate)


def fit_curve(rates: dict[int, float]) -> dict:
    """`c_ms` and `alpha_ms` of `overhead = c + 2 (N - 1) alpha` fitted to a curve's `{N: examples/s}` (N = 1 too)."""
    import numpy as np

    points = [(n, overhead_ms(rate, rates[1], n)) for n, rate in rates.items() if n > 1]
    rows = np.array([[1.0, ring_messages(n)] for n, _ in points])
    (c, alpha), *_ = np.linalg.lstsq(rows, np.array([o for _, o in points]), rcond=None)
    errors = [c + alpha * ring_messages(n) - o for n, o in points]
    return {"c_ms": float(c), "alpha_ms": float(alpha), "largest_error_ms": max(abs(e) for e in errors)}


def model(curve: dict[int, float], exchange: list[dict], step_seconds: list[float], gradient_bytes: int) -> dict:
    """The model's parts, its predictions for this machine's curve and the recorded one, and the recorded fit."""
    ring = fit_ring(exchange)
    counts = sorted(set(curve) | set(RECORDED["examples_per_second"]))

    def parts(n):
        return {"exchange_ms": ring_ms(ring, n, gradient_bytes), "wait_ms": wait_ms(step_seconds, n)}

    def prediction(rates):
        rows = {}
        for n, rate in rates.items():
            if n == 1:
                continue
            part = parts(n)
            predicted = predicted_rate(rates[1], n, part["exchange_ms"] + part["wait_ms"])
            rows[n] = {
                **part,
                "measured_overhead_ms": overhead_ms(rate, rates[1], n),
                "predicted": predicted,
                "measured": rate,
                "predicted_efficiency": predicted / (n * rates[1]),
                "measured_efficiency": rate / (n * rates[1]),
            }
        return rows

    recorded = RECORDED["examples_per_second"]
    recorded_fit = fit_curve(recorded)
    one_step_ms = 1e3 * BATCH / recorded[1]
    allowed_ms = one_step_ms * (1 / TARGET_EFFICIENCY - 1)
    return {
        "ring": ring,
        "here": prediction(curve) if 1 in curve and len(curve) > 1 else {},
        "recorded": prediction(recorded),
        "recorded_fit": recorded_fit,
        "eight_workers": {
            "one_step_ms": one_step_ms,
            "allowed_overhead_ms": allowed_ms,
            "recorded_overhead_ms": overhead_ms(recorded[8], recorded[1], 8),
            "alpha_ms_allowed": (allowed_ms - recorded_fit["c_ms"]) / ring_messages(8),
        },
        "counts": counts,
    }


def prepare(work: Path, quick: bool) -> Path:
    data = work / "data"
    source = ["--source", "sample"] if quick else ["--source", f"idx:{FASHION}"]
    run([sys.executable, "-m", "trainer.prepare", *source, "--output", str(data)])
    return data


def exchange_runs(counts, gradient_bytes: int) -> list[dict]:
    rows = []
    for workers in counts:
        for nbytes in (SMALL_BYTES, gradient_bytes):
            result, _ = run(
                [sys.executable, "bench/exchange.py", "collective", "--bytes", str(nbytes), "--rounds", "200"]
                + ["--workers", str(workers)]
            )
            rows.append(json.loads(result.stdout.strip().splitlines()[-1]))
    return rows


def step_times(data: Path, examples: int) -> list[float]:
    from bench.measure import core

    result, _ = run(
        [sys.executable, "bench/baseline.py", "--data", str(data), "--epochs", "2", "--examples", str(examples)]
        + ["--threads", "1", "--step-times", "--learning-rate", "0.002"],
        cpus=core(0),
    )
    return json.loads(result.stdout.strip().splitlines()[-1])["step_seconds"]


def measure(work: Path, quick: bool = False, data: Path | None = None) -> dict:
    """The curve on this machine's cores, the exchanges, the steps' spread and the model; returns the results."""
    from bench.measure import bench_model, core
    from trainer.data.tfrecords import load_metadata

    mode = "quick" if quick else "full"
    work.mkdir(parents=True, exist_ok=True)
    data = data or prepare(work, quick)
    meta = load_metadata(str(data))
    examples = min(EXAMPLES[mode], meta.splits["train"].num_examples)
    gradient_bytes = 4 * bench_model(meta.image_shape, meta.num_classes).count_params()
    cores = len(os.sched_getaffinity(0))
    curve = {}
    for n in (n for n in WORKER_COUNTS if n <= cores):
        workers, cpus = (0, core(0)) if n == 1 else (n, None)
        trained = train_run(data, work, f"curve-{n}", workers, EPOCHS, examples=examples, batch=BATCH, cpus=cpus)
        curve[n] = trained["examples_per_second"]
    exchange = exchange_runs(EXCHANGE_WORKERS[mode], gradient_bytes)
    steps = step_times(data, examples)
    return {
        "mode": mode,
        "cores": cores,
        "examples_per_epoch": examples,
        "gradient_bytes": gradient_bytes,
        "curve": curve,
        "exchange": exchange,
        "steps": {
            "count": len(steps),
            "mean_ms": 1e3 * statistics.mean(steps),
            "p50_ms": 1e3 * statistics.median(steps),
            "p99_ms": 1e3 * sorted(steps)[int(0.99 * (len(steps) - 1))],
        },
        "model": model(curve, exchange, steps, gradient_bytes),
        "recorded": RECORDED,
        "target_efficiency": TARGET_EFFICIENCY,
    }


if __name__ == "__main__":
    from bench.report import curve_lines

    run_alone(__doc__, "curve", measure, curve_lines)
