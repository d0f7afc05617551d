"""Turn a reader's raw columns into the normalized tables of ``xpuprof.core.schema``.

Everything here is vectorized over whole columns (numpy / Arrow): the only Python loops run over
things there are few of (threads, categories, unique names, B/E pairs, counters), never over
events, because per-event Python is what makes other tools load at tens of thousands of events
per second.

What is derived, and why it is derived here rather than in each analysis:

* ``level``: the across-stack level, from the category through the vocabulary of the source's
  reader (``formats.vocabulary``), and for a few names from the name (``ProfilerStep#N`` →
  step, ``nccl*`` kernels → collective, ``nn.Module: …`` → layer) — ``levels.py``;
* ``device``/``stream``: from the reader's device categories, args and process labels;
* ``parent``/``depth``: nesting of events on their own track (pid, tid) — the one timeline fact
  every analysis needs and none should recompute (``trace/nesting.py``);
* ``step``: the training step an event belongs to (host events by time, device events through
  the runtime call that launched them, by correlation id), and which marker defines the steps:
  ``ProfilerStep#N``, XLA step markers, ``xpuprof.step``, else step windows inferred from
  ``Optimizer.step#…`` spans or repeated forward calls, added as events (``docs/steps.md``) —
  ``steps.py``;
* flow binding: each flow entry is bound to the slice it belongs to on its track (Chrome-trace
  semantics: the enclosing slice; for an ``f`` without ``bp: "e"``, the next slice), and the
  entries sharing a (category, id) are joined into ``links`` (launch → kernel, forward →
  backward) — ``flows.py``.

The normaliser knows no format: what a category means comes from the registry.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa

from xpuprof.formats import vocabulary
from xpuprof.trace.nesting import bind_flows, depths, match_correlation, nest
from xpuprof.trace.normalize.entries import (
    counters_table,
    fold_leftovers,
    match_begin_end,
    metadata_table,
)
from xpuprof.trace.normalize.events import events_table
from xpuprof.trace.normalize.flows import flow_tables
from xpuprof.trace.normalize.levels import DTYPE_BYTES

#: Chrome-trace phases of spans and instants, and of flow entries.
SPAN_PHASES = ("X", "B", "E", "i", "I", "n", "b", "e")
FLOW_PHASES = ("s", "t", "f")


@dataclass
class Tables:
    """The normalized tables of one source file."""

    events: pa.Table
    flows: pa.Table
    links: pa.Table
    counters: pa.Table
    metadata: pa.Table
    #: What defined the steps (``steps.STEPS_FROM``): the manifest's ``steps_from``.
    steps_from: str = "none"


def build_tables(
    raw: dict[str, pa.Table],
    *,
    part: int,
    rank: int | None,
    host: str | None,
    string_ids: dict[str, dict[str, str]],
    format: str | None = None,
    on_events: Callable[[pa.Table], None] | None = None,
) -> Tables:
    """Normalize one source file's raw columns, already split by kind of entry
    (``raw.KINDS``; columns as in ``raw.RAW_SCHEMA``). ``format`` names the reader that read
    them (``RawTrace.format``): its vocabulary gives categories their levels (None: the
    built-in vocabularies only). ``on_events`` is handed the events table as soon as it is
    final, before the flows are bound (a writer can start on it meanwhile)."""
    vocab = vocabulary(format)
    index_start = _next_index(raw)
    meta_raw = fold_leftovers(raw.pop("metadata"), ("flow_id", "bp", "scope", "dur"))
    metadata = metadata_table(meta_raw, part, rank)
    ev_raw = fold_leftovers(match_begin_end(raw.pop("events")), ("flow_id", "bp"))
    events, timeline, steps_from = events_table(
        ev_raw, part, rank, host, string_ids, meta_raw, vocab, index_start
    )
    del ev_raw
    if on_events is not None:
        on_events(events)
    fl_raw = fold_leftovers(raw.pop("flows"), ("scope", "dur"))
    flows, links = flow_tables(fl_raw, timeline, part, rank)
    del timeline
    counters = counters_table(
        fold_leftovers(raw.pop("counters"), ("flow_id", "bp", "scope", "dur")), part, rank
    )
    return Tables(events, flows, links, counters, metadata, steps_from)


def _next_index(raw: dict[str, pa.Table]) -> int:
    """The first ``index`` no entry of the source has (where inferred step spans go)."""
    import pyarrow.compute as pc

    highest = [pc.max(t["index"]).as_py() for t in raw.values() if t.num_rows]
    return max((h for h in highest if h is not None), default=-1) + 1


__all__ = [
    "DTYPE_BYTES",
    "FLOW_PHASES",
    "SPAN_PHASES",
    "Tables",
    "bind_flows",
    "build_tables",
    "depths",
    "match_correlation",
    "nest",
]
