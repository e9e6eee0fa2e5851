"""Data-parallel training through ``torchrun``: gloo on CPU, nccl on GPU, rank 0 logs and saves.

``torchrun --nproc-per-node N -m attnconv.cli train CONFIG`` sets RANK / WORLD_SIZE / LOCAL_RANK;
without them everything runs in one process. Each rank reads its slice of every global batch
(attnconv.data.Loader), DDP averages the gradients, so N processes with global batch B compute the
same update as one process with batch B (exactly so without dropout: each rank draws its own
dropout masks, ``rank_seed``).
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn

from attnconv import device as compute
from attnconv.data.loader import generator


@dataclass
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_distributed(device: str | torch.device | None = None) -> DistInfo:
    """Join the process group torchrun describes (or stay single-process). ``device``: see
    ``attnconv.device.resolve_device`` (default: CUDA if available); under torchrun a CUDA
    device means each rank's own GPU (LOCAL_RANK)."""
    dev = compute.resolve_device(device)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistInfo(device=dev)
    rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if dev.type == "cuda":
        torch.cuda.set_device(local)
        backend, dev = "nccl", torch.device("cuda", local)
    else:
        backend, dev = "gloo", torch.device("cpu")
    if not dist.is_initialized():
        dist.init_process_group(backend=backend)
    global _joined
    _joined = True
    return DistInfo(rank, world, local, dev)


_joined = False  # this process joined a process group (init_distributed)


def set_up_compute(t, info: DistInfo) -> tuple[bool, str | None]:
    """This process's compute settings from the config's ``train`` section ``t``: its thread
    count, bf16 autocast where it speeds a step (``attnconv.device.bf16_passed_over``; every
    rank takes the same choice), subnormals flushed on every thread, deterministic algorithms.
    Returns (bf16 on, why it was passed over or None)."""
    if t.threads:
        torch.set_num_threads(t.threads)
    off = compute.bf16_passed_over(info.device) if t.bf16 else None
    if t.bf16 and any_rank(off is not None, info):  # the ranks agree
        off = off or "passed over on another rank's CPU"
    if info.device.type == "cpu":  # after the thread count: every thread of it
        compute.flush_subnormals(t.flush_subnormals)
    if t.deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
    return t.bf16 and off is None, off


def exit_worker(code: int) -> None:
    """End a process that joined a process group now, with ``code``, without the interpreter's
    teardown, so that no process group is destroyed (``wrap`` says why); logs and streams are
    flushed here, and everything else is saved by then. A process that never joined returns.
    A script of your own that trains under torchrun can end the same way."""
    if not _joined:
        return
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def wrap(model: nn.Module, info: DistInfo) -> nn.Module:
    """``model`` in DDP, held to the process's end (``exit_worker``). Its Reducer owns the process
    group, whose destructor joins gloo's worker thread; that thread may still be releasing a
    finished collective's tensors, which needs the GIL. Freed from Python (holding the GIL) it
    hung a rank for good; freed in the interpreter's teardown it aborted one ("terminate called
    without an active exception"), each in 1 of 10-40 two-process runs on a loaded machine."""
    if not info.enabled:
        return model
    ids = [info.local_rank] if info.device.type == "cuda" else None
    _held.append(net := nn.parallel.DistributedDataParallel(model, device_ids=ids))
    return net


_held: list[nn.Module] = []  # every DDP wrapper of this process, never freed (wrap)


def sync_buffers(model: nn.Module, info: DistInfo) -> None:
    """Rank 0's buffers (BatchNorm's running statistics) on every rank. DDP broadcasts them
    before each training forward, and each rank's forward then updates its own from its slice:
    an evaluation sharded over the ranks would read each rank's, the checkpoint saves rank 0's."""
    if not info.enabled:
        return
    for b in model.buffers():
        dist.broadcast(b, 0)


def all_reduce_sum(values: list[float], info: DistInfo) -> list[float]:
    """Sum a few numbers over the ranks (float64)."""
    if not info.enabled:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=info.device)
    dist.all_reduce(t)
    return t.tolist()


def rank_seed(seed: int, step: int, rank: int) -> int:
    """The torch seed of rank ``rank`` > 0 at global step ``step``. Every rank but 0 reseeds its
    generators with it before each step: ranks that shared one stream would give rank r's image i
    the dropout mask of rank 0's image i, and a seed that is a function of (seed, step, rank)
    makes a resumed run draw what an uninterrupted one does. Rank 0 keeps the run's own stream
    (saved in each checkpoint), so a one-process run is unchanged."""
    return int(torch.randint(0, 1 << 62, (), generator=generator(seed, step, rank, 2)))


def any_rank(flag: bool, info: DistInfo) -> bool:
    return all_reduce_sum([float(flag)], info)[0] > 0 if info.enabled else flag


def barrier(info: DistInfo) -> None:
    if info.enabled:
        dist.barrier()


def shutdown(info: DistInfo) -> None:
    if info.enabled and dist.is_initialized():
        dist.destroy_process_group()


# torchrun's rendezvous: its c10d store on 127.0.0.1, port 0 (the store binds a free one)
RENDEZVOUS = ["--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:0"]


def torchrun_command(procs: int) -> list[str]:
    """``torchrun --nproc-per-node procs`` (this interpreter's); the program and its arguments
    follow. The rendezvous is torchrun's c10d store on 127.0.0.1 port 0: the store binds a free
    port as it starts and tells the workers (MASTER_PORT), so launches at once never race for a
    port (one picked free beforehand may be bound by another process before torchrun binds it)."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(procs),
        *RENDEZVOUS,
    ]
