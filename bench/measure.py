"""The measurements of `make bench`: each runs the real trainer or plain Keras in its own process and times it."""

import json
import os
import re
import statistics
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH_IMAGE = "registry.example.com/bench/kfp-tf-multiworker:0.1.0"
sys.path.insert(0, str(ROOT))


def bench_env(**extra):
    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
    env.pop("TF_CONFIG", None)
    env.update({k: str(v) for k, v in extra.items()})
    return env


def run_alone(doc, name, measure, render=None):
    """A bench section as its own command: `--quick`, `--out DIR`; writes DIR/<name>-<mode>.json (and .md: `render`).

    `measure(work, quick)` measures in DIR/tmp/<name>-<mode>; `render(results)` gives the page's lines, printed (the
    results as JSON without it).
    """
    import argparse

    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = parser.parse_args()
    mode = "quick" if args.quick else "full"
    out = Path(args.out)
    print(record(out, name, mode, measure(out / "tmp" / f"{name}-{mode}", args.quick), render))


def record(out, name, mode, results, render=None):
    """Writes a section's results as out/<name>-<mode>.json (and its page, .md: `render`); returns the page's text.

    `bench/run.py` records its sections with it too, so that every section's page is of the same run as the rest.
    """
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}-{mode}.json").write_text(json.dumps(results, indent=2) + "\n")
    if not render:
        return json.dumps(results, indent=2)
    text = "\n".join(render(results))
    (out / f"{name}-{mode}.md").write_text(text)
    return text


def pinned_to(cpus):
    """A `preexec_fn` pinning the new process (and every thread and child it starts) to `cpus`; None: not pinned."""
    if cpus is None:
        return None
    return lambda: os.sched_setaffinity(0, cpus)


def core(i):
    """The i-th CPU this process may run on, as a one-CPU set."""
    cores = sorted(os.sched_getaffinity(0))
    return {cores[i % len(cores)]}


def run(args, env=None, timeout=1800, cpus=None):
    started = time.perf_counter()
    result = subprocess.run(
        args,
        cwd=ROOT,
        env=env or bench_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=pinned_to(cpus),
    )
    if result.returncode:
        command = " ".join(map(str, args[:6]))
        raise SystemExit(f"benchmark step failed ({command}...):\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}")
    return result, time.perf_counter() - started


def steady(epochs, key="examples_per_second"):
    """Mean over the epochs after the first (the first traces and fills caches)."""
    values = [e[key] for e in epochs[1:]] or [e[key] for e in epochs]
    return statistics.mean(values)


def matmul_gflops(size=2048, repeats=20):
    import tensorflow as tf

    a = tf.random.normal([size, size])
    b = tf.random.normal([size, size])
    tf.matmul(a, b).numpy()
    started = time.perf_counter()
    for _ in range(repeats):
        c = tf.matmul(a, b)
    c.numpy()
    return 2 * size**3 * repeats / (time.perf_counter() - started) / 1e9


def bench_model(image_shape, num_classes):
    """The trainer's model for this dataset, built once to count its FLOPs and gradient tensors."""
    from trainer.modeling.cnn import build_model

    return build_model(tuple(image_shape), num_classes, 0.001)


def model_train_flops_per_example(model):
    """Forward multiply-adds of the CNN counted from its layers, x2 for FLOPs, x3 for forward + backward."""
    import tf_keras as keras

    forward = 0
    for layer in model.layers:
        if isinstance(layer, keras.layers.Conv2D):
            _, h, w, c = layer.output.shape
            kh, kw = layer.kernel_size
            forward += h * w * c * kh * kw * layer.input.shape[-1] * 2
        elif isinstance(layer, keras.layers.Dense):
            forward += layer.input.shape[-1] * layer.units * 2
    return 3 * forward


def input_pipeline_rate(data_dir, meta):
    """The training input pipeline alone, consumed inside TensorFlow (no Python per batch), after one warm-up epoch.

    One iterator throughout, as in training: the warm-up fills the cache, then two epochs are timed.
    """
    import tensorflow as tf

    from trainer.config.contract import DataConfig
    from trainer.data.inputs import train_dataset

    steps = meta.splits["train"].num_examples // 64
    ds = train_dataset(data_dir, meta, DataConfig(), 64, steps, 1, 0, 0)
    iterator = iter(ds)

    @tf.function
    def consume(count):
        for _ in tf.range(count):
            next(iterator)

    consume(tf.constant(steps))
    batches = 2 * steps
    started = time.perf_counter()
    consume(tf.constant(batches))
    return batches * 64 / (time.perf_counter() - started)


