"""Compiled pipelines: their spec, the pipeline command line, and the types its parameters flow through.

`type_flow` is what the KFP backend's driver checks at run time (backend/src/v2/driver/resolve.go): it converts each
input parameter to the type declared where the value comes from (a DAG input, a loop item, a producer's output) and
refuses a task whose component declares another type.
"""

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import yaml

from tests.support.paths import ROOT

IMAGE = "registry.example.com/team/kfp-tf-multiworker:9.9.9"


def pipeline_spec(path):
    """The pipeline spec (the first YAML document) of a compiled pipeline."""
    return next(yaml.safe_load_all(Path(path).read_text()))


def run_cli(capsys, *args):
    """`pipelines/mnist.py ARGS` in this process: (exit code, stdout, stderr)."""
    from pipelines import cli

    code = cli.main(list(args))
    out = capsys.readouterr()
    return SimpleNamespace(returncode=code, stdout=out.out, stderr=out.err)


def run_script(*args, timeout=600, env=None):
    """`python pipelines/mnist.py ARGS` as a child process from the repo root, finished (text output)."""
    return subprocess.run(
        [sys.executable, "pipelines/mnist.py", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


CONSTANT_TYPES = {
    str: "STRING",
    bool: "BOOLEAN",
    int: "NUMBER_INTEGER",
    float: "NUMBER_DOUBLE",
    list: "LIST",
    dict: "STRUCT",
}


def _constant_type(value):
    """A constant is a protobuf Value: numbers are doubles, so an integral one is a valid NUMBER_INTEGER."""
    if isinstance(value, float) and value.is_integer():
        return "NUMBER_INTEGER"
    return CONSTANT_TYPES[type(value)]


def _source_type(source, dag_component, dag_tasks, components):
    """The type a task input parameter arrives with, as the driver resolves it."""
    if "componentInputParameter" in source:
        return dag_component["inputDefinitions"]["parameters"][source["componentInputParameter"]]["parameterType"]
    if "taskOutputParameter" in source:
        producer = dag_tasks[source["taskOutputParameter"]["producerTask"]]
        outputs = components[producer["componentRef"]["name"]]["outputDefinitions"]["parameters"]
        return outputs[source["taskOutputParameter"]["outputParameterKey"]]["parameterType"]
    if "runtimeValue" in source:
        return _constant_type(source["runtimeValue"]["constant"])
    raise AssertionError(f"unknown parameter source {source}")


def type_flow(spec):
    """`(dag, task, input, arrives as, declared)` for every input parameter of every task in every DAG."""
    components = spec["components"]
    dags = {"root": spec["root"], **{name: c for name, c in components.items() if "dag" in c}}
    flows = []
    for dag_name, dag_component in dags.items():
        tasks = dag_component["dag"]["tasks"]
        for task_name, task in tasks.items():
            declared = components[task["componentRef"]["name"]].get("inputDefinitions", {}).get("parameters", {})
            for name, source in task.get("inputs", {}).get("parameters", {}).items():
                if "taskFinalStatus" in source:
                    continue
                flows.append(
                    (
                        dag_name,
                        task_name,
                        name,
                        _source_type(source, dag_component, tasks, components),
                        declared[name]["parameterType"],
                    )
                )
            iterator = task.get("parameterIterator")
            if iterator:
                loop_inputs = components[task["componentRef"]["name"]]["inputDefinitions"]["parameters"]
                items = iterator["items"]
                arrives = "LIST" if "inputParameter" in items else _constant_type(yaml.safe_load(items["raw"]))
                flows.append((dag_name, task_name, iterator["itemInput"] + " (the items)", arrives, "LIST"))
                assert iterator["itemInput"] in loop_inputs
    return flows
