"""What the viewer marks over the timeline: the critical path and the advisor's findings.

Both come from the analyses as they are (``analysis/critical_path.py``: its ``path`` table, one
row per segment with the charged ``event`` and the ``src``/``dst`` events it joins;
``advise/rules.py``: each recommendation's ``events``); this module only says where each event
is drawn (track, depth, start, duration). A segment without a charged event (a gap, a wait)
is placed on its two ends' track when they share one, else on none. Computed once per
selection and kept on the Trace: the analyses take seconds on a large store.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from xpuprof.core.errors import XpuprofError
from xpuprof.view.detail import rows, where
from xpuprof.view.errors import ViewError
from xpuprof.view.tiers import open_tiers
from xpuprof.view.window import integer

if TYPE_CHECKING:
    from xpuprof.analysis.common import StepSelection
    from xpuprof.trace.trace import Trace

_COLUMNS = ("id", "part", "pid", "tid", "device", "stream", "depth", "ts", "dur", "name")


def _selection(ranks: Iterable[Any] | None, steps: Any) -> tuple[list[int] | None, Any]:
    from xpuprof.analysis.common import step_mode

    if ranks is not None:
        if isinstance(ranks, (str, bytes)) or not isinstance(ranks, Iterable):
            raise ViewError(f"ranks must be a list of rank numbers, not {ranks!r}")
        ranks = sorted({integer("rank", r) for r in ranks})
    if steps is not None and not isinstance(steps, str):
        if not isinstance(steps, Iterable):
            raise ViewError(f"steps must be 'all', 'drop-last' or step numbers, not {steps!r}")
        steps = sorted({integer("step", s) for s in steps})
    try:
        step_mode(steps)
    except XpuprofError as e:
        raise ViewError(str(e)) from None
    return ranks, steps


def _int(v: Any) -> int | None:
    import pandas as pd

    return None if v is None or bool(pd.isna(v)) else int(v)


def overlays(trace: Trace, *, ranks: Iterable[int] | None = None,
             steps: StepSelection = None) -> dict[str, Any]:  # fmt: skip
    """The critical path's segments and the advisor's findings, each event placed on its track
    (``docs/view.md``)."""
    from xpuprof.advise.rules import advise
    from xpuprof.analysis.critical_path import critical_path

    ranks, steps = _selection(ranks, steps)
    key = ("view", "overlays", None if ranks is None else tuple(ranks),
           steps if steps is None or isinstance(steps, str) else tuple(steps))  # fmt: skip
    if key in trace.memo:
        return trace.memo[key]
    tv = open_tiers(trace)
    path = critical_path(trace, ranks=ranks, steps=steps).tables["path"]
    recs = advise(trace, ranks=ranks, steps=steps).tables["recommendations"]
    seg = [(_int(e), _int(s), _int(d)) for e, s, d in zip(path["event"], path["src"], path["dst"],
                                                           strict=True)]  # fmt: skip
    found = [[int(i) for i in (ids or [])] for ids in recs["events"]]
    wanted = {i for t in seg for i in t if i is not None} | {i for f in found for i in f}
    known = rows(trace, wanted, _COLUMNS)
    place = {i: where(tv, r) for i, r in known.items()}
    out = []
    for (e, s, d), ts, end, cat in zip(seg, path["start"], path["end"], path["attribution"],
                                       strict=True):  # fmt: skip
        track, depth = place.get(e, (None, None)) if e is not None else (None, None)
        if e is None and s in place and d in place and place[s][0] == place[d][0]:
            track = place[s][0]
        out.append({"id": e if e in known else None, "track": track, "depth": depth,
                    "ts": int(ts), "dur": int(end) - int(ts), "category": str(cat)})  # fmt: skip
    findings = []
    for (_, r), ids in zip(recs.iterrows(), found, strict=True):
        evs = [
            {
                "id": i,
                "track": place[i][0],
                "depth": place[i][1],
                "ts": known[i]["ts"],
                "dur": known[i]["dur"] or 0,
                "name": known[i]["name"],
            }
            for i in ids
            if i in known
        ]
        findings.append({"title": str(r["finding"]), "recommendation": str(r["recommendation"]),
                         "rule": str(r["rule"]), "saving": str(r["saving"]), "ids": ids,
                         "events": evs})  # fmt: skip
    res = {"critical_path": out, "findings": findings}
    trace.memo[key] = res
    return res
