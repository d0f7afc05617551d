"""A real two-process ``torch.distributed`` (gloo, CPU) training loop whose rank 1 is slow.

Run as ``python tests/gloo_job.py OUT_DIR [--ranks N] [--sleep-ms MS] [--steps K]``: spawns N
processes (``torch.multiprocessing``, rendezvous through a ``file://`` init method in OUT_DIR),
each training a tiny MLP whose gradients are all-reduced by hand and whose parameters are
broadcast from rank 0 once per step; the last rank sleeps ``--sleep-ms`` in every step, split
evenly before each of its collectives (4 all-reduces and 4 broadcasts per step), so it arrives
last at every collective and the others wait for it there. Each rank writes
``OUT_DIR/rank{R}.pt.trace.json`` (``torch.profiler``'s Chrome trace, a schedule of 1 wait,
1 warm-up and ``--steps`` active steps) and ``OUT_DIR/rank{R}.json`` (what it ran: the sleep it
was given, the steps recorded). The test reads the traces' raw JSON for its expected numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _worker(rank: int, world: int, out: str, sleep_ms: float, steps: int) -> None:
    """One rank: init the group, run and profile the loop, export its trace."""
    dist.init_process_group(
        "gloo", init_method=f"file://{Path(out) / 'rendezvous'}", rank=rank, world_size=world
    )
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 64), torch.randn(32, 8)
    slow = rank == world - 1
    pause = sleep_ms / 1000 / (2 * len(list(model.parameters()))) if slow else 0.0
    sched = torch.profiler.schedule(wait=1, warmup=1, active=steps, repeat=1)
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU], schedule=sched, record_shapes=True
    ) as prof:
        for _ in range(2 + steps):
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            for p in model.parameters():
                time.sleep(pause)
                dist.all_reduce(p.grad)
                p.grad /= world
            opt.step()
            for p in model.parameters():
                time.sleep(pause)
                dist.broadcast(p.data, src=0)
            prof.step()
    prof.export_chrome_trace(str(Path(out) / f"rank{rank}.pt.trace.json"))
    info = {"rank": rank, "world": world, "sleep_ms": sleep_ms if slow else 0.0, "steps": steps}
    (Path(out) / f"rank{rank}.json").write_text(json.dumps(info))
    dist.barrier()
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--sleep-ms", type=float, default=40.0)
    ap.add_argument("--steps", type=int, default=3)
    a = ap.parse_args(argv)
    Path(a.out).mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    mp.spawn(_worker, args=(a.ranks, a.out, a.sleep_ms, a.steps), nprocs=a.ranks, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
