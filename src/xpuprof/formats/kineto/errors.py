"""What decoding a run of Kineto entries may raise when one of them is bad: the fast path
then hands the run to the walker, which finds the entry and says what is wrong with it. A
``TraceFormatError`` (a strict read rejecting an event it has decoded) is not among them."""

from __future__ import annotations

import msgspec
import pyarrow as pa

DECODE_ERRORS: tuple[type[BaseException], ...] = (
    msgspec.MsgspecError,
    RecursionError,
    ValueError,
    TypeError,
    OverflowError,
    pa.ArrowException,
)
