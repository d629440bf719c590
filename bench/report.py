"""What `make bench` writes: the goals and their verdicts, the Markdown page and the throughput plot."""

import operator
import statistics

PINNED_ONE = "1 worker pinned to 1 core"
INDEPENDENT = "2 independent 1-worker runs, 1 core each"


def plot(results, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = results["throughput"]
    labels = list(rows)
    values = [rows[k]["examples_per_second"] for k in labels]
    fig, ax = plt.subplots(figsize=(8, 3.8), dpi=100)
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
    "scaling efficiency, 2 workers on a core each, ≥ 0.85": ("scaling_efficiency", 0.85, operator.ge),
    "system CPU during steady 2-worker training ≤ 10%": ("system_cpu_share", 0.10, operator.le),
    "time to 0.90 test accuracy, 2 workers vs 1, each on a core of its own: ≥ 1.6× faster": (
        "time_to_accuracy_speedup",
        1.6,
        operator.ge,
    ),
    "input pipeline ≥ 10× training throughput": ("input_pipeline_ratio", 10.0, operator.ge),
    "Fashion-MNIST ≥ 0.92 test accuracy within 5 epochs": ("fashion_accuracy", 0.92, operator.ge),
    "local pipeline overhead ≤ 30 s": ("pipeline_overhead_seconds", 30.0, operator.le),
    "compile ≤ 3 s": ("compile_seconds", 3.0, operator.le),
}


def reference(results):
    """The honest baseline: plain Keras in one process given the trainer's own steps_per_execution."""
    return results["throughput"][f"baseline, steps_per_execution {results['steps_per_execution']}"]


def _paired(row, base):
    """The median of per-round ratios when both rows ran in the same rounds, else the ratio of their medians.

    Pairing each run with the other's run of the same round cancels the machine's drift between rounds.
    """
    if row.get("samples") and len(row["samples"]) == len(base.get("samples") or ()):
        return statistics.median(a / b for a, b in zip(row["samples"], base["samples"], strict=True))
    return row["examples_per_second"] / base["examples_per_second"]


def ratio(results, name):
    """NAME's throughput over the reference (`_paired`)."""
    return _paired(results["throughput"][name], reference(results))


def scaling_efficiency(results, name, workers):
    """T(N) / (N · T(1)), T(1) being one worker pinned to one core: the share of N cores' work N workers deliver."""
    rows = results["throughput"]
    if PINNED_ONE not in rows or name not in rows:
        return None
    return _paired(rows[name], rows[PINNED_ONE]) / workers


def speedup(results):
    """Time to the target accuracy, 1 worker over 2 workers (None when either did not reach it)."""
    tta = results.get("time_to_accuracy")
    if not tta or not tta["1 worker"]["reached"] or not tta["2 workers"]["reached"]:
        return None
    return tta["1 worker"]["reached"]["training_seconds"] / tta["2 workers"]["reached"]["training_seconds"]


