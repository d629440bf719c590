"""Threads that fit: the CPU budget from cgroup files (v2, v1, in a container), affinity and cores; launcher shares."""

import os
import re
import sys

import pytest

from tests.standins.cgroup import cpu_limited
from tests.support.paths import ROOT
from tests.support.processes import trainer_args
from trainer.core.cpus import CpuBudget, Share, ThreadCounts, cpu_budget, ranges, shares, thread_counts


def _proc(tmp_path, cgroup_lines, mounts):
    """A procfs with self/cgroup and self/mountinfo; `mounts` are (root, mount point, fstype, super options)."""
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "cgroup").write_text("\n".join(cgroup_lines) + "\n")
    info = [
        f"{30 + i} 25 0:{40 + i} {root} {point} rw,nosuid,nodev,noexec,relatime shared:9 - {fstype} cgroup {options}"
        for i, (root, point, fstype, options) in enumerate(mounts)
    ]
    info.insert(0, "25 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw")
    (proc / "self" / "mountinfo").write_text("\n".join(info) + "\n")
    return proc


def _write(directory, **files):
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (directory / name.replace("_", ".", 1)).write_text(text + "\n")


def test_cgroup_v2_quota_of_one_cpu_on_a_two_core_machine(tmp_path):
    mount = tmp_path / "cgroup"
    proc = _proc(tmp_path, ["0::/kubepods/pod1/c1"], [("/", mount, "cgroup2", "rw,nsdelegate")])
    _write(mount / "kubepods" / "pod1" / "c1", cpu_max="100000 100000")
    _write(mount / "kubepods" / "pod1", cpu_max="max 100000")
    budget = cpu_budget(proc, affinity={0, 1})
    assert budget == CpuBudget(1.0, f"cgroup v2 cpu.max of {mount}/kubepods/pod1/c1")
    assert budget.threads == 1
    assert budget.describe() == f"1 CPU (cgroup v2 cpu.max of {mount}/kubepods/pod1/c1)"


def test_the_smallest_quota_up_the_hierarchy_wins_and_is_rounded_down(tmp_path):
    mount = tmp_path / "cgroup"
    proc = _proc(tmp_path, ["0::/kubepods/pod1/c1"], [("/", mount, "cgroup2", "rw")])
    _write(mount / "kubepods" / "pod1" / "c1", cpu_max="max 100000")
    _write(mount / "kubepods" / "pod1", cpu_max="250000 100000")
    _write(mount / "kubepods", cpu_max="800000 100000")
    budget = cpu_budget(proc, affinity=set(range(32)))
    assert budget == CpuBudget(2.5, f"cgroup v2 cpu.max of {mount}/kubepods/pod1")
    assert budget.threads == 2


def test_cgroup_v1_in_a_container_sees_its_own_cgroup_at_the_mount_root(tmp_path):
    mount = tmp_path / "cpu,cpuacct"
    proc = _proc(
        tmp_path,
        ["12:memory:/docker/abc", "4:cpu,cpuacct:/docker/abc", "1:name=systemd:/docker/abc", "0::/"],
        [
            ("/docker/abc", mount, "cgroup", "rw,cpu,cpuacct"),
            ("/docker/abc", tmp_path / "memory", "cgroup", "rw,memory"),
        ],
    )
    _write(mount, cpu_cfs_quota_us="150000", cpu_cfs_period_us="100000")
    assert cpu_budget(proc, affinity={0, 1, 2, 3}) == CpuBudget(1.5, f"cgroup v1 cpu.cfs_quota_us of {mount}")


def test_without_a_quota_the_affinity_decides(tmp_path):
    mount = tmp_path / "cpu"
    proc = _proc(tmp_path, ["3:cpu:/"], [("/", mount, "cgroup", "rw,cpu")])
    _write(mount, cpu_cfs_quota_us="-1", cpu_cfs_period_us="100000")
    assert cpu_budget(proc, affinity={2, 3, 4, 7}) == CpuBudget(4.0, "affinity: CPUs 2-4,7")
    assert cpu_budget(tmp_path / "no-proc", affinity={0}) == CpuBudget(1.0, "affinity: CPUs 0")


def test_a_quota_above_the_affinity_does_not_raise_the_budget(tmp_path):
    mount = tmp_path / "cgroup"
    proc = _proc(tmp_path, ["0::/"], [("/", mount, "cgroup2", "rw")])
    _write(mount, cpu_max="400000 100000")
    assert cpu_budget(proc, affinity={0, 1}) == CpuBudget(2.0, "affinity: CPUs 0-1")


