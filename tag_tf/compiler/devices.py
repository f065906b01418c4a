"""Which TensorFlow device string each topology device (and the host) maps to at run time."""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from tag_tf.placement.layout import HOST

if TYPE_CHECKING:
    from tag_tf.topology.spec import Topology


@dataclasses.dataclass(frozen=True)
class DeviceMap:
    names: tuple[str, ...]         # TF device name of each topology device
    host: str                      # CPU of the chief: init/save ops, fetch adapters
    machines: tuple[int, ...]      # machine of each device
    gpu: tuple[bool, ...]          # whether each device is a GPU (NCCL is possible within a machine)

    def __getitem__(self, device: int) -> str:
        return self.host if device == HOST else self.names[device]

    def __len__(self) -> int:
        return len(self.names)

    def machine(self, device: int) -> int:
        return 0 if device == HOST else self.machines[device]

    @classmethod
    def local_cpus(cls, n: int) -> DeviceMap:
        """n virtual CPU devices in one process: sessions for them come from
        `tag_tf.runtime.sessions.session_config(n)`, which also sets their operation timeout."""
        names = tuple(f"/job:localhost/replica:0/task:0/device:CPU:{i}" for i in range(n))
        return cls(names, names[0], (0,) * n, (False,) * n)

    @classmethod
    def for_topology(cls, topology: Topology, job: str = "worker", simulated_gpus: bool = True) -> DeviceMap:
        """One TF task per machine; GPUs as GPU:i (or CPU:i for CPU-typed devices)."""
        names, machines, gpu = [], [], []
        for d in topology.devices:
            is_gpu = d.type != "cpu" and simulated_gpus
            kind = "GPU" if is_gpu else "CPU"
            names.append(f"/job:{job}/replica:0/task:{d.machine}/device:{kind}:{d.index}")
            machines.append(d.machine)
            gpu.append(is_gpu)
        host = f"/job:{job}/replica:0/task:0/device:CPU:0"
        return cls(tuple(names), host, tuple(machines), tuple(gpu))
