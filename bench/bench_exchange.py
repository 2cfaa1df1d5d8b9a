"""Bench: the MLP's param exchange between a worker process and a server process over tcp.

    python bench/bench_exchange.py [--rounds 8] [--steps 5]

Ours: SINGA's MNIST MLP job (examples/mnist/job.conf, 12 M floats) with
`nworkers_per_group: 1, server_worker_separate: true`: process 0 runs the worker and its stub,
process 1 (a child process) the server and its stub, both built by `runtime.Process` and
talking over tcp on 127.0.0.1. A step is the exchange without the maths: an Update of every
param (the gradients to the server, which applies SGD), then `collect_all` (the new values
back). Reference: raw pyzmq, a DEALER sending the same arrays over tcp 127.0.0.1 to a ROUTER
in a child process that sends them back, the same bytes each way. A second reference adds to
it the arithmetic our exchange must do: the echo side applies SGD (w -= lr * g) to params of
its own and replies with them, the sending side copies the replies into arrays of its own;
ours against it is the cost of our messages alone. Interleaved rounds, medians. Each side's
CPU time per step, summed over its two processes, is also given: on 2 cores the exchange is
bound by it (the kernel's copies through the tcp loopback, then the SGD pass and the copy-in).
Target: ours reaches >= 80 % of the raw throughput (raw / ours >= 0.8). Ours is measured
plain (`trusted_network: true`) and over CURVE, a job's default across processes (the keys of
a secret, encryption of every frame). Exits 0 whatever.
"""
import argparse
import multiprocessing as mp
import os
import sys
import tempfile
import threading

import singa  # noqa: F401  (first: it picks OpenBLAS's kernels before numpy loads it)
import numpy as np
import zmq

from bench_mlp_step import interleaved, mlp_job, print_table
from singa.comm.trust import JobTrust, new_secret
from singa.train.place import Place
from singa.train.runtime import Process, Transport

TARGET = 0.8

def server_side(workspace, conn, secret=None):
    """Process 1 of the job: its server and stub, until the parent says stop (over CURVE with
    the keys of `secret`, when given)."""
    job = mlp_job(workspace)
    job.cluster.server_worker_separate = True
    transport = Transport(JobTrust(secret) if secret else None)
    conn.send(transport.listen("127.0.0.1"))
    endpoints = conn.recv()
    process = Process(job, Place(1, 2, endpoints.__getitem__, transport))
    threading.Thread(target=lambda: (conn.recv(), process.stub.stop_servers()),
                     daemon=True).start()
    process.run()

def echo_side(endpoint_conn, sizes=None):
    """Echo every message back; with `sizes`, the arrays of a step are SGD-updated params
    (w -= lr * g, as our server does) and the reply carries w instead of the message."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    endpoint_conn.send(port)
    params = [np.zeros(n, np.float32) for n in sizes or ()]
    k = 0
    while True:
        frames = sock.recv_multipart(copy=False)
        if len(frames) == 2 and bytes(frames[1]) == b"stop":
            break
        if params:
            w = params[k]
            g = np.frombuffer(frames[2].buffer, np.float32)
            g *= np.float32(0.001)
            w -= g
            frames[2] = w
            k = (k + 1) % len(params)
        sock.send_multipart(frames, copy=False)

def cpu_seconds(pid):
    """User + system CPU time of process `pid` so far (all its threads)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class CpuMeter:
    """Wraps a side's step; `per_call()`: the mean CPU seconds of this process and the child
    over the calls (both include ZeroMQ's I/O threads and the kernel's work for them)."""

    def __init__(self, fn, child_pid):
        self.fn, self.child_pid = fn, child_pid
        self.seconds, self.calls = 0.0, 0

    def __call__(self):
        pids = (os.getpid(), self.child_pid)
        before = sum(map(cpu_seconds, pids))
        self.fn()
        self.seconds += sum(map(cpu_seconds, pids)) - before
        self.calls += 1

    def per_call(self):
        return self.seconds / max(1, self.calls)


class Ours:
    def __init__(self, workspace, secret=None):
        job = mlp_job(workspace)
        job.cluster.server_worker_separate = True
        self.conn, child = mp.Pipe()
        self.child = mp.get_context("fork").Process(target=server_side,
                                                     args=(workspace, child, secret))
        self.child.start()
        transport = Transport(JobTrust(secret) if secret else None)
        endpoints = {0: transport.listen("127.0.0.1"), 1: self.conn.recv()}
        self.conn.send(endpoints)
        self.process = Process(job, Place(0, 2, endpoints.__getitem__, transport))
        self.worker = self.process.workers[0]
        self.stub = threading.Thread(target=self.process.stub.run, daemon=True)
        self.stub.start()
        self.worker.init_params()
        self.step = 0
        self.params = [p for layer in self.worker.train_net.layers for p in layer.params]
        self.nbytes = sum(p.data.nbytes for p in self.params)

    def exchange(self):
        for p in self.params:
            self.worker.params.update(self.step, p)
        self.worker.collect_all()
        self.step += 1

    def close(self):
        from singa.comm import msg as m
        self.worker.dealer.send(m.Msg(self.worker.address, m.STUB, m.kStop))
        self.stub.join(timeout=30)
        self.process.close()
        self.conn.send("stop")
        self.child.join(timeout=30)

