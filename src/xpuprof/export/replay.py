"""The replay's timeline as a Chrome trace (``xpuprof replay --export chrome``): the measured
entries and the simulated events in one file, so that Perfetto shows them one above the other.

Layout (``docs/export.md``, "The replay's timeline"):

* first the measured trace exactly as ``xpuprof export STORE -o FILE`` writes it
  (:func:`xpuprof.export.chrome.export_chrome`: every entry of every source, several ranks
  merged into one file with pids ``"rank R/pid P"``), its top-level keys, plus
  ``xpuprofReplay`` (the replay's facts and the prefix below);
* then, for each replayed host thread and device stream, one **simulated thread** in the same
  process as the measured one (a GPU process shows ``stream 7`` … and ``simulated · stream 7``
  …), named ``simulated · <the measured thread's name>`` by a ``thread_name`` entry; its tid is
  a number above every numeric tid of the store, so it never meets a measured thread. Each
  replayed event appears there once, as an ``X`` event at its simulated time (``sim_ts``,
  ``sim_dur``: integer ns written as exact microsecond decimals, as Kineto writes them), with
  its measured category and name, and args ``{"event": id, "start_deviation_ns": sim_ts - ts,
  "duration_change_ns": sim_dur - dur}``.

Why one file: Perfetto compares what it shows together (one tab, one timeline); two files
cannot be laid side by side. How: the measured trace is written by ``export_chrome`` into a
hidden temporary file beside the output; the output (another temporary name, renamed when
complete) is that text with the simulated entries spliced in before its closing ``]}``. Only
public interfaces of ``export/chrome.py`` and ``export/jsontext.py`` are used, so the measured
entries are by construction what ``xpuprof export`` writes.
"""

from __future__ import annotations

import os
import zlib
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import msgspec
import numpy as np
import pyarrow as pa

from xpuprof.core.errors import XpuprofError
from xpuprof.core.raw import decode_json
from xpuprof.export.chrome import CHUNK_ENTRIES, GZIP_LEVEL, export_chrome
from xpuprof.export.jsontext import Block, const_text, id_text, json_strings
from xpuprof.trace.lock import temp_name

if TYPE_CHECKING:
    import pandas as pd

    from xpuprof.sim.replay import Replay
    from xpuprof.trace.trace import Trace

#: What the name of a simulated thread starts with.
PREFIX = "simulated · "
#: Stands for a missing pid or tid while grouping (written as no pid or tid at all).
NULL = -(1 << 62)
#: How ``export_chrome`` ends a file: what the simulated entries go before.
TAIL = b"\n]}\n"
#: Bytes copied from the measured file at a time.
COPY = 1 << 22

_enc = msgspec.json.Encoder()
_L = pa.large_string()


def default_path(trace: Trace) -> Path:
    """Where ``replay --export chrome`` writes without ``--output``: beside the store,
    ``STORE.replay.json.gz``; for a trace imported on the fly (a file or a folder of files),
    beside that file or folder (``NAME.replay.json.gz``)."""
    if getattr(trace, "_cleanup", None) is None:
        return trace.path.with_name(trace.path.name + ".replay.json.gz")
    paths = [Path(s["path"]) for s in trace.sources if s.get("path")]
    if len(paths) == 1:
        name = paths[0].name
        for suffix in (".json.gz", ".json", ".xplane.pb", ".pb"):
            if name.endswith(suffix):
                name = name[: -len(suffix)]
                break
        return paths[0].with_name(name + ".replay.json.gz")
    if paths:
        folder = Path(os.path.commonpath([str(p.parent) for p in paths]))
        return folder.with_name(folder.name + ".replay.json.gz")
    return Path.cwd() / "replay.json.gz"


