"""Trainers for tests/test_diloco_serverless.py (importable by spawned replicas: tests/ is on their sys.path)."""
import os
import threading

import torch

from composer_replication.diloco import make_diloco_outer_loop


def linear_trainer(manager, rank, world_size, *, steps=6, sync_every=3, crash_rank=None, crash_at=None, seed=0):
    "DiLoCo on a small linear model; `crash_rank` leaves the process abruptly at inner step `crash_at` (before its first sync)."
    torch.manual_seed(seed); model = torch.nn.Linear(8, 4)  # same init on every replica
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(100 + rank)
    with make_diloco_outer_loop(manager, [model], opt, sync_every=sync_every, use_bucketization=True):
        for step in range(1, steps + 1):
            if rank == crash_rank and step == crash_at: os._exit(9)  # like a segfault or the OOM killer
            x, y = torch.randn(16, 8, generator=g), torch.randn(16, 4, generator=g)
            opt.zero_grad(); torch.nn.functional.mse_loss(model(x), y).backward(); opt.step()
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def run_ranks(fn, world_size):
    "Run fn(rank) on world_size threads; return results or exceptions in rank order."
    out = [None] * world_size
    def go(k):
        try: out[k] = fn(k)
        except BaseException as e: out[k] = e
    ts = [threading.Thread(target=go, args=(k,)) for k in range(world_size)]
    for t in ts: t.start()
    for t in ts: t.join()
    return out
