"""A self-contained HTML report of a training run: curves from the history, per-class results, confusion matrix."""

from __future__ import annotations

import html
import os
import urllib.parse

from trainer.core.files import write_text
from trainer.evaluation.verdict import Verdict
from trainer.records.history import History
from trainer.serving.serving_check import ServingCheck


def training_curves(history: History, metric: str = "accuracy") -> str:
    """Inline SVG line charts (pygal) of the training loss and `metric` per epoch, side by side."""
    import pygal

    epochs = [e["epoch"] for e in history.epochs]
    charts = []
    keys = ["loss", *([metric] if metric != "loss" and all(metric in e for e in history.epochs) else [])]
    for key, title in ((key, f"training {key}") for key in keys):
        chart = pygal.Line(
            js=[], width=450, height=320, show_legend=False, title=title, x_title="epoch", disable_xml_declaration=True
        )
        chart.x_labels = epochs
        chart.add(key, [e[key] for e in history.epochs])
        charts.append(chart.render(is_unicode=True))
    return f'<div style="display:flex;gap:1em">{"".join(charts)}</div>'


def _link(uri: str) -> str:
    """An href for a location: local paths as file:// URLs, URIs (gs://, s3://, https://) as they are."""
    if "://" in uri:
        return uri
    return "file://" + urllib.parse.quote(os.path.abspath(uri))


def serving_section(check: ServingCheck) -> str:
    """The serving check's verdict and one row per check."""
    esc = html.escape
    verdict = "passed" if check.passed else f"FAILED, not published: {esc(check.reason)}"
    rows = "".join(
        f"<tr><td style='text-align:left'>{esc(c.name)}</td><td>{'passed' if c.passed else 'FAILED'}</td>"
        f"<td style='text-align:left'>{esc(c.detail)}</td></tr>"
        for c in check.checks
    )
    return (
        f"<h2>Serving check</h2><p>Serving check: <b>{verdict}</b>. {check.examples} held-out examples were sent "
        "as TF Serving REST instances to the SavedModel's <code>serving_default</code> signature, loaded the way "
        f"TF Serving loads it in a fresh process ({check.seconds}s).</p>"
        f"<table><tr><th>check</th><th>result</th><th>detail</th></tr>{rows}</table>"
    )


def tensorboard_section(history: History) -> str:
    """A link to the run's TensorBoard event files, or nothing when none were written."""
    logdir = history.tensorboard
    if not logdir:
        return ""
    esc = html.escape
    return (
        f'<p>TensorBoard event files (per-epoch scalars): <a href="{esc(_link(logdir))}">{esc(logdir)}</a>. '
        "Open them with Kubeflow's Tensorboards app (a Tensorboard whose logs path is this location or its "
        f"parent) or <code>tensorboard --logdir {esc(logdir)}</code>.</p>"
    )


def classification_sections(verdict: Verdict) -> str:
    """The per-class table and the confusion matrix, for a classifier's results (the built-in CNN's); else nothing."""
    esc = html.escape
    results = verdict.evaluation
    confusion = results.confusion()
    if confusion is None:
        return ""
    rows = "".join(
        f"<tr><td>{esc(c['name'])}</td><td>{c['precision']:.4f}</td><td>{c['recall']:.4f}</td><td>{c['f1']:.4f}</td>"
        f"<td>{c['support']}</td></tr>"
        for c in results.classes()
    )
    names, confusion_matrix = confusion
    head = "".join(f"<th>{esc(n)}</th>" for n in names)
    matrix = "".join(
        f"<tr><th>{esc(names[i])}</th>" + "".join(f"<td>{v}</td>" for v in row) + "</tr>"
        for i, row in enumerate(confusion_matrix)
    )
    return (
        "<h2>Per class</h2>\n<table><tr><th>class</th><th>precision</th><th>recall</th><th>F1</th><th>support</th></tr>"
        f"{rows}</table>\n<h2>Confusion matrix (rows: true class, columns: predicted)</h2>\n"
        f"<table><tr><th></th>{head}</tr>{matrix}</table>"
    )


def render_html(verdict: Verdict, history: History, model: str) -> str:
    """The report's HTML page: results, gate, serving check, TensorBoard link, curves, per-class table, matrix.

    `model` names the model, as HTML (its kind's `ModelKind.html_name`).
    """
    esc = html.escape
    results = verdict.evaluation
    metric = verdict.gate.metric
    scalars = results.scalars()
    shown = ", ".join(
        f"<b>test {esc(name)} {value:.4f}</b>" if name == metric else f"{esc(name)} {value:.4f}"
        for name, value in scalars.items()
    )
    last = history.epochs[-1] if history.epochs else {}
    passed = "passed" if verdict.passed_gate else "FAILED, not published"
    gate = f"Quality gate ({esc(str(verdict.gate))}): <b>{passed}</b>."
    check = verdict.serving_check
    gate += f" Serving check: <b>{'passed' if check.passed else f'FAILED, not published ({esc(check.reason)})'}</b>."
    speed = sum(e["examples_per_second"] for e in history.epochs[1:]) / max(1, len(history.epochs) - 1)
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>Training report</title>
<style>body{{font-family:sans-serif;margin:1.5em}}table{{border-collapse:collapse;margin:0.5em 0 1.5em}}
td,th{{border:1px solid #ccc;padding:3px 8px;text-align:right}}</style></head><body>
<h1>Training report</h1>
<p>Dataset <code>{esc(str(results.dataset))}</code>, {model}, {results.num_examples} held-out examples: {shown}.
{gate}</p>
<p>{history.workers} worker(s), global batch {history.global_batch_size}, {len(history.epochs)} epochs of
{history.steps_per_epoch} steps; final training {esc(metric)} {last.get(metric, float("nan")):.4f};
{speed:.0f} examples/s after the first epoch.</p>
{tensorboard_section(history)}
{training_curves(history, metric)}
{serving_section(check)}
{classification_sections(verdict)}
</body></html>
"""


def write_html(path: str, verdict: Verdict, history: History, model: str) -> None:
    """Writes the report atomically."""
    write_text(path, render_html(verdict, history, model))