def export_replay_chrome(rp: Replay, path: str | Path) -> dict[str, Any]:
    """Write the measured and the simulated timeline of ``rp`` as one Chrome trace at
    ``path`` (gzip when it ends with ``.gz``). Returns ``path``, ``sources`` (parts),
    ``events`` (entries written), ``measured`` (of them, the measured trace's entries),
    ``simulated`` (simulated events: one per replayed event), ``threads`` (simulated
    threads), ``bytes`` (on disk)."""
    trace = rp.trace
    text = os.fspath(path)
    out = Path(text)
    if out.is_dir() or text.endswith(("/", os.sep)):
        raise XpuprofError(f"{out}: a folder; the replay is written to one file "
                           "(.json or .json.gz)")  # fmt: skip
    if not out.parent.is_dir():
        raise XpuprofError(f"{out}: the folder {out.parent} does not exist")
    counts = {"simulated": 0, "threads": 0}
    measured_tmp = out.parent / temp_name(out.name + ".measured.json")
    tmp = out.parent / temp_name(out.name)
    try:
        measured = export_chrome(trace, measured_tmp)
        info = {"simulated_thread_prefix": PREFIX, "facts": _facts(rp)}
        written = _splice(measured_tmp, tmp, info, simulated_blocks(rp, counts),
                          first=measured["events"] == 0, gz=out.name.endswith(".gz"))  # fmt: skip
        os.replace(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    finally:
        measured_tmp.unlink(missing_ok=True)
    n_sim, threads = counts["simulated"], counts["threads"]
    return {"path": str(out), "sources": measured["sources"],
            "events": measured["events"] + n_sim + threads, "measured": measured["events"],
            "simulated": n_sim, "threads": threads, "bytes": written}  # fmt: skip


def _facts(rp: Replay) -> dict[str, Any]:
    facts = rp.result().facts
    return {k: facts[k] for k in ("median_error_pct", "worst_error_pct", "error_of", "nodes",
                                   "edges") if k in facts}  # fmt: skip


# ----------------------------------------------------------------------------------------------
# the simulated entries
# ----------------------------------------------------------------------------------------------


def who_labels(trace: Trace) -> dict[int, str | None]:
    """Per part, the label ``export_chrome`` gives its pids in a file of several parts
    (``rank R``, ``rank R part P`` when ranks repeat, ``part P`` without a rank); None for a
    store of one part (pids as they are)."""
    sources = trace.sources
    if len(sources) < 2:
        return {int(s["part"]): None for s in sources}
    ranks = Counter(s.get("rank") for s in sources)
    out: dict[int, str | None] = {}
    for s in sources:
        rank, part = s.get("rank"), int(s["part"])
        if rank is None:
            out[part] = f"part {part}"
        else:
            out[part] = f"rank {rank} part {part}" if ranks[rank] > 1 else f"rank {rank}"
    return out


def _first_free_tid(trace: Trace) -> int:
    """One more than the largest numeric tid of the store (events and metadata): the first
    tid of a simulated thread."""
    top = 0
    for table in ("events", "metadata"):
        df = trace.sql(f"select max(tid) as m from {table} where tid >= 0")
        if len(df) and df["m"].notna().all():
            top = max(top, int(df["m"].iloc[0]))
    return top + 1


def _thread_names(trace: Trace, part: int) -> dict[tuple[int, int], str]:
    """``thread_name`` of each (pid, tid) of a part, from its metadata entries."""
    md = trace.table("metadata", columns=["part", "name", "pid", "tid", "args"],
                     filters=[("part", "=", part)])  # fmt: skip
    out = {}
    for name, pid, tid, args in zip(*(md[c].to_pylist() for c in ("name", "pid", "tid", "args")),
                                    strict=True):  # fmt: skip
        a = decode_json(args, {})
        if name == "thread_name" and isinstance(a, dict) and isinstance(a.get("name"), str):
            out[(pid, tid)] = a["name"].strip()
    return out


def _ids(values: np.ndarray) -> pa.ChunkedArray:
    """pids or tids as an Arrow column, :data:`NULL` as null."""
    v = np.asarray(values, np.int64)
    return pa.chunked_array([pa.array(v, pa.int64(), mask=v == NULL)])


def _strings(col: pd.Series) -> pa.Array:
    """A text column (names, categories) as Arrow strings, missing values as null."""
    values = col.astype(object)
    return pa.array(values.where(values.notna(), None).tolist(), pa.string())


def _label(pid: int, tid: int, device: bool, names: dict[tuple[int, int], str],
           tid_names: dict[str, str]) -> str:  # fmt: skip
    """The measured thread's name: its ``thread_name``, a string tid as the source spelled it,
    else ``stream N`` (device work) or ``thread N``."""
    got = names.get((pid, tid))
    if got:
        return got
    if tid < 0:
        return tid_names.get(str(tid)) or "(unnamed thread)"
    return f"{'stream' if device else 'thread'} {tid}"


def simulated_blocks(rp: Replay, counts: dict[str, int]) -> Iterator[Block]:
    """The simulated entries of every replayed part, in part order, as blocks ready to render
    (per part a ``thread_name`` block, then the events), made one part at a time; ``counts``
    adds up the ``threads`` and ``simulated`` events made."""
    trace = rp.trace
    events = rp.events()
    whos = who_labels(trace)
    tid = _first_free_tid(trace)
    for s in sorted(trace.sources, key=lambda s: s["part"]):
        mine = events[events["part"] == s["part"]]
        if not len(mine):
            continue
        meta, spans = _part_blocks(trace, s, whos[int(s["part"])], mine, tid)
        tid += len(meta)
        counts["threads"] += len(meta)
        counts["simulated"] += len(spans)
        yield meta
        yield spans


def _part_blocks(trace: Trace, source: dict[str, Any], who: str | None, events: pd.DataFrame,
                 first_tid: int) -> list[Block]:  # fmt: skip
    """One part's simulated entries: a ``thread_name`` per simulated thread (one per measured
    pid and tid), then the simulated events in time order."""
    sids = (source.get("meta") or {}).get("string_ids") or {}
    pid_names, tid_names = sids.get("pid") or {}, sids.get("tid") or {}
    ev = events.sort_values(["sim_ts", "id"], kind="stable")
    pid = ev["pid"].fillna(NULL).to_numpy(np.int64)
    tid = ev["tid"].fillna(NULL).to_numpy(np.int64)
    dev = ev["device"].fillna(-1).to_numpy(np.int64) >= 0
    keys, inverse = np.unique(np.stack([pid, tid]), axis=1, return_inverse=True)
    inverse = np.asarray(inverse).reshape(-1)
    sim_tid = first_tid + np.arange(keys.shape[1], dtype=np.int64)
    names = _thread_names(trace, int(source["part"]))
    first_of = np.zeros(keys.shape[1], np.int64)
    first_of[inverse[::-1]] = np.arange(len(inverse))[::-1]
    labels = [PREFIX + _label(int(p), int(t), bool(dev[first_of[k]]), names, tid_names)
              for k, (p, t) in enumerate(keys.T)]  # fmt: skip
    m, n = len(labels), len(ev)
    meta = Block(np.arange(m, dtype=np.int64), {
        "ph": const_text('"M"', m),
        "name": const_text('"thread_name"', m),
        "pid": id_text(_ids(keys[0]), pid_names, who),
        "tid": id_text(_ids(sim_tid), {}, None),
        "args": pa.array([_enc.encode({"name": x}).decode() for x in labels], _L),
    })  # fmt: skip
    ts, dur = ev["ts"].to_numpy(np.int64), ev["dur"].to_numpy(np.int64)
    sim_ts, sim_dur = ev["sim_ts"].to_numpy(np.int64), ev["sim_dur"].to_numpy(np.int64)
    args = [f'{{"event":{i},"start_deviation_ns":{a},"duration_change_ns":{b}}}'
            for i, a, b in zip(ev["id"].to_numpy(np.int64).tolist(), (sim_ts - ts).tolist(),
                               (sim_dur - dur).tolist(), strict=True)]  # fmt: skip
    spans = Block(np.arange(n, dtype=np.int64), {
        "ph": const_text('"X"', n),
        "cat": json_strings(_strings(ev["category"])),
        "name": json_strings(_strings(ev["name"])),
        "pid": id_text(_ids(pid), pid_names, who),
        "tid": id_text(_ids(sim_tid[inverse]), {}, None),
        "ts": pa.array(sim_ts),
        "dur": pa.array(sim_dur),
        "args": pa.array(args, _L),
    })  # fmt: skip
    return [meta, spans]


# ----------------------------------------------------------------------------------------------
# writing
# ----------------------------------------------------------------------------------------------


def _text_bytes(arr: pa.Array) -> bytes:
    """The concatenated UTF-8 bytes of a large_string array."""
    offsets = np.frombuffer(arr.buffers()[1], dtype=np.int64)
    lo, hi = int(offsets[arr.offset]), int(offsets[arr.offset + len(arr)])
    data = arr.buffers()[2]
    return bytes(memoryview(data)[lo:hi]) if data is not None else b""


class _Out:
    """The output file, gzip-compressed when asked."""

    def __init__(self, f: IO[bytes], gz: bool) -> None:
        self.f = f
        self.z = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, 31) if gz else None

    def write(self, data: bytes) -> None:
        self.f.write(self.z.compress(data) if self.z else data)

    def close(self) -> None:
        if self.z is not None:
            self.f.write(self.z.flush())


