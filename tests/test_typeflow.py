"""What the KFP backend's driver checks at run time, checked here in the compiled YAML of every variant.

The driver (backend/src/v2/driver/resolve.go) converts each input parameter to the type declared where the value
comes from (a DAG input, a loop item, a producer's output) and refuses a task whose component declares another
type ("input parameter ... type mismatch: expect NUMBER_INTEGER, got string"). kfp.local hands over Python values and
never notices, so this walks every DAG of the YAML, nested ones included.
"""

import pytest
import yaml

from pipelines.factories import FACTORIES
from tests.conftest import pipeline_spec

CONSTANT_TYPES = {
    str: "STRING",
    bool: "BOOLEAN",
    int: "NUMBER_INTEGER",
    float: "NUMBER_DOUBLE",
    list: "LIST",
    dict: "STRUCT",
}


@pytest.fixture(scope="module", params=list(FACTORIES))
def spec(request, compiled_yaml):
    return pipeline_spec(compiled_yaml[request.param])


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


def test_every_task_input_receives_exactly_the_type_its_component_declares(spec):
    flows = type_flow(spec)
    mismatches = [
        f"{dag}/{task}.{name}: receives {got}, declares {want}" for dag, task, name, got, want in flows if got != want
    ]
    assert not mismatches, "\n".join(mismatches)
    reached = {task for _, task, _, _, _ in flows}
    assert {"publish-model", "evaluate", "deploy-model"} <= reached and reached & {"train-worker", "train-server"}, (
        "nested DAGs too"
    )


def test_the_worker_index_arrives_as_the_integer_the_worker_declares(spec):
    flows = {(task, name): (got, want) for _, task, name, got, want in type_flow(spec)}
    if ("train-worker", "worker_index") in flows:
        assert flows[("train-worker", "worker_index")] == ("NUMBER_INTEGER", "NUMBER_INTEGER")
    else:
        assert flows[("train-server", "task")] == ("STRING", "STRING")


def test_the_walk_catches_a_bare_list_loop(spec):
    """The bug of 75256c8: create_cluster returned a bare `list`, so the loop item was STRING for an int input."""
    broken = yaml.safe_load(yaml.safe_dump(spec))
    for component in broken["components"].values():
        for name, parameter in component.get("inputDefinitions", {}).get("parameters", {}).items():
            if name.endswith("-loop-item") and parameter["parameterType"] == "NUMBER_INTEGER":
                parameter["parameterType"] = "STRING"
    mismatches = [(task, name) for _, task, name, got, want in type_flow(broken) if got != want]
    if "comp-train-worker" in spec["components"]:
        assert ("train-worker", "worker_index") in mismatches
