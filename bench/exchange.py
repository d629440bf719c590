"""Processes, each pinned to a core, exchanging one gradient's worth of bytes: the floor and TF's all-reduce.

    python bench/exchange.py --bytes 1300000 --rounds 200 socket        # plain TCP on loopback + numpy add
    python bench/exchange.py --bytes 1300000 --rounds 200 collective    # MultiWorkerMirroredStrategy all-reduce
    python bench/exchange.py --bytes 1300000 --workers 8 collective     # the same all-reduce among 8 processes

Prints one JSON line: milliseconds per exchange (the median over `rounds`, measured by the first process). The
socket exchange is the least any all-reduce of two workers must do: send its N bytes, receive the other's N and add
them. The collective is TensorFlow's all-reduce of the same float32 tensor among `--workers` processes (2 unless
told), as training uses it: on CPUs a ring, 2 (workers - 1) messages in turn. With more processes than cores they
are pinned round-robin and share them.
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _exact(sock, view):
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:])
        if not n:
            raise ConnectionError("peer closed")
        got += n


def socket_peer(rank, port, nbytes, rounds):
    import threading

    import numpy as np

    mine = np.ones(nbytes // 4, dtype=np.float32)
    theirs = np.empty_like(mine)
    if rank == 0:
        with socket.create_server(("127.0.0.1", port)) as server:
            sock, _ = server.accept()
    else:
        deadline = time.monotonic() + 60
        while True:
            try:
                sock = socket.create_connection(("127.0.0.1", port))
                break
            except ConnectionRefusedError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    times = []
    with sock:
        for _ in range(rounds + 5):
            started = time.perf_counter()
            sender = threading.Thread(target=sock.sendall, args=(memoryview(mine).cast("B"),))
            sender.start()
            _exact(sock, memoryview(theirs).cast("B"))
            sender.join()
            np.add(mine, theirs, out=theirs)
            times.append(time.perf_counter() - started)
    return times[5:]


def collective_peer(rank, ports, nbytes, rounds):
    cluster = {"worker": [f"localhost:{port}" for port in ports]}
    os.environ["TF_CONFIG"] = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": rank}})
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    x = tf.ones([nbytes // 4])

    @tf.function
    def reduce_n(n):
        total = tf.zeros_like(x)
        for _ in tf.range(n):
            total += strategy.run(lambda: tf.distribute.get_replica_context().all_reduce("sum", x))
        return total

    reduce_n(tf.constant(5))
    times = []
    for _ in range(5):
        started = time.perf_counter()
        reduce_n(tf.constant(rounds // 5)).numpy()
        times.append((time.perf_counter() - started) / (rounds // 5))
    return times


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=("socket", "collective"))
    parser.add_argument("--bytes", type=int, required=True)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--workers", type=int, default=2, help="collective: processes in the ring (2 to 64)")
    parser.add_argument("--rank", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--ports", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    workers = args.workers
    if not 2 <= workers <= 64 or (args.kind == "socket" and workers != 2):
        allowed = "2" if args.kind == "socket" else "2 to 64"
        parser.exit(2, f"error: --workers {workers} is not allowed for {args.kind}; allowed: {allowed}\n")
    if args.rank is None:
        cores = sorted(os.sched_getaffinity(0))
        from trainer.cluster.local_processes import free_ports

        ports = ",".join(map(str, free_ports(workers)))
        peers = [
            subprocess.Popen(
                [sys.executable, __file__, args.kind, "--bytes", str(args.bytes), "--rounds", str(args.rounds)]
                + ["--workers", str(workers), "--rank", str(rank), "--ports", ports],
                stdout=subprocess.PIPE,
                env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
                preexec_fn=lambda rank=rank: os.sched_setaffinity(0, {cores[rank % len(cores)]}),
            )
            for rank in range(workers)
        ]
        outputs = [p.communicate(timeout=600)[0] for p in peers]
        if any(p.returncode for p in peers):
            raise SystemExit(f"{args.kind} exchange failed")
        print(outputs[0].decode().strip().splitlines()[-1])
        return
    ports = [int(port) for port in args.ports.split(",")]
    if args.kind == "socket":
        times = socket_peer(args.rank, ports[0], args.bytes, args.rounds)
    else:
        times = collective_peer(args.rank, ports, args.bytes, args.rounds)
    result = {"kind": args.kind, "bytes": args.bytes, "workers": workers, "ms": 1e3 * statistics.median(times)}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
