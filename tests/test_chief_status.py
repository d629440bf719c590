"""The chief's status as servers read it (trainer.cluster.chief) and a supervisor whose task ends with it, on a
real status file and a real child process."""

import json
import os
import sys
import time

import pytest

from tests.support.processes import children
from trainer.cluster.chief import ChiefWatch, StatusPublisher, wait_for_chief
from trainer.cluster.policy import CONTRACT, RestartPolicy
from trainer.cluster.status import FileStatus
from trainer.cluster.supervisor import SupervisedTask, Supervisor
from trainer.core.errors import ChiefFailedError, PeerUnavailableError, TaskFailedError
from trainer.k8s import objects

SLEEPER = [sys.executable, "-c", "import time; time.sleep(600)"]


def _status(path, state="running", age=0.0):
    path.write_text(json.dumps({"state": state, "heartbeat": time.time() - age, "detail": ""}))


def test_no_status_within_the_start_up_timeout_is_a_lost_chief(tmp_path):
    with pytest.raises(PeerUnavailableError, match=r"^ps 0: the chief published no status at .* within 0.3s$"):
        wait_for_chief(FileStatus(str(tmp_path / "status.json")), 0.3, 60, "ps 0")


def test_an_old_heartbeat_counts_as_a_lost_chief_only_after_the_server_waited_as_long(tmp_path):
    path = tmp_path / "status.json"
    _status(path, age=100)
    watch = ChiefWatch(FileStatus(str(path)), 5, 1.0, "ps 0")
    assert watch.over() is False, "a server that starts beside a chief being retried waits for it"
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        _status(path)
        assert watch.over() is False, "the retried chief's heartbeat keeps the server serving"
        time.sleep(0.1)
    _status(path, "succeeded")
    while not watch.over():
        time.sleep(0.1)
    _status(path, age=100)
    with pytest.raises(
        PeerUnavailableError, match=r"^worker 1: the chief's heartbeat at .* is 10\ds old \(limit 0.5s\)"
    ):
        wait_for_chief(FileStatus(str(path)), 5, 0.5, "worker 1")


def test_a_status_that_cannot_be_read_is_retried_for_the_chief_timeout(tmp_path):
    (tmp_path / "status.json").mkdir()
    watch = ChiefWatch(FileStatus(str(tmp_path / "status.json")), 5, 0.5, "ps 0")
    assert watch.over() is False, "one failed read is retried"
    with pytest.raises(PeerUnavailableError, match=r"^ps 0: the chief's status at .* could not be read for 0.5s: "):
        wait_for_chief(watch.store, 5, 0.5, "ps 0")


def test_a_chief_that_was_stopped_leaves_no_final_state_and_one_that_failed_says_so(tmp_path):
    path = tmp_path / "status.json"
    with pytest.raises(TaskFailedError), StatusPublisher(FileStatus(str(path))) as status:
        status.abandon()
        raise TaskFailedError(143)
    assert json.loads(path.read_text())["state"] == "running", "a retried chief may take over"
    with pytest.raises(TaskFailedError), StatusPublisher(FileStatus(str(path))):
        raise TaskFailedError(1)
    assert json.loads(path.read_text())["state"] == "failed"
    with pytest.raises(ChiefFailedError, match=r"^ps 0: the chief failed: "):
        wait_for_chief(FileStatus(str(path)), 5, 60, "ps 0")


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_server_task_ends_when_the_chief_is_done_and_its_command_is_stopped(tmp_path):
    path = tmp_path / "status.json"
    _status(path, "succeeded")
    started = []
    before = set(children())

    class Watch(ChiefWatch):
        def over(self):
            started.extend(pid for pid in children() if pid not in before)
            return super().over()

    watch = Watch(FileStatus(str(path)), 5, 60, "ps 0")
    task = SupervisedTask(SLEEPER, dict(os.environ), None, 60, CONTRACT.limited(2), serves_until=watch)
    supervisor = Supervisor(task)
    assert supervisor.run() == 0 and supervisor.restarts == 0
    assert started and not any(_pid_alive(pid) for pid in started), "the command was stopped"


def test_a_server_task_ends_with_the_chiefs_failure_and_is_not_restarted(tmp_path, capfd):
    path = tmp_path / "status.json"
    _status(path, "failed")
    watch = ChiefWatch(FileStatus(str(path)), 5, 60, "worker 0")
    every_failure = RestartPolicy("any failure", from_code=1, max_restarts=2)
    supervisor = Supervisor(SupervisedTask(SLEEPER, dict(os.environ), None, 60, every_failure, serves_until=watch))
    assert supervisor.run() == 1 and supervisor.restarts == 0
    assert "error: worker 0: the chief failed: " in capfd.readouterr().err


def test_a_tfjobs_chief_status_is_the_runs_configmap_in_kubernetes_mode_as_for_this_projects_own_chief():
    import tempfile

    from trainer.cluster.lifecycle import status_location

    assert status_location("", "kubernetes", "run-9") == f"configmap:tfw-{objects.run_key('run-9')}-status"
    assert (
        status_location("", "local", "run-9") == f"{tempfile.gettempdir()}/tfjob-status/{objects.run_key('run-9')}.json"
    )