def _splice(measured: Path, tmp: Path, info: dict[str, Any], blocks: Iterable[Block], *,
            first: bool, gz: bool) -> int:  # fmt: skip
    """Write ``tmp``: the measured file's text, ``xpuprofReplay`` (``info``) as its first
    top-level key, the simulated entries before its closing ``]}``; its size on disk.
    ``first``: the measured file has no entry (the first simulated one takes no comma)."""
    size = measured.stat().st_size
    with open(measured, "rb") as src, open(tmp, "wb") as f:
        head = src.read(1)
        src.seek(size - len(TAIL))
        if head != b"{" or src.read(len(TAIL)) != TAIL:
            raise XpuprofError(f"{measured}: not a trace as export_chrome writes it")
        out = _Out(f, gz)
        out.write(b'{"xpuprofReplay":' + _enc.encode(info) + b",")
        src.seek(1)
        left = size - 1 - len(TAIL)
        while left > 0:
            chunk = src.read(min(COPY, left))
            if not chunk:
                raise XpuprofError(f"{measured}: shorter than it was")
            out.write(chunk)
            left -= len(chunk)
        for b in blocks:
            for lo in range(0, len(b), CHUNK_ENTRIES):
                got = b.render(lo, lo + CHUNK_ENTRIES)
                if got is None:
                    continue
                data = _text_bytes(got[1])
                if first:
                    data, first = data[1:], False  # the first entry has no comma before it
                out.write(data)
        out.write(TAIL)
        out.close()
    return tmp.stat().st_size
