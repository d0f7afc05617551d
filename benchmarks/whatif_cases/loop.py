"""The timing loop every validation case shares: ``warmup + steps`` iterations, each marked
with ``xpuprof.step(i)``, timed with ``time.perf_counter``; under ``xpuprof.profile`` when a
store is given (the baseline's capture), a plain loop otherwise (what is measured)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def timed_steps(
    step: Callable[[int], float | None],
    steps: int,
    warmup: int,
    store: Path | None = None,
    before: Callable[[], Any] | None = None,
    **profile: Any,
) -> tuple[list[float], list[float]]:
    """Times (s) of the steps after warm-up, and what ``step(i)`` returned for them (a part it
    timed itself, e.g. the batch's fetch; None values left out). ``before`` runs ahead of each
    step's clock (``torch.cuda.synchronize``). With ``store``: captured by
    ``xpuprof.profile(store, level="op", steps=steps, warmup=warmup, **profile)``."""
    import xpuprof

    ctx = (xpuprof.profile(store, level="op", steps=steps, warmup=warmup, **profile)
           if store is not None else None)  # fmt: skip
    times: list[float] = []
    parts: list[float] = []
    if ctx is not None:
        ctx.__enter__()
    try:
        for i in range(steps + warmup):
            xpuprof.step(i)
            if before is not None:
                before()
            t0 = time.perf_counter()
            part = step(i)
            if i >= warmup:
                times.append(time.perf_counter() - t0)
                if part is not None:
                    parts.append(part)
        xpuprof.step(steps + warmup)
    finally:
        if ctx is not None:
            ctx.__exit__(None, None, None)
    return times, parts
