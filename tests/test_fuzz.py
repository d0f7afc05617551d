"""The importer under fuzzing: structure-aware hostile traces (``tests/fuzzing.py``) and the
seed corpus (``tests/fuzz_corpus/``) must import cleanly or fail with one ``XpuprofError``
naming the file, within ``fuzzing.LIMIT_S`` seconds, with every entry accounted for.

Bounded for CI (about 40 s in all: a fixed number of examples, derandomized so that every run
tries the same cases); ``scripts/fuzz.py`` runs the same generators for as long as one likes.
"""

from __future__ import annotations

from pathlib import Path

import fuzzing as fz
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

CORPUS = Path(__file__).parent / "fuzz_corpus"

#: Chunk sizes of the Kineto decoder to run under: as shipped, and small enough that a few
#: hundred bytes of JSON cross many chunk boundaries.
CHUNKS = [None, 7, 64, 300]

_SETTINGS = dict(
    deadline=None,  # the property checks the time itself (LIMIT_S), on each import
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@settings(max_examples=250, **_SETTINGS)
@given(doc=fz.kineto_docs(), lenient=st.booleans(), chunk=st.sampled_from(CHUNKS))
def test_kineto_imports_or_fails_cleanly(doc, lenient, chunk, tmp_path_factory) -> None:
    path = tmp_path_factory.mktemp("kineto") / f"trace{doc.suffix}"
    fz.check_import(doc, path, lenient=lenient, chunk=chunk)


@settings(max_examples=200, **_SETTINGS)
@given(doc=fz.xplane_files(), lenient=st.booleans())
def test_xplane_imports_or_fails_cleanly(doc, lenient, tmp_path_factory) -> None:
    path = tmp_path_factory.mktemp("xplane") / f"host{doc.suffix}"
    fz.check_import(doc, path, lenient=lenient)


@pytest.mark.parametrize(
    ("name", "doc"), fz.corpus(CORPUS), ids=lambda v: v if isinstance(v, str) else ""
)
@pytest.mark.parametrize("chunk", [None, 64])
def test_seed_corpus_replays(name: str, doc: fz.Doc, chunk, tmp_path) -> None:
    outcomes = {
        lenient: fz.check_import(
            doc, tmp_path / f"{lenient}{doc.suffix}", lenient=lenient, chunk=chunk
        )
        for lenient in (False, True)
    }
    # a strict read that succeeds drops nothing, so the lenient one keeps the same
    if outcomes[False] == "ok":
        assert outcomes[True] == "ok"


def test_the_corpus_is_small_and_covers_both_formats() -> None:
    files = [p for p in CORPUS.iterdir() if not p.name.endswith((".meta.json", ".md"))]
    assert sum(p.stat().st_size for p in files) < 200_000
    assert any(p.name.endswith(".xplane.pb") for p in files)
    assert any(p.name.endswith(".json.gz") for p in files)
    assert {p.name for p in files} == {n for n, _ in fz.corpus(CORPUS)}
