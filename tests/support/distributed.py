"""run_distributed: run a function in N local gloo processes (CPU), as OLMo-core's tests do."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from datetime import timedelta


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank: int, world_size: int, port: int, fn: Callable, args: tuple) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=timedelta(seconds=60))
    try:
        fn(rank, world_size, *args)
    finally:
        dist.destroy_process_group()


def run_distributed(fn: Callable, world_size: int, *args, timeout_s: float = 120.0) -> None:
    """Call ``fn(rank, world_size, *args)`` in ``world_size`` spawned processes with a gloo process group.

    ``fn`` must be a module-level function (it is pickled). A failure in any process is raised here; a run
    past ``timeout_s`` (a hang) terminates the processes and raises TimeoutError."""
    import torch.multiprocessing as mp

    ctx = mp.spawn(_entry, args=(world_size, free_port(), fn, args), nprocs=world_size, join=False)
    deadline = time.monotonic() + timeout_s
    try:
        while not ctx.join(timeout=max(1.0, deadline - time.monotonic())):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{world_size} processes of {fn.__name__} did not finish in {timeout_s} s")
    finally:
        for proc in ctx.processes:
            if proc.is_alive():
                proc.terminate()
