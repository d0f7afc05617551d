"""Captures the tests share: the demo model fed by a real DataLoader, captured by
``xpuprof.profile`` at level ``layer`` (no framework ops recorded), with the test's own
stopwatch around each batch fetch; and the same kind of store written by hand.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

import xpuprof

if TYPE_CHECKING:
    from builders import TraceBuilder

#: How long the slow collate sleeps per batch (s): several times the demo's step (~10 ms alone,
#: 30-40 ms on a loaded 2-core VM), so that waiting for input is the bottleneck wherever it runs.
SLEEP_S = 0.06
STEPS = 6


def capture_layer_level(tmp_path: Path, idiom: str, sleep_s: float = SLEEP_S
                        ) -> tuple[Path, list[float]]:  # fmt: skip
    """The demo model fed by a DataLoader whose collate sleeps ``sleep_s`` per batch,
    captured at level ``layer`` for :data:`STEPS` steps; ``idiom`` says where the loop
    fetches its batch: ``with`` (``for batch in loader: with xpuprof.step(i): …``, the fetch
    between step spans) or ``top`` (``xpuprof.step(i)`` then ``next(loader)``, the fetch at
    the start of the step). Returns the store's path and the stopwatch reading (s) around
    each ``next(loader)``."""
    torch = pytest.importorskip("torch", reason="torch is an optional extra: pip install torch")
    from torch.utils.data import DataLoader

    from xpuprof.workloads.demo import Trainer

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # steady step times on a shared machine (no spinning threads)
    try:
        return _run(torch, DataLoader, Trainer, tmp_path, idiom, sleep_s)
    finally:
        torch.set_num_threads(threads)


def _run(torch, DataLoader, Trainer, tmp_path: Path, idiom: str, sleep_s: float
         ) -> tuple[Path, list[float]]:  # fmt: skip
    trainer = Trainer(batch=4, seq=32, layers=2)
    trainer.step()  # warm up outside the capture

    def collate(items):
        if sleep_s:
            time.sleep(sleep_s)
        return torch.stack(items)

    data = [trainer.data[0] for _ in range(4 * (STEPS + 4))]
    it = iter(DataLoader(data, batch_size=4, collate_fn=collate))
    waited = []
    store = tmp_path / idiom
    with xpuprof.profile(store, level="layer", model=trainer.model, telemetry=False):
        for i in range(STEPS):
            if idiom == "with":  # for batch in loader: with xpuprof.step(i): ...
                t0 = time.perf_counter()
                batch = next(it)
                waited.append(time.perf_counter() - t0)
                with xpuprof.step(i):
                    trainer.data = batch
                    trainer.step()
            else:  # xpuprof.step(i) at the top, then the batch
                xpuprof.step(i)
                t0 = time.perf_counter()
                batch = next(it)
                waited.append(time.perf_counter() - t0)
                trainer.data = batch
                trainer.step()
    return store, waited


def layer_level(tb: TraceBuilder) -> None:
    """What ``xpuprof.profile(level="layer")`` records, by hand (µs): three ``step#N`` spans
    of 100 µs at 0, 200 and 450, each holding a 50 µs ``model`` layer span (10, 10 and 5 µs
    after the step starts) around a 30 µs ``model.fc``; no op, no runtime call, no device."""
    for n, (start, layer) in enumerate([(0, 10), (200, 210), (450, 455)]):
        tb.x(f"step#{n}", "xpuprof_step", start, 100)
        tb.x("model", "xpuprof_layer", layer, 50)
        tb.x("model.fc", "xpuprof_layer", layer + 10, 30)