class Raw:
    """Raw pyzmq; with `arithmetic`, also the work our exchange cannot skip: the echo side
    applies SGD to its own params and this side copies the values back into its own."""

    def __init__(self, arrays, arithmetic=False):
        parent, child = mp.Pipe()
        sizes = [a.size for a in arrays] if arithmetic else None
        # spawned, not forked: this process already runs threads (ours's stub, ZeroMQ's)
        self.child = mp.get_context("spawn").Process(target=echo_side, args=(child, sizes))
        self.child.start()
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.connect(f"tcp://127.0.0.1:{parent.recv()}")
        self.arrays = arrays
        self.mine = [np.empty_like(a) for a in arrays] if arithmetic else None

    def exchange(self):
        for a in self.arrays:
            self.sock.send_multipart([b"h", a], copy=False)
        for k in range(len(self.arrays)):
            frames = self.sock.recv_multipart(copy=False)
            if self.mine is not None:
                self.mine[k][...] = np.frombuffer(frames[1].buffer, np.float32)

    def close(self):
        self.sock.send_multipart([b"stop"])
        self.child.join(timeout=30)
        self.sock.close(0)
        self.ctx.term()

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--steps", type=int, default=5)
    args = ap.parse_args(argv)
    workspace = tempfile.mkdtemp(prefix="singa-bench-exchange-")
    os.makedirs(os.path.join(workspace, "checkpoint"), exist_ok=True)
    ours = Ours(workspace)
    curve = Ours(tempfile.mkdtemp(prefix="singa-bench-exchange-curve-"), new_secret())
    os.makedirs(os.path.join(curve.worker.folder), exist_ok=True)
    grads = [p.grad.reshape(-1).copy() for p in ours.params]
    raw, raw_sgd = Raw(grads), Raw(grads, arithmetic=True)
    meters = {"ours (worker process <-> server process)": CpuMeter(ours.exchange, ours.child.pid),
              "ours over CURVE (the default)": CpuMeter(curve.exchange, curve.child.pid),
              "raw pyzmq echo": CpuMeter(raw.exchange, raw.child.pid),
              "raw pyzmq + SGD + copy-in": CpuMeter(raw_sgd.exchange, raw_sgd.child.pid)}
    try:
        med = interleaved(meters, args.rounds, args.steps)
    finally:
        ours.close()
        curve.close()
        raw.close()
        raw_sgd.close()
    mb = 2 * ours.nbytes / 1e6
    print(f"MLP param exchange, {len(ours.params)} arrays, {ours.nbytes / 1e6:.1f} MB each way, "
          f"tcp 127.0.0.1, {args.rounds} rounds x {args.steps}, median:")
    print_table([[name, f"{t * 1e3:.1f}", f"{mb / t / 1e3:.2f}",
                  f"{meters[name].per_call() * 1e3:.1f}", f"{meters[name].per_call() / t:.2f}"]
                 for name, t in med.items()],
                ["side", "ms/step", "GB/s", "CPU ms/step", "CPU / wall"])
    ratio = med["raw pyzmq echo"] / med["ours (worker process <-> server process)"]
    print(f"throughput ours/raw = {ratio:.3f} (target >= {TARGET}: "
          f"{'within' if ratio >= TARGET else 'BELOW'} target)")
    print(f"throughput ours/(raw + SGD + copy-in) = "
          f"{med['raw pyzmq + SGD + copy-in'] / med['ours (worker process <-> server process)']:.3f}"
          f" (the cost of our messages alone)")
    print(f"throughput CURVE/plain = {med['ours (worker process <-> server process)'] / med['ours over CURVE (the default)']:.3f} "
          f"(what encryption and the job's keys cost; trusted_network: true turns it off)")
    cpu = meters["raw pyzmq echo"].per_call() / meters["ours (worker process <-> server process)"].per_call()
    print(f"CPU time raw/ours = {cpu:.3f} (the throughput ratio if both kept the same cores busy)")
    return 0

if __name__ == "__main__":
    sys.exit(main())
