"""The client's side of an on-demand capture (``xpuprof capture``, ``xpuprof.request_capture``):
ask a job's capture server (``live/remote.py``) for a capture and unpack it as a store.

Everything that can be checked here is checked before the job is asked anything, so that a
mistake never costs the job a capture window: the duration, the token, the URL, and that the
output can be created. The reply streams to a file (no store is held in memory), and the store
appears only once it is complete (a staging folder, renamed).
"""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path
from typing import Any

from xpuprof.core.errors import XpuprofError

#: How long a reply may take beyond the capture's duration: the server's two waits for the
#: job's step (30 s each) and writing the store.
REPLY_TIMEOUT_S = 400.0


def request_capture(
    url: str,
    out: str | Path,
    *,
    duration: float,
    token: str | None,
    level: str | None = None,
    timeout: float | None = None,
) -> Path:
    """The client's side: ask the job at ``url`` for a capture and unpack it as store ``out``.

    Everything that can be checked here is checked before the job is asked anything: the
    duration, the token, the URL, and that ``out`` can be created (its staging folder is).
    """
    from urllib import request as urlrequest
    from urllib.parse import urlsplit

    from xpuprof.trace.store import abandon_staging, begin_staging

    if (
        isinstance(duration, bool)
        or not isinstance(duration, int | float)
        or not math.isfinite(duration)
        or duration <= 0
    ):
        raise XpuprofError(f"the capture duration must be a finite number of seconds > 0, "
                           f"not {duration!r}")  # fmt: skip
    if not token:
        raise XpuprofError("a capture needs the job's token: --token TOKEN or XPUPROF_TOKEN")
    if urlsplit(url).scheme not in ("http", "https") or not urlsplit(url).netloc:
        raise XpuprofError(f"{url}: not a capture server URL (http://HOST:PORT)")
    root = Path(out).resolve()
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise XpuprofError(f"{root}: exists and is not empty; not overwriting it")
    body: dict[str, Any] = {"duration_s": duration}
    if level:
        body["level"] = level
    req = urlrequest.Request(
        url.rstrip("/") + "/capture",
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        method="POST",
    )
    try:  # an output that cannot be created fails here, before the job is asked anything
        staging, made = begin_staging(root)
    except OSError as e:
        raise XpuprofError(f"{root}: cannot create the store ({e.strerror or e})") from None
    try:
        tar = staging / "capture.tar"
        _download(req, tar, timeout or duration + REPLY_TIMEOUT_S, url)
        _unpack(tar, staging, root)
    except BaseException:
        abandon_staging(staging, made)
        raise
    shutil.rmtree(staging, ignore_errors=True)
    return root


def _download(req: Any, dest: Path, timeout: float, url: str) -> None:
    """The reply's body into ``dest``, or one clear error."""
    import http.client
    from urllib import error as urlerror
    from urllib import request as urlrequest

    try:
        with urlrequest.urlopen(req, timeout=timeout) as r, open(dest, "wb") as f:
            shutil.copyfileobj(r, f, 1 << 20)
    except urlerror.HTTPError as e:
        try:
            msg = json.loads(e.read()).get("error", "")
        except (ValueError, AttributeError, OSError, http.client.HTTPException):
            msg = ""
        raise XpuprofError(f"{url}: HTTP {e.code}: {msg or e.reason}") from None
    except (urlerror.URLError, OSError, http.client.HTTPException) as e:
        reason = getattr(e, "reason", None) or e
        raise XpuprofError(f"{url}: the capture failed ({reason})") from None


def _unpack(tar: Path, staging: Path, root: Path) -> None:
    """The store the job sent, checked, flushed and renamed into place while holding the
    store's lock, so that an import into the same path at the same moment cannot mix with it
    (docs/store.md)."""
    import tarfile

    from xpuprof.core.names import TABLES
    from xpuprof.trace.store import (
        StoreLock,
        clean_stale,
        read_manifest,
        sync_dirs,
        sync_files,
    )

    try:
        with tarfile.open(tar) as t:
            t.extractall(staging, filter="data")
    except (tarfile.TarError, OSError) as e:
        raise XpuprofError(f"{root}: the capture server sent an incomplete store ({e})") from None
    built = staging / "store"
    manifest = read_manifest(built)  # a complete store, or an error
    sync_files(built / f for s in manifest["sources"] for f in s["files"].values() if f)
    sync_dirs([built / t for t in TABLES] + [built])
    with StoreLock(root):
        clean_stale(root)
        if root.exists() and (not root.is_dir() or any(root.iterdir())):
            raise XpuprofError(f"{root}: exists and is not empty; not overwriting it")
        if root.exists():
            root.rmdir()
        os.replace(built, root)
        sync_dirs([root.parent])