def goal_values(results):
    """The measured value behind each goal (None when this run did not measure it)."""
    one = results["throughput"]["1 worker"]["examples_per_second"]
    tta = results.get("time_to_accuracy")
    judged = results["mode"] == "full"
    cpu = results["throughput"]["2 workers"].get("cpu")
    return {
        "one_worker_ratio": ratio(results, "1 worker") if judged else None,
        "two_worker_ratio": ratio(results, "2 workers") if judged else None,
        "scaling_efficiency": scaling_efficiency(results, "2 workers", 2) if judged else None,
        "system_cpu_share": cpu["system"] if cpu else None,
        "time_to_accuracy_speedup": speedup(results),
        "input_pipeline_ratio": results["input_pipeline_examples_per_second"] / one,
        "fashion_accuracy": tta["2 workers"]["final_accuracy"] if tta else None,
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
        # The 2 GB data-at-scale runs and the curve past two workers (issue #32) came after this goal was set, and
        # are timed on their own.
        sections = results.get("section_seconds", {})
        later = {name: sections[name] for name in ("data at scale", "workers past two") if name in sections}
        less = " less " + " and ".join(f"{name} ({sec / 60:.1f} min)" for name, sec in later.items()) if later else ""
        minutes -= sum(later.values()) / 60
        met[f"`make bench{' ARGS=--quick' if results['mode'] == 'quick' else ''}`{less} ≤ {limit} minutes"] = (
            minutes,
            minutes <= limit,
        )
    return met


WORKERS = {"1 worker": 1, "2 workers": 2, "3 workers": 3, INDEPENDENT: 2}


def _percent(share):
    return f"{100 * share:.0f}%"


def prepare_lines(p):
    """The section "Preparing in parallel" (`bench/prepare.py`): 1 process against 2, and whether the bytes agree."""
    one, two = p["seconds"]["1"], p["seconds"]["2"]
    used = p["processes_used"]["2"]
    verdict = "met" if p["speedup"] >= p["goal"] else "**not met**"
    if p["mode"] == "quick":
        verdict = "judged on the full run, whose 4 times as many examples outweigh each process's start"
    rounds = p.get("rounds")
    each = (
        f" Medians of {len(rounds['1'])} rounds, the two runs in turn (1 process: "
        + ", ".join(f"{v:.1f}" for v in rounds["1"])
        + " s; 2 processes: "
        + ", ".join(f"{v:.1f}" for v in rounds["2"])
        + " s)."
        if rounds
        else ""
    )
    return [
        "## Preparing in parallel",
        "",
        f"{p['source'][0].upper()}{p['source'][1:]}: {p['examples']} examples, {p['shard_bytes'] / 1e9:.2f} GB of "
        f"shards. Each run is the whole command (`python -m trainer.prepare ... --workers N`: Python, reading the "
        f"gzip IDX files, writing and checksumming the shards), pinned to the same {p['cores']} cores.{each}",
        "",
        "| run | seconds | examples/s |",
        "| --- | ---: | ---: |",
        f"| 1 process | {one:.1f} | {p['examples'] / one:.0f} |",
        f"| 2 processes{'' if used == 2 else f' (it used {used})'} | {two:.1f} | {p['examples'] / two:.0f} |",
        "",
        f"2 processes prepare it {p['speedup']:.2f}× faster than 1 (goal: ≥ {p['goal']:g}× on 2 cores: {verdict}); "
        f"the shards and the metadata are {'byte for byte the same' if p['identical'] else '**not the same**'}. "
        + (
            "What bounds it: one process decompresses the gzip stream for both writers (a gzip stream cannot be "
            "split) and copies it into their shared memory, on the same 2 cores as the writers."
            if rounds
            else "What bounds it: each writing process starts its own TensorFlow (~3 s of a core) before its first "
            "record, and one process decompresses the gzip stream for both (a gzip stream cannot be split)."
        ),
        "",
    ]


def _mib(n):
    return f"{n / (1 << 20):,.0f} MiB"


def scale_lines(s):
    """The section "Data at scale" (`bench/scale.py`): where a worker's share is read from, what it costs."""
    d, goals = s["dataset"], s["goals"]
    memory = s["simulated_memory_limit_bytes"]
    lines = [
        "## Data at scale",
        "",
        f"A generated dataset (`bench/scale.py`, seeded): {d['train_examples']:,} training images of "
        f"{'x'.join(map(str, d['image_shape']))} in {d['shards']} shards, {d['train_bytes'] / 1e9:.2f} GB of "
        f"TFRecords, written in {d['generate_seconds']:.0f} s to local disk and in {d['write_to_s3_seconds']:.0f} s "
        f"straight into moto's S3 server on loopback (the same SHA-256s: {d['sha256_equal']}). Streamed runs have "
        f"`TRAINER_DISK_LIMIT` 1 byte and `TRAINER_MEMORY_LIMIT` {_mib(memory['2 workers'])} for 2 workers (half a "
        f"share) or {_mib(memory['1 worker'])} for 1 (half the dataset).",
        "",
        "| run | kept | examples/s | vs in memory | test accuracy | first step | peak RSS (anon) per worker | "
        "distinct bytes read per worker | bytes fetched per worker | temp dir |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, run in s["runs"].items():
        workers = list(run["workers"].values())
        firsts = [w["first_step_seconds"] for w in workers if w["first_step_seconds"] is not None]
        lines.append(
            f"| {name} | {workers[0]['cache']} | {run['examples_per_second']:,.0f} | {run['rate_vs_memory']:.2f}x | "
            f"{run['accuracy']:.4f} | {max(firsts):.1f} s | "
            + ", ".join(f"{_mib(w['peak_rss_bytes'])} ({_mib(w['peak_anonymous_bytes'])})" for w in workers)
            + " | "
            + ", ".join(f"{w['distinct_share_of_dataset']:.3f}" for w in workers)
            + " | "
            + ", ".join(_mib(w["fetched_bytes"] if name.endswith("S3") else w["rchar_bytes"]) for w in workers)
            + f" | {_mib(run['peak_disk_bytes'])} |"
        )
    runs = s["runs"]
    worst_share = max(
        w["distinct_share_of_dataset"] for r in runs.values() if len(r["workers"]) == 2 for w in r["workers"].values()
    )
    alone = runs["1 worker streamed from S3"]
    peak = max(w["peak_anonymous_bytes"] for w in alone["workers"].values())
    rss = max(w["peak_rss_bytes"] for w in alone["workers"].values())
    same = all(r.get("same_losses", False) for r in runs.values())
    streamed = {name: runs[name]["rate_vs_memory"] for name in ("streamed from disk", "streamed from S3")}
    memory_rounds = runs["in memory"]["rounds_examples_per_second"]
    disk_rounds = runs["streamed from disk"]["rounds_examples_per_second"]
    s3, s3_alone = runs["streamed from S3"], runs["1 worker streamed from S3"]
    gap = max(r["accuracy_gap"] for r in runs.values())
    disk = max(r["peak_disk_bytes"] for name, r in runs.items() if "streamed" in name)

    def verdict(ok):
        return "met" if ok else "**not met**"

    lines += [
        "",
        f"- Each of 2 workers read at most {worst_share:.3f} of the dataset's bytes (goal ≤ {goals['bytes_share']}: "
        f"{verdict(worst_share <= goals['bytes_share'])}); the largest temporary directory of a streamed run held "
        f"{_mib(disk)} (the dataset: {_mib(d['train_bytes'])}).",
        f"- 1 worker streaming a share twice its memory limit from S3 peaked at {_mib(peak)} of anonymous memory "
        f"against a limit of {_mib(memory['1 worker'])} ({verdict(peak < memory['1 worker'])}); its RSS, "
        f"{_mib(rss)}, adds TensorFlow's shared libraries (about 430 MiB, file-backed pages the kernel reclaims "
        "before a cgroup's OOM kill). The largest accuracy gap to the in-memory run is "
        f"{gap:.4f} (goal ≤ {goals['accuracy_gap']}: {verdict(gap <= goals['accuracy_gap'])}); every run's loss "
        f"after each epoch {'equals' if same else '**differs from**'} its in-memory run's to the last digit "
        "(the same examples in the same order).",
        f"- Streaming after the first epoch, against the in-memory rate (goal ≥ {goals['streamed_rate']}): from disk "
        f"{streamed['streamed from disk']:.3f}x ({verdict(streamed['streamed from disk'] >= goals['streamed_rate'])})"
        f", from S3 {streamed['streamed from S3']:.3f}x "
        f"({verdict(streamed['streamed from S3'] >= goals['streamed_rate'])}). In memory and from disk each ran "
        f"{s['rounds']} times, taking turns to go first (the table shows each one's median run): in memory "
        + ", ".join(f"{rate:,.0f}" for rate in memory_rounds)
        + ", from disk "
        + ", ".join(f"{rate:,.0f}" for rate in disk_rounds)
        + " examples/s, the rounds' ratios "
        + ", ".join(f"{disk / memory:.2f}x" for memory, disk in zip(memory_rounds, disk_rounds, strict=True))
        + ". The model is light on purpose, so the input sets the pace: each streamed example is read and cut out of "
        "its record again on the worker's one core (from S3 also checked, in this process's Python). Moto answers "
        "every ranged GET by reading the whole object (`moto/s3/responses.py`, `_handle_range_header` slices the "
        f"full body) on the same 2 cores: its server used {_store_cpu(s3)} during the 2-worker run from S3 and "
        f"{_store_cpu(s3_alone)} during the 1-worker one, CPU the workers of a cluster would not share with their "
        "store.",
        _ranged_reads_line(s["ranged_reads"]),
        "- First step: each worker checks the SHA-256 of its shards before training, which reads its share once "
        "more (from S3: the bytes fetched are 3 shares: the check and 2 epochs).",
        "",
    ]
    return lines


def _store_cpu(run):
    """The CPU time the store's server used during `run`, and its share of the 2 cores over the run."""
    cpu, wall = run["store_cpu_seconds"], run["wall_seconds"]
    return f"{cpu:.0f} s of CPU ({cpu / (2 * wall):.0%} of the 2 cores over its {wall:.0f} s)"


def _ranged_reads_line(r):
    """What a ranged read from S3 costs the reader and the store, per GB, at each request size."""
    sizes = r["by_request_bytes"]
    per_gb = ", ".join(
        f"{found['reader_cpu_seconds_per_gb']:.1f} s and {found['store_cpu_seconds_per_gb']:.1f} s at "
        f"{int(size) >> 10:,} KiB a request"
        for size, found in sizes.items()
    )
    used = r["request_bytes_used"]
    at = sizes.get(str(used["2 workers"]))
    cost = (
        f": at {used['2 workers'] >> 10:,} KiB, {at['reader_cpu_seconds_per_gb'] * r['example_bytes'] / 1e3:.0f} µs "
        f"of the worker's CPU per {r['example_bytes'] / 1e3:.1f} kB example in the reader alone, whatever the store"
        if at
        else ""
    )
    return (
        f"- A ranged read from S3, alone (this process reading {r['files']} of the shards, {r['file_bytes'] / 1e6:.1f}"
        " MB each, through the workers' reader, `trainer.data.streamed`): per GB, the reader's CPU and moto's "
        f"server's {per_gb}. A worker's requests are as large as its open files allow: "
        f"{used['2 workers'] >> 10:,} KiB for each of 2 workers, {used['1 worker'] >> 10:,} KiB for 1 worker{cost}."
    )


def curve_lines(c):
    """The section "Workers past two" (`bench/curve.py`): the curve here, the ring's cost and the model's check."""
    m, here = c["model"], c["curve"]
    ring, fit, eight = m["ring"], m["recorded_fit"], m["eight_workers"]
    one = here.get("1") or here.get(1)
    lines = [
        "## Workers past two",
        "",
        f"The curve on this machine's {c['cores']} cores (`bench/curve.py`: examples/s in epoch 2, each worker "
        f"pinned to its own core on one thread, {c['examples_per_epoch']:,} examples an epoch, batch 64 a worker):",
        "",
        "| workers | examples/s | efficiency |",
        "| ---: | ---: | ---: |",
    ]
    for n, rate in here.items():
        lines.append(f"| {n} | {rate:,.0f} | {rate / (int(n) * one):.2f} |")
    lines += [
        "",
        f"TensorFlow's ring all-reduce among N processes on these {c['cores']} cores (`bench/exchange.py "
        f"collective --workers N`, median of 200; more processes than cores share them round-robin):",
        "",
        f"| processes | messages in turn | 4 KB | {c['gradient_bytes'] / 1e6:.2f} MB (the gradients) |",
        "| ---: | ---: | ---: | ---: |",
    ]
    by_workers = {}
    for e in c["exchange"]:
        by_workers.setdefault(e["workers"], {})[e["bytes"]] = e["ms"]
    for n, sizes in by_workers.items():
        small, large = (sizes[b] for b in sorted(sizes))
        lines.append(f"| {n} | {2 * (n - 1)} | {small:.2f} ms | {large:.2f} ms |")
    s = c["steps"]
    lines += [
        "",
        f"Fitted: all-reduce = {ring['c_ms']:.2f} ms + 2 (N - 1) x ({ring['alpha_ms']:.3f} ms a message + its bytes "
        f"at {ring['ms_per_mb']:.3f} ms/MB). One worker's step on one core (plain tf-keras, {s['count']} steps): "
        f"mean {s['mean_ms']:.1f} ms, median {s['p50_ms']:.1f} ms, 99th percentile {s['p99_ms']:.1f} ms; the wait "
        "for the slowest of N is the mean of the slowest of N steps drawn from these, less the mean.",
        "",
        "The model, step(N) = step(1) + all-reduce(N) + wait(N), against the curves measured (here, and the 16-core "
        f"curve recorded on {c['recorded']['commit']}: {c['recorded']['machine']}):",
        "",
        "| machine | workers | all-reduce | wait | predicted overhead | measured overhead | predicted | measured | "
        "efficiency predicted / measured |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for machine, rows in (("here", m["here"]), ("16 cores", m["recorded"])):
        for n, r in rows.items():
            lines.append(
                f"| {machine} | {n} | {r['exchange_ms']:.1f} ms | {r['wait_ms']:.1f} ms | "
                f"{r['exchange_ms'] + r['wait_ms']:.1f} ms | {r['measured_overhead_ms']:.1f} ms | "
                f"{r['predicted']:,.0f} | {r['measured']:,.0f} | "
                f"{r['predicted_efficiency']:.2f} / {r['measured_efficiency']:.2f} |"
            )
    here_two = m["here"].get("2") or m["here"].get(2)
    fixed_there = fit["c_ms"] + 2 * fit["alpha_ms"]
    messages_eight = 14 * fit["alpha_ms"]
    lines += [
        "",
        f"- This machine's ring: {ring['alpha_ms']:.2f} ms a message in turn (with more processes than cores each "
        "message also waits for its receiver to be scheduled, so past "
        f"{c['cores']} processes this is an upper bound for a core each). The 16-core curve's own overheads fit "
        f"{fit['c_ms']:.1f} ms + 2 (N - 1) x {fit['alpha_ms']:.2f} ms (largest error {fit['largest_error_ms']:.1f} "
        f"ms): its growth with N is the ring's messages in turn, each {fit['alpha_ms'] / ring['alpha_ms']:.1f}x "
        "the cost measured here, while at 2 workers the fit already puts "
        f"{fixed_there:.1f} ms a step beyond one worker"
        + (f", where this machine's 2 workers spend {here_two['measured_overhead_ms']:.1f} ms" if here_two else "")
        + ". The model predicts the growth; it does not predict that fixed part, which is no message of the ring's "
        "(a 4 KB all-reduce between 2 processes costs "
        f"{min(e['ms'] for e in c['exchange'] if e['workers'] == 2):.2f} ms here): the wait for the slowest worker "
        "and the per-step cost of a collective on that machine's user-space network stack, which this machine cannot "
        "tell apart (its 2-worker efficiency was 0.72 on one run and 0.61 on the next with the same messages, "
        "which points at the waiting).",
        f"- 8 workers at ≥ {c['target_efficiency']} there: a step may take {eight['allowed_overhead_ms']:.1f} ms "
        f"beyond one worker's {eight['one_step_ms']:.1f} ms; the recorded curve spends "
        f"{eight['recorded_overhead_ms']:.1f} ms, {fit['c_ms']:.1f} ms of it fixed and {messages_eight:.1f} ms in "
        "the ring's 14 messages. "
        + (
            f"Even a ring whose messages cost nothing would leave {fit['c_ms']:.1f} ms, more than the "
            f"{eight['allowed_overhead_ms']:.1f} ms allowed: fewer or packed messages cannot reach it without the "
            "fixed part going first."
            if eight["alpha_ms_allowed"] < 0
            else f"Its messages would have to cost {eight['alpha_ms_allowed']:.2f} ms each."
        ),
        "",
    ]
    return lines


def markdown(results):
    """The results page: goals, throughput and scaling, the all-reduce, time to accuracy, preparing, pipeline."""
    r = results
    cores = r["machine"]["cores"]
    lines = [
        f"# Benchmarks ({r['mode']} run)",
        "",
        f"Measured {r['date']} by `make bench{' ARGS=--quick' if r['mode'] == 'quick' else ''}` on "
        f"{cores} CPU cores "
        f"({r['machine']['processor']}), TensorFlow {r['machine']['tensorflow']}, no GPU. Dataset: {r['dataset']} "
        f"({r['train_examples']} training examples). Throughput runs: {r['epochs']} epochs of "
        f"{r['examples_per_epoch']} examples, "
        "batch 64 per worker, examples/s averaged over the epochs after the first. The same-settings "
        f"baseline, 1 worker, 2 workers and 1 worker pinned to 1 core ran {r['repeats']} time(s) in turn (A B C D, "
        "A B C D, ...): the table shows each one's median run, and each ratio is the median of the per-round ratios "
        "of the two rows it relates, which cancels the machine's drift between rounds; all samples are in the JSON. "
        f"The other rows ran once. The trainer runs {r['steps_per_execution']} steps per call of its compiled step "
        "function (its default `--steps-per-execution`). The reference for the × column is plain Keras in one "
        "process on in-memory arrays given the same setting (the row "
        f'"baseline, steps_per_execution {r["steps_per_execution"]}"); the row "baseline" is plain Keras with its '
        "own default of 1. All numbers come from this one run on this one machine.",
        "",
        "## Goals",
        "",
        "| goal | measured | met |",
        "| --- | ---: | :---: |",
        *(f"| {goal} | {value:.4g} | {'yes' if ok else '**no**'} |" for goal, (value, ok) in goals_met(r).items()),
        *(
            [
                "",
                "The throughput and scaling goals are judged on the full run only: a quick run times one run per row "
                "over one epoch of a few seconds, too short and too few to judge a ratio on a machine whose speed "
                "drifts.",
            ]
            if r["mode"] == "quick"
            else []
        ),
        "",
        "## Throughput and scaling",
        "",
        "| run | examples/s (after epoch 1) | × same-settings baseline | scaling efficiency T(N)/(N·T(1 on 1 core)) |",
        "| --- | ---: | ---: | ---: |",
    ]
    for name, row in r["throughput"].items():
        eff = scaling_efficiency(r, name, WORKERS[name]) if name in WORKERS and name != "1 worker" else None
        lines.append(
            f"| {name} | {row['examples_per_second']:.0f} | {ratio(r, name):.2f} | "
            f"{'–' if eff is None else f'{eff:.2f}'} |"
        )
    a = r["allreduce"]
    two_cpu, synced_cpu = r["throughput"]["2 workers"].get("cpu"), a.get("synced_cpu")
    lines += [
        "",
        "How each row runs: **1 worker** is `trainer-train` alone, with TensorFlow's thread pools sized to the CPU it "
        f"may use (here all {cores} cores), as plain Keras sizes them. **2 workers** and **3 workers** are "
        "`trainer-launch`'s defaults: with a core per worker, each worker is pinned to its own core and runs one "
        "thread, as a pod with a 1-CPU limit under the kubelet's static CPU manager does; with more workers than "
        "cores (3 on 2) they are not pinned and run one thread each. **1 worker pinned to 1 core** is the unit "
        "of scaling: what one such pod does alone. **2 independent 1-worker runs** are two unrelated trainings at "
        "once, each on a core of its own: the machine's throughput with both cores busy and nothing exchanged, "
        "the ceiling for 2 workers here. The parameter-server row runs chief, 1 ps and 2 workers unpinned.",
        "",
        "## The all-reduce",
        "",
        f"The model has {a['gradient_tensors']} gradient tensors, {r['gradient_bytes'] / 1e6:.2f} MB in float32, "
        "all-reduced as one pack every step (TensorFlow's default packing).",
        "",
        "| measure | value |",
        "| --- | ---: |",
        f"| floor: 2 processes on a core each exchange {r['gradient_bytes'] / 1e6:.2f} MB over a loopback socket "
        f"and add them | {a['socket_floor_ms']:.2f} ms |",
        f"| TensorFlow's all-reduce of the same tensor alone, 2 workers on a core each | {a['collective_ms']:.2f} ms |",
        f"| step time, 1 worker on 1 core (batch 64) | {a['pinned_one_step_ms']:.1f} ms |",
        f"| step time, 2 independent runs on a core each (no exchange) | {a['independent_step_ms']:.1f} ms |",
        f"| step time, 2 workers, before: tf-keras' per-step metric all-reduces (7 collectives a step, "
        f"`--sync-batch-metrics`) | {a['synced_step_ms']:.1f} ms |",
        f"| step time, 2 workers, after: the gradients' all-reduce only (1 collective a step, the default) | "
        f"{a['two_worker_step_ms']:.1f} ms |",
        f"| all-reduce and synchronisation per step, before (vs. independent runs) | "
        f"{a['synced_step_ms'] - a['independent_step_ms']:.1f} ms |",
        f"| all-reduce and synchronisation per step, after | "
        f"{a['two_worker_step_ms'] - a['independent_step_ms']:.1f} ms |",
        f"| 2 workers' throughput, before → after | {a['synced_examples_per_second']:.0f} → "
        f"{r['throughput']['2 workers']['examples_per_second']:.0f} examples/s |",
        *(
            [
                "| machine CPU during steady 2-worker training, after: user / system / idle | "
                f"{_percent(two_cpu['user'])} / {_percent(two_cpu['system'])} / {_percent(two_cpu['idle'])} |"
            ]
            if two_cpu
            else []
        ),
        *(
            [
                "| … before | "
                f"{_percent(synced_cpu['user'])} / {_percent(synced_cpu['system'])} / {_percent(synced_cpu['idle'])} |"
            ]
            if synced_cpu
            else []
        ),
        "",
        "Where the rest goes: the two pinned workers run at the speed of the independent pair, plus one all-reduce "
        "of the gradients, plus the wait for the slower worker at every step (both must reach the all-reduce; any "
        "hiccup on either core stalls both). Gradients are exchanged every step, in float32: no setting here "
        "changes what training computes.",
        "",
        "## Where the time goes",
        "",
        "| measure | value |",
        "| --- | ---: |",
    ]
    one = r["throughput"]["1 worker"]["examples_per_second"]
    lines += [
        f"| input pipeline alone (TFRecord read + decode + shuffle + batch), examples/s | "
        f"{r['input_pipeline_examples_per_second']:.0f} |",
        f"| input pipeline ÷ 1-worker training throughput | {r['input_pipeline_examples_per_second'] / one:.1f}× "
        f"(its share of the training's CPU ≈ {100 * one / r['input_pipeline_examples_per_second']:.1f}%) |",
        f"| 1 worker: saving the per-epoch checkpoint, the one thing plain Keras does not do | "
        f"{r['checkpoint']['ms_per_epoch']:.0f} ms per epoch = {100 * r['checkpoint']['share_of_epoch']:.1f}% |",
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
        lines += [
            "## Time to accuracy",
            "",
            f"Full Fashion-MNIST, {t['epochs']} epochs, global batch {t['global_batch']} and peak learning rate "
            f"{t['learning_rate']:.5f} in both runs (2 workers x 64 on a core each; 1 worker x 128 pinned to one "
            f"core), test accuracy after every epoch. Time to {t['target']:.2f} counts training only, up to the first "
            "epoch that reaches it (the validation passes are left out).",
            "",
            "| run | time to target | epoch | training examples/s | test accuracy by epoch | final (SavedModel) |",
            "| --- | ---: | ---: | ---: | --- | ---: |",
        ]
        for name in ("1 worker", "2 workers"):
            run = t[name]
            got = run["reached"]
            curve = ", ".join(f"{v:.4f}" for v in run["val_accuracy"] if v is not None)
            seconds = f"{got['training_seconds']:.0f} s" if got else "not reached"
            lines.append(
                f"| {name} | {seconds} | {got['epoch'] if got else '–'} | {run['examples_per_second']:.0f} | "
                f"{curve} | {run['final_accuracy']:.4f} |"
            )
        faster = speedup(r)
        lines += ["", f"2 workers reach it {faster:.2f}× sooner." if faster else "Not both reached it.", ""]
    if "prepare" in r:
        lines += prepare_lines(r["prepare"])
    if "scale" in r:
        lines += scale_lines(r["scale"])
    if "curve" in r:
        lines += curve_lines(r["curve"])
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
