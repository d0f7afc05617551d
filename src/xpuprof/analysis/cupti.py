"""Kernel FLOPs and bytes from CUPTI range-profiler counters (``cuda_profiler_range`` events
whose args hold SASS instruction and DRAM byte counters), for the roofline's ``kernels``
table (``docs/roofline.md``).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from xpuprof.core.raw import decode_json

#: CUPTI SASS counters: precision → (add, mul, fma) metric names.
CUPTI_COUNTERS = {
    p: tuple(f"smsp__sass_thread_inst_executed_op_{c}{op}_pred_on.sum" for op in ("add", "mul",
             "fma"))
    for p, c in (("fp64", "d"), ("fp32", "f"), ("fp16", "h"))
}  # fmt: skip


def cupti_kernels(df: pd.DataFrame, notes: list[str]) -> pd.DataFrame:
    """FLOPs (add + mul + 2·fma, per precision), DRAM bytes and the dominant precision of the
    kernels in ``df`` (``cuda_profiler_range`` events with their ``args``), as rows of the
    roofline's kernels (``source``, ``matrix`` False); kernels with neither are left out.
    What the counters cannot say goes into ``notes``."""
    fl = np.full(len(df), np.nan)
    by = np.full(len(df), np.nan)
    dtype = np.full(len(df), "fp32", dtype=object)
    for i, a in enumerate(df["args"].tolist()):
        args = decode_json(a, default={})
        if not isinstance(args, dict):
            continue
        per = {}
        for prec, (add, mul, fma) in CUPTI_COUNTERS.items():
            vals = [args.get(add), args.get(mul), args.get(fma)]
            if any(isinstance(v, (int, float)) for v in vals):
                a_, m_, f_ = (float(v) if isinstance(v, (int, float)) else 0.0 for v in vals)
                per[prec] = a_ + m_ + 2 * f_
        if per:
            fl[i] = sum(per.values())
            dtype[i] = max(per, key=lambda p: per[p]) if any(per.values()) else "fp32"
        rd, wr, tot = (args.get(k) for k in ("dram__bytes_read.sum", "dram__bytes_write.sum",
                                              "dram__bytes.sum"))  # fmt: skip
        if isinstance(tot, (int, float)):
            by[i] = float(tot)
        elif isinstance(rd, (int, float)) or isinstance(wr, (int, float)):
            by[i] = float(rd or 0) + float(wr or 0)
    out = df.drop(columns=["args"]).copy()
    out["flops"] = fl
    out["bytes"] = by
    out["dtype"] = dtype
    out["source"] = "CUPTI SASS counters"
    out["matrix"] = False
    out = out[out["flops"].notna() | out["bytes"].notna()]
    # the range profiler's durations are its replay ranges: identical for every kernel
    same = out.groupby("part")["time_ns"].transform(lambda s: len(s) > 1 and s.nunique() == 1)
    if bool(same.any()):
        out.loc[same.astype(bool), "time_ns"] = np.nan
        notes.append(
            f"{int(same.sum())} cuda_profiler_range kernels share one duration per source (the "
            "CUPTI range profiler replays each kernel and records the range, not the kernel "
            "time): their FLOPs are reported, achieved rates are not."
        )
    if out["bytes"].isna().any() and len(out):
        notes.append(
            "CUPTI counter kernels without dram__bytes counters have no bytes: no intensity or "
            "bound for them. Their FLOPs count CUDA-core instructions only (no Tensor Core "
            "work)."
        )
    return out
