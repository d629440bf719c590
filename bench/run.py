"""`make bench`: throughput, scaling, where the time goes, time-to-accuracy and pipeline overhead, in one run.

    python bench/run.py            # full: Fashion-MNIST (Debian's IDX files), under 20 minutes on 2 cores
    python bench/run.py --quick    # the shipped sample, under 3 minutes: one sample per measurement, and without the
                                   # batch-128, parameter-server and unpacked all-reduce runs

Writes bench/results/<mode>.json, bench/results/<mode>.png and bench/results/<mode>.md; the full run also
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
    baseline_run,
    bench_env,
    bench_model,
    import_seconds,
    input_pipeline_rate,
    interleaved,
    matmul_gflops,
    model_train_flops_per_example,
    pipeline_overhead,
    train_run,
)
from bench.measure import (
    run as run_command,
)
from bench.report import markdown, plot  # noqa: E402

FASHION = "/usr/share/datasets/fashion-mnist"
FASHION_NAMES = "T-shirt/top,Trouser,Pullover,Dress,Coat,Sandal,Shirt,Sneaker,Bag,Ankle boot"


def process_age() -> float:
    """Seconds since this process started (Linux), so that the total includes the interpreter's start and imports."""
    try:
        with open("/proc/self/stat") as stat, open("/proc/uptime") as uptime:
            start_ticks = int(stat.read().rsplit(")", 1)[1].split()[19])
            return float(uptime.read().split()[0]) - start_ticks / os.sysconf("SC_CLK_TCK")
    except OSError:
        return 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = parser.parse_args()
    main_started, before_main = time.perf_counter(), process_age()
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

    from trainer.config import registry as settings
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
        "train_examples": meta["splits"]["train"]["num_examples"],
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
    results["ceiling_gflops"] = matmul_gflops()
    model = bench_model(meta)
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
    throughput = interleaved(
        {
            f"baseline, steps_per_execution {spe}": lambda i: baseline_run(data, epochs, examples, spe, True),
            "1 worker": lambda i: train_run(data, work, f"w1-{i}", 0, epochs, examples=examples),
            "2 workers": lambda i: train_run(data, work, f"w2-{i}", 2, epochs, examples=examples),
        },
        repeats=results["repeats"],
    )
    throughput["baseline"] = baseline_run(data, epochs, examples)
    if not args.quick:
        throughput["3 workers"] = train_run(data, work, "w3", 3, epochs, examples=examples)
        throughput["2 workers, batch 128 per worker"] = train_run(
            data, work, "w2-b128", 2, epochs, examples=examples, batch=128
        )
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
    single = train_run(
        data,
        work,
        "single-thread",
        0,
        epochs,
        examples=examples,
        env=bench_env(TF_NUM_INTRAOP_THREADS=1, TF_NUM_INTEROP_THREADS=2),
    )
    two = throughput["2 workers"]["step_seconds"]
    results["allreduce"] = {
        "single_thread_step_ms": single["step_seconds"] * 1e3,
        "two_worker_step_ms": two * 1e3,
        "cost_ms": (two - single["step_seconds"]) * 1e3,
        "gradient_tensors": len(model.trainable_variables),
    }
    if not args.quick:
        unpacked = train_run(data, work, "w2-unpacked", 2, epochs, "--pack-bytes", "1", examples=examples)
        results["allreduce"]["unpacked_step_ms"] = unpacked["step_seconds"] * 1e3
    section("all-reduce")
    if not args.quick:
        run = train_run(data, work, "tta", 2, 5, "--validate")
        target = 0.90
        hit = next((e for e in run["history"]["epochs"] if e.get("val_accuracy", 0) >= target), None)
        from trainer.evaluation.metrics import run as evaluate

        final = evaluate(run["model_dir"], str(data))["accuracy"]
        results["time_to_accuracy"] = {
            "epochs": 5,
            "target": target,
            "final_accuracy": final,
            "wall_seconds": run["wall_seconds"],
            "seconds_to_target": hit["elapsed"] if hit else None,
            "epoch_at_target": hit["epoch"] if hit else None,
            "val_accuracy": [e.get("val_accuracy") for e in run["history"]["epochs"]],
        }
        section("time to accuracy")
    results["pipeline"] = pipeline_overhead(work, epochs=3 if args.quick else 6, compiles=samples)
    section("pipeline overhead")
    out.mkdir(parents=True, exist_ok=True)
    plot(results, out / f"{mode}.png")
    results["bench_seconds"] = time.perf_counter() - started
    (out / f"{mode}.json").write_text(json.dumps(results, indent=2) + "\n")
    text = markdown(results)
    (out / f"{mode}.md").write_text(text)
    if mode == "full":
        (ROOT / "docs" / "benchmarks.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
