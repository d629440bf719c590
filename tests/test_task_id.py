"""A task's id and the three ways it is written (trainer.core.tasks)."""

import pytest

from trainer.core.errors import UsageError
from trainer.core.tasks import TaskId


def test_a_task_is_written_three_ways_and_its_label_reads_back():
    task = TaskId("worker", 12)
    assert (task.name, task.directory, task.label) == ("worker 12", "worker-12", "worker:12")
    for label in ("chief:0", "worker:1", "ps:0", "evaluator:0", "worker:12"):
        assert TaskId.parse(label).label == label
    assert TaskId.parse("ps:3") == TaskId("ps", 3) == ("ps", 3)
    assert TaskId.of({"cluster": {}, "task": {"type": "ps", "index": 2}}) == TaskId("ps", 2)
    assert TaskId.of(None) == TaskId("worker", 0), "a process without a cluster is worker 0"


@pytest.mark.parametrize("label", ["ps0", "ps 0", "ps-0", "ps:", ":0", "ps:-1", "ps:01", "PS:0", "ps:0 ", "ps:x"])
def test_a_label_that_is_not_type_colon_index_is_refused_naming_it(label):
    with pytest.raises(UsageError) as err:
        TaskId.parse(label)
    assert str(err.value) == f"task {label!r} is not TYPE:INDEX; allowed: a task such as 'worker:1' or 'ps:0'"
