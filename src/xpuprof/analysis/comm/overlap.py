"""How much of the communication runs under computation: per collective, and per participant as
HTA's comm/compute overlap (time where both run ÷ communication time)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from xpuprof.analysis.common import merge_intervals

if TYPE_CHECKING:
    from xpuprof.trace.trace import Trace

__all__ = ["OVERLAP_COLUMNS", "overlap"]

OVERLAP_COLUMNS = ["participant", "rank", "part", "device", "comm_time_ns", "overlapped_ns",
                   "overlap_pct"]  # fmt: skip


class _Cover:
    """The union of a device's computation kernels, asked how much of it lies before t."""

    def __init__(self, starts: np.ndarray, ends: np.ndarray) -> None:
        self.s, self.e = merge_intervals(starts, ends)
        self.prefix = np.concatenate([[0], np.cumsum(self.e - self.s)])

    def upto(self, t: np.ndarray) -> np.ndarray:
        """Length of the union that lies before each time ``t``."""
        s, e = self.s, self.e
        if not len(s):
            return np.zeros(len(t), np.float64)
        j = np.searchsorted(s, t, side="right") - 1
        jj = np.maximum(j, 0)
        inside = np.clip(t - s[jj], 0, e[jj] - s[jj])
        return np.where(j >= 0, self.prefix[jj] + inside, 0).astype(np.float64)

    def within(self, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """Length of the union inside each [start, end)."""
        return self.upto(ends) - self.upto(starts)


def overlap(trace: Trace, out: pd.DataFrame, where: str) -> tuple[np.ndarray, pd.DataFrame]:
    """Per collective of ``out`` (the collectives table so far), the ns during which a
    computation kernel (a ``kernel``-level event: not a collective, copy or set) of the
    selected events (``where``) runs on its device; and the per-participant table, one row
    per part and device (its ``participant`` left to the caller, who labels them across
    ranks)."""
    comp = trace.sql(
        f"""select part, device, ts, ts + dur as te from events
            where {where} and level = 'kernel' and dur is not null and device >= 0"""
    )
    per_kernel = np.zeros(len(out), np.float64)
    rows = []
    ts_all = out["ts"].to_numpy(np.int64)
    te_all = ts_all + out["dur"].to_numpy(np.int64)
    for (p, d), idx in out.groupby(["part", "device"]).indices.items():
        c = comp[(comp["part"] == p) & (comp["device"] == d)]
        cover = _Cover(c["ts"].to_numpy(np.int64), c["te"].to_numpy(np.int64))
        ts, te = ts_all[idx], te_all[idx]
        per_kernel[idx] = cover.within(ts, te)
        # HTA: overlap of the union of comm kernels with the union of compute kernels
        cs, ce = merge_intervals(ts, te)
        comm_len = float((ce - cs).sum())
        both = float(cover.within(cs, ce).sum())
        rows.append(
            {
                "participant": None,
                "rank": out["rank"].iat[idx[0]],
                "part": p,
                "device": d,
                "comm_time_ns": comm_len,
                "overlapped_ns": both,
                "overlap_pct": 100 * both / comm_len if comm_len else np.nan,
            }
        )
    return per_kernel, pd.DataFrame(rows, columns=OVERLAP_COLUMNS)
