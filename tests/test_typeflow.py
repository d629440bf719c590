"""What the KFP backend's driver checks at run time, checked here in the compiled YAML of every variant.

The driver (backend/src/v2/driver/resolve.go) converts each input parameter to the type declared where the value
comes from (a DAG input, a loop item, a producer's output) and refuses a task whose component declares another
type ("input parameter ... type mismatch: expect NUMBER_INTEGER, got string"). kfp.local hands over Python values and
never notices, so this walks every DAG of the YAML, nested ones included.
"""

import pytest
import yaml

from pipelines.factories import FACTORIES
from tests.support.pipelines import pipeline_spec, type_flow


@pytest.fixture(scope="module", params=list(FACTORIES))
def spec(request, compiled_yaml):
    return pipeline_spec(compiled_yaml[request.param])


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
