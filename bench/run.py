"""`make bench`: throughput, scaling, time-to-accuracy, preparing, data at scale, pipeline overhead: one run.

    python bench/run.py            # full: Fashion-MNIST (Debian's IDX files) and a generated 2 GB dataset: about
                                   # 25 minutes on 2 cores
    python bench/run.py --quick    # the shipped sample, under 5 minutes: one sample per measurement, and without the
                                   # 3-worker, parameter-server and time-to-accuracy runs

Preparing in parallel (`bench/prepare.py`, which runs alone too) prepares Fashion-MNIST repeated to 2.4 M examples
(600 k in the quick run) with 1 and with 2 processes. Data at scale (`bench/scale.py`, which runs alone too) trains
on a generated 2.16 GB dataset (216 MB in the quick run) from memory, streamed from disk and from moto's S3 server.
Workers past two (`bench/curve.py`, which runs alone too) takes the curve on this machine's cores, TensorFlow's ring
all-reduce among 2 to 8 processes and the model that predicts the 16-core curve recorded in it.
Writes bench/results/<mode>.json, bench/results/<mode>.png and bench/results/<mode>.md, and the pages of the three
sections that also run alone (bench/results/{prepare,scale,curve}-<mode>.{json,md}) from this run; the full run also
regenerates docs/benchmarks.md. Every ratio in the table comes from this one run on this one machine.
"""

import argparse
import json
import os
import platform
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.measure import (  # noqa: E402 - the project's root must be importable first
    ROOT,
    SystemCpu,
    baseline_run,
    bench_model,
    core,
    exchange_ms,
    import_seconds,
    independent_runs,
    input_pipeline_rate,
    interleaved,
    matmul_gflops,
    model_train_flops_per_example,
    pipeline_overhead,
    record,
    steady_cpu_share,
    train_run,
)
from bench.measure import (
    run as run_command,
)
from bench.report import (  # noqa: E402
    INDEPENDENT,
    PINNED_ONE,
    curve_lines,
    markdown,
    plot,
    prepare_lines,
    scale_lines,
)
from trainer.core.processes import process_seconds  # noqa: E402

FASHION = "/usr/share/datasets/fashion-mnist"
FASHION_NAMES = "T-shirt/top,Trouser,Pullover,Dress,Coat,Sandal,Shirt,Sneaker,Bag,Ankle boot"


