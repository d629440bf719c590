"""What `make bench` writes: the goals and their verdicts, the Markdown page and the throughput plot."""

import operator
import statistics


def plot(results, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = results["throughput"]
    labels = list(rows)
    values = [rows[k]["examples_per_second"] for k in labels]
    fig, ax = plt.subplots(figsize=(8, 3.6), dpi=100)
    bars = ax.barh(
        labels[::-1], values[::-1], color=["#888" if k.startswith("baseline") else "#2a7" for k in labels[::-1]]
    )
    for bar, value in zip(bars, values[::-1], strict=True):
        ax.text(value, bar.get_y() + bar.get_height() / 2, f" {value:.0f}", va="center")
    ax.set_xlabel("training examples/s")
    ax.set_xlim(0, max(values) * 1.15)
    ax.set_title(f"{results['dataset']} on {results['machine']['cores']} cores ({results['mode']} run)")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


GOALS = {
    "1 worker ≥ 0.95× plain Keras with the same settings": ("one_worker_ratio", 0.95, operator.ge),
    "2 workers on this machine ≥ 0.8× plain Keras with the same settings": ("two_worker_ratio", 0.8, operator.ge),
    "input pipeline ≥ 10× training throughput": ("input_pipeline_ratio", 10.0, operator.ge),
    "Fashion-MNIST ≥ 0.92 test accuracy within 5 epochs": ("fashion_accuracy", 0.92, operator.ge),
    "local pipeline overhead ≤ 30 s": ("pipeline_overhead_seconds", 30.0, operator.le),
    "compile ≤ 3 s": ("compile_seconds", 3.0, operator.le),
}


def reference(results):
    """The honest baseline: plain Keras in one process given the trainer's own steps_per_execution."""
    return results["throughput"][f"baseline, steps_per_execution {results['steps_per_execution']}"]


def ratio(results, name):
    """NAME's throughput over the reference: the median of the per-round ratios when both ran in the same rounds.

    Pairing each run with the reference run of its own round cancels the machine's drift between rounds; a row
    measured once is divided by the reference's median run.
    """
    row, base = results["throughput"][name], reference(results)
    if row.get("samples") and len(row["samples"]) == len(base.get("samples") or ()):
        return statistics.median(a / b for a, b in zip(row["samples"], base["samples"], strict=True))
    return row["examples_per_second"] / base["examples_per_second"]


def goal_values(results):
    """The measured value behind each goal (None when this run did not measure it)."""
    one = results["throughput"]["1 worker"]["examples_per_second"]
    tta = results.get("time_to_accuracy")
    judged = results["mode"] == "full"
    return {
        "one_worker_ratio": ratio(results, "1 worker") if judged else None,
        "two_worker_ratio": ratio(results, "2 workers") if judged else None,
        "input_pipeline_ratio": results["input_pipeline_examples_per_second"] / one,
        "fashion_accuracy": tta["final_accuracy"] if tta else None,
        "pipeline_overhead_seconds": results["pipeline"]["overhead_seconds"],
        "compile_seconds": results["pipeline"]["compile_seconds"],
    }


def goals_met(results):
    """{goal: (value, met)} for every goal this run measured."""
    values = goal_values(results)
    met = {}
    for goal, (key, limit, within) in GOALS.items():
        if values[key] is not None:
            met[goal] = (values[key], within(values[key], limit))
    if "bench_seconds" in results:
        limit = 3 if results["mode"] == "quick" else 20
        minutes = results["bench_seconds"] / 60
        met[f"`make bench{' ARGS=--quick' if results['mode'] == 'quick' else ''}` ≤ {limit} minutes"] = (
            minutes,
            minutes <= limit,
        )
    return met


def markdown(results):
    """The results page: goals, throughput and scaling, where the time goes, time to accuracy, pipeline overhead."""
    r = results
    lines = [
        f"# Benchmarks ({r['mode']} run)",
        "",
        f"Measured {r['date']} by `make bench{' ARGS=--quick' if r['mode'] == 'quick' else ''}` on "
        f"{r['machine']['cores']} CPU cores "
        f"({r['machine']['processor']}), TensorFlow {r['machine']['tensorflow']}, no GPU. Dataset: {r['dataset']} "
        f"({r['train_examples']} training examples). Throughput runs: {r['epochs']} epochs of "
        f"{r['examples_per_epoch']} examples, "
        "batch 64 per worker unless stated, examples/s averaged over the epochs after the first. The same-settings "
        f"baseline, 1 worker and 2 workers ran {r['repeats']} time(s) in turn (A B C, A B C, ...): the table shows "
        "each one's median run, and its ratio is the median of its per-round ratios to the baseline of the same "
        "round, which cancels the machine's drift between rounds; all samples are in the JSON. The other rows ran "
        f"once. The trainer runs {r['steps_per_execution']} steps per call of its compiled step function (its "
        "default `--steps-per-execution`). The reference for every ratio is plain Keras in one process on in-memory "
        f'arrays given the same setting (the row "baseline, steps_per_execution {r["steps_per_execution"]}"); the '
        'row "baseline" is plain Keras with its own default of 1. All numbers come from this one run on this one '
        "machine.",
        "",
        "## Goals",
        "",
        "| goal | measured | met |",
        "| --- | ---: | :---: |",
        *(f"| {goal} | {value:.4g} | {'yes' if ok else '**no**'} |" for goal, (value, ok) in goals_met(r).items()),
        *(
            [
                "",
                "The throughput goals are judged on the full run only: a quick run times one run per row over one "
                "epoch of a few seconds, too short and too few to judge a ratio on a machine whose speed drifts.",
            ]
            if r["mode"] == "quick"
            else []
        ),
        "",
        "## Throughput and scaling",
        "",
        "| run | examples/s (after epoch 1) | × same-settings baseline | scaling efficiency T(N)/(N·T(1)) |",
        "| --- | ---: | ---: | ---: |",
    ]
    one = r["throughput"]["1 worker"]["examples_per_second"]
    for name, row in r["throughput"].items():
        n = {"1 worker": 1, "2 workers": 2, "3 workers": 3}.get(name)
        eff = f"{row['examples_per_second'] / (n * one):.2f}" if n else "–"
        lines.append(f"| {name} | {row['examples_per_second']:.0f} | {ratio(r, name):.2f} | {eff} |")
    lines += [
        "",
        "One worker trains under TensorFlow's default strategy, as plain Keras does, with the same model, batch and "
        "steps per execution; what it does beyond plain Keras is read TFRecords through tf.data instead of in-memory "
        "arrays, save a checkpoint after every epoch, and log each epoch (both measured below). Any further "
        "difference is within the machine's run-to-run spread: the samples of each row are in the JSON.",
        "",
        f"On {r['machine']['cores']} cores more workers cannot add compute: each worker gets "
        f"{r['machine']['cores']}/N cores' worth of threads and pays for gradient all-reduce over gRPC on loopback, "
        "so scaling efficiency below 1/N·cores is expected here; the multi-worker path exists for clusters.",
        "",
        "## Where the time goes",
        "",
        "| measure | value |",
        "| --- | ---: |",
        f"| input pipeline alone (TFRecord read + decode + shuffle + batch), examples/s | "
        f"{r['input_pipeline_examples_per_second']:.0f} |",
        f"| input pipeline ÷ 1-worker training throughput | {r['input_pipeline_examples_per_second'] / one:.1f}× "
        f"(its share of the training's CPU ≈ {100 * one / r['input_pipeline_examples_per_second']:.1f}%) |",
        f"| 1 worker: saving the per-epoch checkpoint (BackupAndRestore), the one thing plain Keras does not do | "
        f"{r['checkpoint']['ms_per_epoch']:.0f} ms per epoch = {100 * r['checkpoint']['share_of_epoch']:.1f}% |",
        f"| step time, 1 process with 1 thread (batch 64) | {r['allreduce']['single_thread_step_ms']:.1f} ms |",
        "| step time, 2 workers (batch 64 each, 1 thread each, gradients all-reduced as one pack: TensorFlow's "
        f"default) | {r['allreduce']['two_worker_step_ms']:.1f} ms |",
        f"| all-reduce and synchronisation per step (difference) | {r['allreduce']['cost_ms']:.1f} ms |",
        *(
            [
                f"| step time, 2 workers, one all-reduce per gradient tensor ({r['allreduce']['gradient_tensors']}, "
                "`--pack-bytes 1`) | "
                f"{r['allreduce']['unpacked_step_ms']:.1f} ms |"
            ]
            if "unpacked_step_ms" in r["allreduce"]
            else []
        ),
        f"| `import tensorflow` | {r['startup']['import_tensorflow_s']:.1f} s |",
        f"| `import tensorflow, tf_keras` | {r['startup']['import_tf_keras_s']:.1f} s |",
        f"| dense matmul ceiling (2048², float32) | {r['ceiling_gflops']:.1f} GFLOP/s |",
        f"| training FLOP/s, 1 worker ({r['train_flops_per_example'] / 1e6:.1f} MFLOP per example) | "
        f"{one * r['train_flops_per_example'] / 1e9:.1f} GFLOP/s = "
        f"{100 * one * r['train_flops_per_example'] / 1e9 / r['ceiling_gflops']:.0f}% of the ceiling |",
        "",
    ]
    if "time_to_accuracy" in r:
        t = r["time_to_accuracy"]
        reached = (
            f"reached test accuracy {t['target']:.2f} after {t['seconds_to_target']:.0f} s of training (epoch "
            f"{t['epoch_at_target']})"
            if t["seconds_to_target"] is not None
            else f"did not reach test accuracy {t['target']:.2f}"
        )
        curve = ", ".join(f"{v:.4f}" for v in t["val_accuracy"] if v is not None)
        lines += [
            "## Time to accuracy",
            "",
            f"2 workers on full Fashion-MNIST, {t['epochs']} epochs: {reached}; test accuracy after each epoch "
            f"{curve}; "
            f"final test accuracy {t['final_accuracy']:.4f} (evaluated from the exported SavedModel); whole run "
            f"{t['wall_seconds']:.0f} s including start-up.",
            "",
        ]
    p = r["pipeline"]
    lines += [
        "## Pipeline overhead",
        "",
        "| measure | value |",
        "| --- | ---: |",
        f"| `python pipelines/mnist.py --compile` (whole command, median of {p['compiles']}) | "
        f"{p['compile_seconds']:.2f} s |",
        f"| local pipeline run (kfp.local, 2 workers, shipped sample, {p['epochs']} epochs) | "
        f"{p['local_run_seconds']:.1f} s |",
        f"| … of which training (both workers, in parallel) | {p['training_seconds']:.1f} s |",
        f"| … of which evaluation | {p['evaluation_seconds']:.1f} s |",
        f"| overhead (data preparation, cluster step, kfp orchestration, process start-ups) | "
        f"{p['overhead_seconds']:.1f} s |",
        f"| test accuracy of that run | {p['accuracy']:.4f} |",
        "",
        f"![throughput]({'../bench/results/' if r['mode'] == 'full' else ''}{r['mode']}.png)",
        "",
    ]
    if "section_seconds" in r:
        spent = ", ".join(f"{name} {seconds:.0f} s" for name, seconds in r["section_seconds"].items())
        lines += [f"This run took {r['bench_seconds'] / 60:.1f} minutes: {spent}.", ""]
    return "\n".join(lines)