def test_thread_counts_setting_then_tensorflows_variable_then_the_budget():
    budget = CpuBudget(3.0, "affinity: CPUs 0-2")
    assert thread_counts(0, {}, budget) == ThreadCounts(3, 2, "3 CPUs (affinity: CPUs 0-2)")
    assert thread_counts(0, {"TF_NUM_INTRAOP_THREADS": "1"}, budget) == ThreadCounts(1, 2, "TF_NUM_INTRAOP_THREADS")
    assert thread_counts(0, {"TF_NUM_INTEROP_THREADS": "4"}, budget) == ThreadCounts(
        3, 4, "3 CPUs (affinity: CPUs 0-2)"
    )
    assert thread_counts(6, {"TF_NUM_INTRAOP_THREADS": "1"}, budget) == ThreadCounts(6, 2, "the threads setting")
    assert thread_counts(0, {"TF_NUM_INTRAOP_THREADS": "x"}, budget).intra == 3


def test_a_launcher_pins_each_task_to_cpus_of_its_own_when_there_are_enough():
    two = CpuBudget(2.0, "affinity")
    assert shares(2, True, two, {0, 1}) == [Share({0}, 1), Share({1}, 1)]
    assert shares(2, True, CpuBudget(4.0, "affinity"), {0, 1, 2, 3}) == [Share({0, 1}, 2), Share({2, 3}, 2)]
    assert shares(3, True, two, {0, 1}) == [Share(None, 1)] * 3
    assert shares(2, False, two, {0, 1}) == [Share(None, 1)] * 2
    # Under a quota below the affinity (a pod's limit), nobody is pinned and the quota is divided.
    assert shares(2, True, CpuBudget(4.0, "cgroup"), set(range(32))) == [Share(None, 2)] * 2
    assert ranges({0, 1, 2, 5, 7, 8}) == "0-2,5,7-8"


def test_a_worker_under_a_one_cpu_quota_runs_one_intra_op_thread(tmp_path, sample_data):
    """The trainer in a real cgroup whose quota is 1 CPU, on a machine with more cores: TensorFlow gets 1 thread.

    The test creates the cgroup and writes its quota file (root, as `make test` runs in CI), as the kubelet does
    for a container with a 1-CPU limit.
    """
    assert len(os.sched_getaffinity(0)) >= 2
    args = trainer_args(sample_data, tmp_path / "model", "--epochs", "1", "--steps-per-epoch", "2")
    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2")
    for name in ("TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS", "TF_CONFIG"):
        env.pop(name, None)
    import subprocess

    with cpu_limited(1.0) as enter:
        result = subprocess.run(
            enter([sys.executable, "-m", "trainer.train", *args]),
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert result.returncode == 0, result.stderr[-3000:]
    line = re.search(r"threads: (\d+) intra-op, (\d+) inter-op \((.*)\)", result.stderr)
    assert line, result.stderr[-3000:]
    assert line.group(1, 2) == ("1", "2")
    assert line.group(3).startswith("1 CPU (cgroup v")


def _cpu_set(text):
    """`0-2,5` -> {0, 1, 2, 5}."""
    cpus = set()
    for part in text.split(","):
        low, _, high = part.partition("-")
        cpus.update(range(int(low), int(high or low) + 1))
    return cpus


@pytest.mark.slow
def test_the_default_local_launch_does_not_oversubscribe(undisturbed_two_workers):
    """`trainer-launch --workers 2` on 2 or more cores: each worker on CPUs of its own, its TensorFlow sized to them."""
    _, _, result = undisturbed_two_workers
    assert result.returncode == 0, result.stdout[-3000:]
    machine = os.sched_getaffinity(0)
    assert len(machine) >= 2
    output = result.stdout + result.stderr
    pinned = {
        task: _cpu_set(cpus)
        for task, cpus in re.findall(r"started (worker \d) \(pid \d+\) on CPUs ([\d-]+(?:,[\d-]+)*)", output)
    }
    reported = {
        task: (int(intra), _cpu_set(cpus))
        for task, intra, cpus in re.findall(
            r"^\[(worker \d)\] .*threads: (\d+) intra-op, \d+ inter-op .* on CPUs ([\d,-]+)$", output, re.M
        )
    }
    assert sorted(pinned) == sorted(reported) == ["worker 0", "worker 1"]
    assert not pinned["worker 0"] & pinned["worker 1"] and pinned["worker 0"] | pinned["worker 1"] <= machine
    for task, (intra, cpus) in reported.items():
        assert cpus == pinned[task], "the training process runs where the launcher pinned its worker"
        assert intra == len(cpus)