def time_to_accuracy(data, work, learning_rate, target=0.90, epochs=5):
    """2 workers (the launcher pins each to its own core) against 1 worker pinned to one core, to `target`.

    Both train with global batch 128 and the same learning rate: the 2-worker run's rule (the peak rate times
    sqrt(2) for its doubled global batch) given to the 1-worker run explicitly. Time to the target counts training
    only (each epoch's validation pass is left out) up to the first epoch whose test accuracy reaches it.
    """
    from trainer.evaluation.metrics import evaluate

    rate = learning_rate * 2**0.5
    runs = {
        "2 workers": train_run(data, work, "tta-2", 2, epochs, "--validate"),
        "1 worker": train_run(
            data, work, "tta-1", 0, epochs, "--validate", "--learning-rate", str(rate), batch=128, cpus=core(0)
        ),
    }
    out = {"target": target, "epochs": epochs, "learning_rate": rate, "global_batch": 128}
    for name, run in runs.items():
        training, reached = 0.0, None
        for e in run["history"]["epochs"]:
            training += e["seconds"] - e.get("validation_seconds", 0.0)
            if e.get("val_accuracy", 0) >= target:
                reached = {"epoch": e["epoch"], "training_seconds": training}
                break
        out[name] = {
            "reached": reached,
            "val_accuracy": [e.get("val_accuracy") for e in run["history"]["epochs"]],
            "final_accuracy": evaluate(run["model_dir"], str(data)).accuracy,
            "wall_seconds": run["wall_seconds"],
            "examples_per_second": statistics.mean(
                run["history"]["global_batch_size"]
                * run["history"]["steps_per_epoch"]
                / (e["seconds"] - e.get("validation_seconds", 0.0))
                for e in run["history"]["epochs"][1:]
            ),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = parser.parse_args()
    main_started, before_main = time.perf_counter(), process_seconds()
    started = main_started - before_main
    print(f"bench started {datetime.now(timezone.utc):%H:%M:%S} UTC", flush=True)
    mode = "quick" if args.quick else "full"
    out = Path(args.out)
    work = out / "tmp" / mode
    if work.exists():
        import shutil

        shutil.rmtree(work)
    work.mkdir(parents=True)
    import tensorflow as tf

    from trainer.config import settings
    from trainer.data.tfrecords import load_metadata

    if args.quick:
        data, dataset, epochs = work / "data", "shipped MNIST sample", 2
        run_command([sys.executable, "-m", "trainer.prepare", "--source", "sample", "--output", str(data)])
    else:
        data, dataset, epochs = work / "data", "Fashion-MNIST", 2
        run_command(
            [
                sys.executable,
                "-m",
                "trainer.prepare",
                "--source",
                f"idx:{FASHION}",
                "--output",
                str(data),
                "--class-names",
                FASHION_NAMES,
            ]
        )
    meta = load_metadata(str(data))
    results = {
        "mode": mode,
        "dataset": dataset,
        "epochs": epochs,
        "train_examples": meta.splits["train"].num_examples,
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": {
            "cores": os.cpu_count(),
            "processor": platform.processor() or platform.machine(),
            "tensorflow": tf.__version__,
        },
    }
    sections = results["section_seconds"] = {"python start-up": before_main}
    mark = main_started

    def section(name):
        nonlocal mark
        now = time.perf_counter()
        sections[name] = now - mark
        mark = now
        print(f"{name}: {sections[name]:.0f} s", flush=True)

    section("data preparation")
    from bench.prepare import measure as prepare_in_parallel

    results["prepare"] = prepare_in_parallel(work / "prepare", quick=args.quick)
    record(out, "prepare", mode, results["prepare"], prepare_lines)
    section("preparing in parallel")
    from bench.scale import measure as at_scale

    results["scale"] = at_scale(work / "scale", quick=args.quick)
    record(out, "scale", mode, results["scale"], scale_lines)
    section("data at scale")
    results["ceiling_gflops"] = matmul_gflops()
    model = bench_model(meta.image_shape, meta.num_classes)
    results["train_flops_per_example"] = model_train_flops_per_example(model)
    samples = 1 if args.quick else 3
    results["startup"] = {
        "import_tensorflow_s": import_seconds("import tensorflow", samples),
        "import_tf_keras_s": import_seconds("import tensorflow, tf_keras", samples),
    }
    results["input_pipeline_examples_per_second"] = input_pipeline_rate(str(data), meta)
    section("ceiling, imports and input pipeline")
    examples = min(results["train_examples"], 12_800)
    results["examples_per_epoch"] = examples
    results["repeats"] = samples
    results["steps_per_execution"] = spe = settings.default("steps_per_execution")
    results["gradient_bytes"] = gradient_bytes = 4 * model.count_params()

    def watched(run):
        """A run with the machine's CPU split sampled over its epochs after the first."""
        with SystemCpu() as cpu:
            result = run()
        result["cpu"] = steady_cpu_share(cpu, result["history"])
        return result

    throughput = interleaved(
        {
            f"baseline, steps_per_execution {spe}": lambda i: baseline_run(data, epochs, examples, spe, True),
            "1 worker": lambda i: watched(lambda: train_run(data, work, f"w1-{i}", 0, epochs, examples=examples)),
            "2 workers": lambda i: watched(lambda: train_run(data, work, f"w2-{i}", 2, epochs, examples=examples)),
            PINNED_ONE: lambda i: train_run(data, work, f"p1-{i}", 0, epochs, examples=examples, cpus=core(0)),
        },
        repeats=results["repeats"],
    )
    throughput["baseline"] = baseline_run(data, epochs, examples)
    throughput[INDEPENDENT] = independent_runs(data, work, "independent", 2, epochs, examples)
    if not args.quick:
        throughput["3 workers"] = train_run(data, work, "w3", 3, epochs, examples=examples)
        throughput["parameter server: chief + 1 ps + 2 workers"] = train_run(
            data, work, "ps", 2, epochs, ps=1, examples=examples
        )
    one_worker = throughput["1 worker"]["history"]["epochs"][1:]
    results["checkpoint"] = {
        "ms_per_epoch": 1e3 * statistics.mean(e["checkpoint_seconds"] for e in one_worker),
        "share_of_epoch": statistics.mean(e["checkpoint_seconds"] / e["seconds"] for e in one_worker),
    }
    results["throughput"] = {k: {kk: vv for kk, vv in v.items() if kk != "history"} for k, v in throughput.items()}
    section("throughput")
    synced = watched(lambda: train_run(data, work, "w2-synced", 2, epochs, "--sync-batch-metrics", examples=examples))
    results["allreduce"] = {
        "socket_floor_ms": exchange_ms("socket", gradient_bytes),
        "collective_ms": exchange_ms("collective", gradient_bytes),
        "pinned_one_step_ms": throughput[PINNED_ONE]["step_seconds"] * 1e3,
        "independent_step_ms": throughput[INDEPENDENT]["step_seconds"] * 1e3,
        "two_worker_step_ms": throughput["2 workers"]["step_seconds"] * 1e3,
        "synced_step_ms": synced["step_seconds"] * 1e3,
        "synced_examples_per_second": synced["examples_per_second"],
        "synced_cpu": synced["cpu"],
        "gradient_tensors": len(model.trainable_variables),
    }
    section("all-reduce")
    from bench.curve import measure as past_two

    results["curve"] = past_two(work / "curve", quick=args.quick, data=data)
    record(out, "curve", mode, results["curve"], curve_lines)
    section("workers past two")
    if not args.quick:
        results["time_to_accuracy"] = time_to_accuracy(data, work, settings.default("learning_rate"))
        section("time to accuracy")
    results["pipeline"] = pipeline_overhead(work, epochs=3 if args.quick else 6, compiles=samples)
    section("pipeline overhead")
    from bench.handover import measure as handover

    results["handover"] = handover(work / "handover", (256 if args.quick else 2048) << 20)
    section("checkpoint hand-over")
    out.mkdir(parents=True, exist_ok=True)
    results["bench_seconds"] = time.perf_counter() - started
    (out / f"{mode}.json").write_text(json.dumps(results, indent=2) + "\n")
    plot(results, out / f"{mode}.png")
    text = markdown(results)
    (out / f"{mode}.md").write_text(text)
    if mode == "full":
        (ROOT / "docs" / "benchmarks.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
