import json

import pytest

from trainer.cluster.topology import build_tf_config, is_chief, make_cluster, parse_tf_config, peers
from trainer.core.errors import UsageError

WORKERS = ["w0.ns.svc:2222", "w1.ns.svc:2222", "w2.ns.svc:2222"]


def test_worker_list_gives_exact_tf_config():
    assert build_tf_config(WORKERS, "worker", 1) == {
        "cluster": {"worker": ["w0.ns.svc:2222", "w1.ns.svc:2222", "w2.ns.svc:2222"]},
        "task": {"type": "worker", "index": 1},
    }


def test_cluster_with_chief_and_ps_keeps_job_order():
    spec = make_cluster(["10.0.0.2:2222", "10.0.0.3:2222"], chief="10.0.0.1:2222", ps=["10.0.0.9:2222"])
    assert build_tf_config(spec, "ps", 0) == {
        "cluster": {"chief": ["10.0.0.1:2222"], "worker": ["10.0.0.2:2222", "10.0.0.3:2222"], "ps": ["10.0.0.9:2222"]},
        "task": {"type": "ps", "index": 0},
    }


def test_ipv6_and_localhost_addresses_are_accepted():
    assert build_tf_config(["[::1]:2222", "localhost:65535"], "worker", 0)["cluster"] == {
        "worker": ["[::1]:2222", "localhost:65535"]
    }


@pytest.mark.parametrize(
    ("cluster", "task_type", "index", "message"),
    [
        ([], "worker", 0, "no addresses"),
        (["a:1", "a:1"], "worker", 0, "'a:1' appears twice"),
        (WORKERS, "worker", 3, "task index 3 is out of range for 'worker'; allowed: 0 to 2"),
        (WORKERS, "worker", -1, "task index -1 is out of range"),
        (WORKERS, "chief", 0, "task type 'chief' is not in the cluster"),
        (WORKERS, "worker", "0", "task index '0' must be an integer"),
        (["host:0"], "worker", 0, "port '0'; allowed: an integer from 1 to 65535"),
        (["host:65536"], "worker", 0, "port '65536'"),
        (["host:http"], "worker", 0, "port 'http'"),
        (["host"], "worker", 0, "'host' is not of the form host:port"),
        (["bad_host!:22"], "worker", 0, "invalid host 'bad_host!'"),
        ({"master": ["a:1"]}, "master", 0, "cluster job 'master' is unknown"),
        ({"chief": ["a:1", "b:1"]}, "chief", 0, "2 chief addresses"),
        ("a:1", "worker", 0, "not a string"),
    ],
)
def test_bad_inputs_name_the_value(cluster, task_type, index, message):
    with pytest.raises(UsageError, match=None) as err:
        build_tf_config(cluster, task_type, index)
    assert message in str(err.value)


def test_chief_rule():
    assert is_chief(build_tf_config(WORKERS, "worker", 0))
    assert not is_chief(build_tf_config(WORKERS, "worker", 1))
    with_chief = make_cluster(WORKERS, chief="c:2222")
    assert is_chief(build_tf_config(with_chief, "chief", 0))
    assert not is_chief(build_tf_config(with_chief, "worker", 0))
    assert is_chief(None)


def test_parse_round_trip_and_peers():
    tf_config = build_tf_config(WORKERS, "worker", 2)
    assert parse_tf_config(json.dumps(tf_config)) == tf_config
    assert [task.address for task in peers(tf_config)] == ["w0.ns.svc:2222", "w1.ns.svc:2222"]
    assert [task.name for task in peers(tf_config)] == ["worker 0", "worker 1"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "TF_CONFIG is not valid JSON"),
        ('{"cluster": {"worker": ["a:1"]}}', "needs 'cluster' and 'task'"),
        ('{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker"}}', "needs 'type' and 'index'"),
        ('{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 1}}', "task index 1 is out of range"),
    ],
)
def test_malformed_tf_config(text, message):
    with pytest.raises(UsageError) as err:
        parse_tf_config(text)
    assert message in str(err.value)


def test_addresses_are_assigned_chief_workers_ps_and_read_back_in_that_order():
    from trainer.cluster.topology import assign_addresses, task_order

    addresses = ["h0:1", "h1:1", "h2:1", "h3:1"]
    assert assign_addresses(addresses, 4) == {"worker": addresses}
    spec = assign_addresses(addresses, 2, 1)
    assert spec == {"chief": ["h0:1"], "worker": ["h1:1", "h2:1"], "ps": ["h3:1"]}
    assert task_order(spec) == addresses


@pytest.mark.parametrize(
    "workers, ps, chief, evaluator, count",
    [
        (4, 0, False, False, 4),
        (2, 1, False, False, 4),
        (2, 0, True, False, 3),
        (0, 0, True, True, 2),
        (2, 1, True, True, 5),
    ],
)
def test_the_task_count_is_the_addresses_a_cluster_spec_places(workers, ps, chief, evaluator, count):
    """One count for the run's Services (`create_cluster`) and the local ports (`local_topology`)."""
    from trainer.cluster.topology import assign_addresses, task_count, task_order

    assert task_count(workers, ps, chief, evaluator) == count
    addresses = [f"h{i}:1" for i in range(count)]
    assert task_order(assign_addresses(addresses, workers, ps, chief, evaluator)) == addresses


