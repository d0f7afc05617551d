"""Fuzz the importers for longer than CI does: the generators and the property of
``tests/fuzzing.py`` (the same ones ``tests/test_fuzz.py`` runs, bounded), for N cases or T
seconds, counting outcomes.

    .venv/bin/python scripts/fuzz.py --cases 10000
    .venv/bin/python scripts/fuzz.py --seconds 3600 --format xplane --seed 7

Each case is a generated file (Kineto JSON or XPlane), imported strict or lenient (drawn), the
Kineto decoder at a drawn chunk size; the property holds or the case is a failure. A case that
runs past twice ``fuzzing.LIMIT_S`` is stopped and counted as a hang. Failures are written to
``--out`` (a file, its ``.meta.json`` as the seed corpus has them, and the traceback), ready to
be copied into ``tests/fuzz_corpus/`` once fixed. The summary (cases, seconds, outcomes,
failures) is printed as JSON and, with ``--record``, written to a file.
"""

from __future__ import annotations

import argparse
import collections
import json
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import fuzzing as fz  # noqa: E402
from hypothesis import HealthCheck, Phase, given, seed, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


class _Stop(Exception):
    """The time budget is spent."""


class _Hang(Exception):
    """One case ran past its alarm."""


def _alarm(_signum, _frame):
    raise _Hang


def run(args: argparse.Namespace) -> dict:
    out_dir = Path(args.out or tempfile.mkdtemp(prefix="xpuprof-fuzz-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="xpuprof-fuzz-work-"))
    outcomes: collections.Counter[str] = collections.Counter()
    failures: list[dict] = []
    start = time.monotonic()
    formats = ["kineto", "xplane"] if args.format == "both" else [args.format]
    docs = st.sampled_from(formats).flatmap(
        lambda f: fz.kineto_docs() if f == "kineto" else fz.xplane_files()
    )
    signal.signal(signal.SIGALRM, _alarm)

    @seed(args.seed)
    @settings(max_examples=args.cases, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(doc=docs, lenient=st.booleans(), chunk=st.sampled_from([None, 7, 64, 300, 4096]))
    def case(doc: fz.Doc, lenient: bool, chunk: int | None) -> None:
        if args.seconds and time.monotonic() - start > args.seconds:
            raise _Stop
        fmt = "xplane" if doc.suffix.startswith(".xplane") else "kineto"
        mode = "lenient" if lenient else "strict"
        path = work / f"case{doc.suffix}"
        signal.alarm(int(2 * fz.LIMIT_S))
        try:
            outcome = fz.check_import(doc, path, lenient=lenient, chunk=chunk)
        except _Hang:
            outcome = "FAIL hang"
        except Exception as e:  # noqa: BLE001 - every failure is recorded, the run goes on
            outcome = f"FAIL {type(e).__name__}"
            k = len(failures)
            name = f"fail{k}{doc.suffix}"
            (out_dir / name).write_bytes(doc.content)
            meta = {"entries": doc.entries, "damaged": doc.damaged is not None,
                    "why": f"scripts/fuzz.py: {type(e).__name__}: {str(e)[:200]}"}  # fmt: skip
            (out_dir / f"{name}.meta.json").write_text(json.dumps(meta, indent=1) + "\n")
            (out_dir / f"{name}.txt").write_text(
                f"lenient={lenient} chunk={chunk} damaged={doc.damaged}\n{traceback.format_exc()}"
            )
            error = f"{type(e).__name__}: {str(e)[:300]}"
            failures.append({"file": str(out_dir / name), "format": fmt, "mode": mode,
                             "chunk": chunk, "error": error})  # fmt: skip
        finally:
            signal.alarm(0)
        outcomes[f"{fmt} {mode} {outcome}"] += 1
        n = sum(outcomes.values())
        if args.progress and n % args.progress == 0:
            print(f"{n} cases, {time.monotonic() - start:.0f} s, {len(failures)} failures",
                  file=sys.stderr, flush=True)  # fmt: skip

    try:
        case()
    except _Stop:
        pass
    return {
        "cases": sum(outcomes.values()),
        "seconds": round(time.monotonic() - start, 1),
        "seed": args.seed,
        "outcomes": dict(sorted(outcomes.items())),
        "failures": failures,
        "failures_in": str(out_dir),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", type=int, default=10_000, help="cases to generate (default 10000)")
    p.add_argument("--seconds", type=float, default=0, help="stop after this long (0: no limit)")
    p.add_argument("--format", choices=["kineto", "xplane", "both"], default="both")
    p.add_argument("--seed", type=int, default=0, help="the generators' seed (default 0)")
    p.add_argument("--out", help="folder for failing cases (default: a new temporary folder)")
    p.add_argument("--record", help="also write the JSON summary to this file")
    p.add_argument("--progress", type=int, default=500, help="print a line every N cases")
    summary = run(p.parse_args())
    text = json.dumps(summary, indent=1)
    print(text)
    if p.parse_args().record:
        Path(p.parse_args().record).write_text(text + "\n")
    sys.exit(1 if summary["failures"] else 0)


if __name__ == "__main__":
    main()
