"""Replicas side by side: the wall time of a graph's training step while every device of a setup
runs a replica of its own, each process with its own session, all at once.

Under TensorFlow's default thread pools the devices of a process run their ops side by side and
every process's ops spread over all cores, so what an op costs depends on what runs beside it (the
transformer's matmuls use both cores alone and gain nothing from a second device; the cnn's tiny
ops run one thread each and overlap). No single-device profile says which; running the setup's
replicas side by side measures it for this graph: `model.serial_share` reads how far the devices
overlap, and one replica alone gives `model.step_correction` its untraced steps.

A setup of P processes runs P-1 helper processes (`python -m tag_tf.localmachine.corun`), which
rebuild the zoo model, and are told on stdin which batch size to run until the next line."""
from __future__ import annotations

import json
import select
import statistics
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypedDict

import numpy as np

from tag_tf.localmachine import helpers
from tag_tf.localmachine.runtime import RUNTIMES, LocalSetup, Runtime, session_config
from tag_tf.measure.ops import zoo_steps

if TYPE_CHECKING:
    from tag_tf.measure.ops import TrainStep

WARMUP_S, MEASURE_S, MAX_STEPS = 0.3, 0.5, 400      # per batch size and pass (see _timed)
# Passes over every batch size in turn, each size's wall the median of its passes: a load burst on
# this shared machine lasting about a measurement then lands in one pass of one size, and is dropped,
# instead of bending the line fitted through the sizes (seen: one size 2.4x its neighbours).
PASSES = 3


class Replicas:
    """`devices` replicas of each batch size's training step in one session of this process, replica
    i on CPU device i (names prefixed r<i>/), run as `runtime`'s real runs are (its graph
    optimizations included)."""

    def __init__(self, steps: Mapping[int, TrainStep], devices: int, runtime: Runtime):
        import tensorflow as tf

        self.sessions: dict[int, Any] = {}
        self.fetches: dict[int, list[str]] = {}
        self.feeds: dict[int, dict[str, np.ndarray]] = {}
        for b, st in steps.items():
            graph = tf.Graph()
            with graph.as_default():
                for i in range(devices):
                    with tf.device(f"/device:CPU:{i}"):
                        tf.graph_util.import_graph_def(st.graph_def, name=f"r{i}")
            sess = tf.compat.v1.Session(graph=graph, config=session_config(devices, runtime=runtime, as_written=False))
            if st.init_op:
                sess.run([f"r{i}/{st.init_op}" for i in range(devices)])
            self.sessions[b] = sess
            self.fetches[b] = [f"r{i}/{st.train_op}" for i in range(devices)]
            self.feeds[b] = {f"r{i}/{k}": v for i in range(devices) for k, v in st.feed.items()}

    def step(self, b: int) -> float:
        start = time.perf_counter()
        self.sessions[b].run(self.fetches[b], self.feeds[b])
        return time.perf_counter() - start

    def close(self) -> None:
        for sess in self.sessions.values():
            sess.close()


def corun_walls(name: str, kwargs: Mapping[str, Any], setup: LocalSetup, sizes: Sequence[int], repeats: int,
                warmup: int = 3, passes: int = PASSES) -> dict[int, float]:
    """{batch size per replica: seconds of this process's step} while every device of `setup` runs a
    replica at that batch size (this process: `devices_per_process` of them; each other process of
    the setup: a helper running as many): the median over `passes` of each pass's median step."""
    sizes = sorted({int(b) for b in sizes})
    others: list[subprocess.Popen] = []
    replicas = None
    try:
        for _ in range(setup.processes - 1):
            others.append(_start_helper(name, kwargs, setup, sizes))
        replicas = Replicas(zoo_steps(name, sizes, **kwargs), setup.devices_per_process, setup.runtime)
        found: dict[int, list[float]] = {b: [] for b in sizes}
        for _ in range(max(1, passes)):
            for b in sizes:
                for proc in others:          # the helpers switch to b and warm up before we time anything
                    helpers.tell(proc, str(b))
                for proc in others:
                    helpers.expect(proc, helpers.READY)
                _timed(replicas, b, warmup, WARMUP_S)
                found[b].append(statistics.median(_timed(replicas, b, repeats, MEASURE_S)))
        return {b: statistics.median(walls) for b, walls in found.items()}
    finally:
        if replicas is not None:
            replicas.close()
        for proc in others:
            helpers.stop(proc)


def _timed(replicas: Replicas, b: int, steps: int, seconds: float) -> list[float]:
    """At least `steps` steps and at least `seconds` of them (at most MAX_STEPS): a tiny graph's
    step is a fraction of a millisecond, and its first tens of steps run slower."""
    times: list[float] = []
    while len(times) < steps or (sum(times) < seconds and len(times) < MAX_STEPS):
        times.append(replicas.step(b))
    return times


def _start_helper(name: str, kwargs: Mapping[str, object], setup: LocalSetup, sizes: Sequence[int]) -> subprocess.Popen:
    return helpers.start("tag_tf.localmachine.corun", {"name": name, "kwargs": dict(kwargs), "sizes": list(sizes),
                                                       "devices": setup.devices_per_process,
                                                       "runtime": setup.runtime.tag}, setup.runtime)


class _Spec(TypedDict):
    """What `_start_helper` tells a helper (as JSON on its command line)."""

    name: str
    kwargs: dict[str, Any]      # build_model's keyword arguments
    sizes: list[int]
    devices: int
    runtime: str


def _helper(spec: _Spec) -> None:
    """A helper's body: build, say READY; then for each batch size read from stdin: warm up, say
    READY, and run steps until the next line (end of input: exit)."""
    replicas = Replicas(zoo_steps(spec["name"], spec["sizes"], **spec["kwargs"]), int(spec["devices"]),
                        RUNTIMES[spec["runtime"]])
    helpers.say(helpers.READY)
    b = None
    while True:
        if b is None or select.select([sys.stdin], [], [], 0)[0]:
            line = sys.stdin.readline()
            if not line.strip():
                break
            b = int(line)
            _timed(replicas, b, 3, WARMUP_S)
            helpers.say(helpers.READY)
        replicas.step(b)
    replicas.close()


if __name__ == "__main__":
    _helper(json.loads(sys.argv[1]))