def test_control_addresses_are_the_next_ports_unless_trainer_control_names_them():
    from trainer.cluster.control import addresses

    tf_config = build_tf_config(["h0:2222", "h1:2222"], "worker", 1)
    assert addresses(tf_config, "") == {"worker": ["h0:2223", "h1:2223"]}, "as in the pipeline's Kubernetes mode"
    named = json.dumps({"worker": ["h0:7000", "h1:7000"]})
    assert addresses(tf_config, named) == {"worker": ["h0:7000", "h1:7000"]}
    adjacent = build_tf_config(["localhost:2222", "localhost:2223"], "worker", 0)
    with pytest.raises(UsageError, match=r"control address localhost:2223 \(a task's TF port \+ 1\) is another task's"):
        addresses(adjacent, "")
    with pytest.raises(UsageError, match=r"TRAINER_CONTROL '.*' does not have the shape of the TF_CONFIG cluster"):
        addresses(tf_config, json.dumps({"worker": ["h0:7000"]}))
    with pytest.raises(UsageError, match="TRAINER_CONTROL is not valid JSON"):
        addresses(tf_config, "{worker")


def test_the_one_tf_config_builder_adds_the_environment_only_when_asked_and_always_checks_the_cluster():
    cluster = {"chief": ["c:1"], "worker": ["w:1", "w:2"], "evaluator": ["e:1"]}
    assert build_tf_config(cluster, "worker", 1) == {
        "cluster": {"chief": ["c:1"], "worker": ["w:1", "w:2"], "evaluator": ["e:1"]},
        "task": {"type": "worker", "index": 1},
    }
    assert build_tf_config(cluster, "evaluator", 0, environment="cloud") == {
        "cluster": {"chief": ["c:1"], "worker": ["w:1", "w:2"], "evaluator": ["e:1"]},
        "task": {"type": "evaluator", "index": 0},
        "environment": "cloud",
    }
    with pytest.raises(UsageError, match=r"^address 'w:1' appears twice \(in 'worker' and 'ps'\)"):
        build_tf_config({"worker": ["w:1"], "ps": ["w:1"]}, "worker", 0, environment="cloud")
    with pytest.raises(UsageError, match=r"^cluster job 'master' is unknown"):
        build_tf_config({"master": ["m:1"]}, "master", 0, environment="cloud")


def test_a_jobs_cluster_and_a_runs_cluster_come_from_one_topology():
    from trainer.cluster.topology import assign_addresses

    addresses = ["a:1", "b:1", "c:1", "d:1", "e:1"]
    assert assign_addresses(addresses, 2, 1, chief=True, evaluator=True) == {
        "chief": ["a:1"],
        "worker": ["b:1", "c:1"],
        "ps": ["d:1"],
        "evaluator": ["e:1"],
    }
    assert assign_addresses(addresses[:2], 0, chief=True, evaluator=True) == {"chief": ["a:1"], "evaluator": ["b:1"]}
    assert assign_addresses(addresses[:3], 2, chief=True) == {"chief": ["a:1"], "worker": ["b:1", "c:1"]}
    assert assign_addresses(addresses[:4], 2, 1) == {"chief": ["a:1"], "worker": ["b:1", "c:1"], "ps": ["d:1"]}


def test_a_lost_peer_is_named_once_it_stops_answering_while_it_is_still_closing_its_sockets():
    """A SIGKILLed peer resets a connection before its server stops accepting: the report waits for that."""
    import socket
    import threading

    from trainer.cluster.peers import lost_peer_message

    alive, closing = socket.create_server(("127.0.0.1", 0)), socket.create_server(("127.0.0.1", 0))
    ports = [alive.getsockname()[1], closing.getsockname()[1]]
    tf_config = build_tf_config(["127.0.0.1:1", *(f"127.0.0.1:{p}" for p in ports)], "worker", 0)
    closed = threading.Event()

    def close_once_probed():
        closing.accept()[0].close()  # the first probe connects: the server is still up
        closing.close()
        closed.set()

    threading.Thread(target=close_once_probed, daemon=True).start()
    try:
        message = lost_peer_message(tf_config, "Collective ops is aborted by: recvmsg:Connection reset by peer\nmore")
        assert closed.is_set()
        assert message == (
            f"lost contact with a peer during training (worker 2 at 127.0.0.1:{ports[1]} (Connection refused)): "
            "Collective ops is aborted by: recvmsg:Connection reset by peer"
        )
        answering = build_tf_config(["127.0.0.1:1", f"127.0.0.1:{ports[0]}"], "worker", 0)
        waited = lost_peer_message(answering, "reset", "a parameter server", settle=0.3)
        assert waited == "lost contact with a parameter server during training (no peer is unreachable now): reset"
    finally:
        alive.close()