def import_seconds(statement, repeats=3):
    times = []
    for _ in range(repeats):
        _, seconds = run([sys.executable, "-c", statement])
        times.append(seconds)
    return statistics.median(times)


def train_run(data, work, name, workers, epochs, *extra, env=None, ps=0, examples=0, batch=64, cpus=None):
    """One trainer run through the launcher (or one process with `workers=0`); `examples` per epoch when set.

    The launcher pins each worker to its own core when there is one per worker; `cpus` pins the whole run.
    """
    model_dir = work / name
    args = [
        "--data",
        str(data),
        "--model-dir",
        str(model_dir),
        "--epochs",
        str(epochs),
        "--batch-size",
        str(batch),
        *extra,
    ]
    if examples:
        args += ["--steps-per-epoch", str(max(1, examples // (batch * max(workers, 1))))]
    if workers:
        command = [sys.executable, "-m", "trainer.launch", "--workers", str(workers), "--ps", str(ps), "--", *args]
    else:
        command = [sys.executable, "-m", "trainer.train", *args]
    _, wall = run(command, env=env, cpus=cpus)
    return _train_result(model_dir, wall)


def _train_result(model_dir, wall):
    history = json.loads((model_dir / "history.json").read_text())
    return {
        "examples_per_second": steady(history["epochs"]),
        "wall_seconds": wall,
        "history": history,
        "step_seconds": statistics.mean(e["seconds"] for e in history["epochs"][1:]) / history["steps_per_epoch"],
        "model_dir": str(model_dir),
    }


def independent_runs(data, work, name, processes, epochs, examples, batch=64):
    """`processes` one-worker trainings at once, each pinned to its own core.

    The machine's throughput with every core busy and nothing exchanged: the ceiling for that many workers.
    """
    procs, started = [], time.perf_counter()
    for i in range(processes):
        model_dir = work / f"{name}-{i}"
        command = [sys.executable, "-m", "trainer.train", "--data", str(data), "--model-dir", str(model_dir)]
        command += ["--epochs", str(epochs), "--batch-size", str(batch)]
        command += ["--steps-per-epoch", str(max(1, examples // batch))]
        procs.append(
            subprocess.Popen(
                command,
                cwd=ROOT,
                env=bench_env(),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
                preexec_fn=pinned_to(core(i)),
            )
        )
    for proc in procs:
        _, err = proc.communicate(timeout=1800)
        if proc.returncode:
            raise SystemExit(f"benchmark step failed (independent run):\n{err[-3000:]}")
    wall = time.perf_counter() - started
    runs = [_train_result(work / f"{name}-{i}", wall) for i in range(processes)]
    return {
        "examples_per_second": sum(r["examples_per_second"] for r in runs),
        "wall_seconds": wall,
        "step_seconds": statistics.mean(r["step_seconds"] for r in runs),
        "history": runs[0]["history"],
    }


class SystemCpu:
    """Samples /proc/stat twice a second while open.

    `share(start, end)` is the user/system/idle split between two Unix times (the machine's, every process included).
    """

    FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")

    def __enter__(self):
        import threading

        self.samples, self._stop = [], threading.Event()

        def sample():
            while not self._stop.wait(0.5):
                with open("/proc/stat") as stat:
                    values = [int(v) for v in stat.readline().split()[1:9]]
                self.samples.append((time.time(), values))

        self._thread = threading.Thread(target=sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def share(self, start, end):
        inside = [s for s in self.samples if start <= s[0] <= end]
        if len(inside) < 2:
            return None
        delta = [b - a for a, b in zip(inside[0][1], inside[-1][1], strict=True)]
        total = sum(delta) or 1
        parts = dict(zip(self.FIELDS, (d / total for d in delta), strict=True))
        return {
            "user": parts["user"] + parts["nice"],
            "system": parts["system"] + parts["irq"] + parts["softirq"],
            "idle": parts["idle"] + parts["iowait"],
            "seconds": inside[-1][0] - inside[0][0],
        }


def steady_cpu_share(sampler, history):
    """The machine's CPU split over a run's epochs after the first (from their `ended_at` times)."""
    epochs = history["epochs"]
    return sampler.share(epochs[0]["ended_at"], epochs[-1]["ended_at"])


def exchange_ms(kind, nbytes):
    """bench/exchange.py: milliseconds per exchange of `nbytes` between two processes on their own cores."""
    result, _ = run([sys.executable, "bench/exchange.py", kind, "--bytes", str(nbytes), "--rounds", "200"])
    return json.loads(result.stdout.strip().splitlines()[-1])["ms"]


def baseline_run(data, epochs, examples, steps_per_execution=1, same_settings=False):
    """Plain Keras on in-memory arrays; `same_settings`: the trainer's learning rate and cosine schedule too."""
    extra = ["--learning-rate", "0.002", "--cosine-decay"] if same_settings else []
    result, wall = run(
        [
            sys.executable,
            "bench/baseline.py",
            "--data",
            str(data),
            "--epochs",
            str(epochs),
            "--examples",
            str(examples),
            "--steps-per-execution",
            str(steps_per_execution),
            *extra,
        ]
    )
    baseline = json.loads(result.stdout.strip().splitlines()[-1])
    rate = baseline["examples_per_epoch"] / statistics.mean(baseline["epoch_seconds"][1:])
    return {"examples_per_second": rate, "epoch_seconds": baseline["epoch_seconds"], "wall_seconds": wall}


def interleaved(runs, repeats):
    """Runs each named measurement `repeats` times in turn (A B C A B C ...) and keeps the median run of each.

    The machine's speed drifts by ±10% over minutes; interleaving exposes every configuration to the same drift and
    the median drops a disturbed run, so the ratios between them hold better than single runs a few minutes apart.
    """
    samples = {name: [] for name in runs}
    for i in range(repeats):
        for name, measure in runs.items():
            samples[name].append(measure(i))
    chosen = {}
    for name, values in samples.items():
        ordered = sorted(values, key=lambda v: v["examples_per_second"])
        chosen[name] = dict(ordered[len(ordered) // 2], samples=[round(v["examples_per_second"], 1) for v in values])
    return chosen


def pipeline_overhead(work, epochs, compiles):
    compile_times = []
    for i in range(compiles):
        _, seconds = run(
            [
                sys.executable,
                "pipelines/mnist.py",
                "--compile",
                "--image",
                BENCH_IMAGE,
                "--output",
                str(work / f"p{i}.yaml"),
            ]
        )
        compile_times.append(seconds)
    result, wall = run(
        [
            sys.executable,
            "pipelines/mnist.py",
            "--local",
            "--num-workers",
            "2",
            "--epochs",
            str(epochs),
            "--output-dir",
            str(work / "pipeline"),
        ]
    )
    log = re.sub(r"\x1b\[[0-9;]*m", "", result.stdout + result.stderr)
    (work / "pipeline.log").write_text(log)
    stamps = {}
    for m in re.finditer(r"(\d\d:\d\d:\d\d\.\d+) - INFO - (?:Executing task|Task) '([\w-]+)'", log):
        clock, task = m.group(1), m.group(2)
        t = datetime.strptime(clock, "%H:%M:%S.%f")
        stamps.setdefault(task, []).append(t)
    spans = {task: (max(ts) - min(ts)).total_seconds() for task, ts in stamps.items() if len(ts) >= 2}
    training = max((s for t, s in spans.items() if "train-worker" in t), default=0.0)
    evaluation = spans.get("evaluate", 0.0)
    accuracy = float(re.search(r"test accuracy: ([0-9.]+)", result.stdout).group(1))
    return {
        "compile_seconds": statistics.median(compile_times),
        "local_run_seconds": wall,
        "epochs": epochs,
        "compiles": compiles,
        "task_seconds": spans,
        "training_seconds": training,
        "evaluation_seconds": evaluation,
        "overhead_seconds": wall - training - evaluation,
        "accuracy": accuracy,
    }
