"""What a collective is, read from names and args: its canonical type, NCCL algorithm and
protocol, size in bytes, group, and nccl-tests' bus-bandwidth factor. Pure functions of strings
and dicts (``docs/comm.md`` says which source wins)."""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from xpuprof.core.raw import decode_json

__all__ = [
    "ALGORITHMS",
    "BUSBW_FACTOR",
    "COMM_DTYPE_SIZE",
    "PROTOCOLS",
    "WHOLE_GROUP",
    "XLA_SIZE",
    "as_int",
    "busbw_factor",
    "comm_bytes",
    "decode_arg",
    "kernel_parts",
    "normalize_collective",
    "ranks_list",
    "replica_group_size",
    "tensor_bytes",
    "xla_shape_bytes",
]

#: nccl-tests bus-bandwidth factors, as a function of the group size n.
BUSBW_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "send_recv": lambda n: 1.0,
    "send": lambda n: 1.0,
    "recv": lambda n: 1.0,
}

ALGORITHMS = ("COLLNET_DIRECT", "COLLNET_CHAIN", "COLLNET", "NVLS_TREE", "NVLS", "RING", "TREE",
              "PAT")  # fmt: skip
PROTOCOLS = ("LL128", "LL", "SIMPLE")

#: Element sizes of the ``dtype`` arg of record_param_comms / NCCL kernels (c10 ScalarType names).
COMM_DTYPE_SIZE = {
    "float": 4,
    "double": 8,
    "half": 2,
    "bfloat16": 2,
    "int": 4,
    "long": 8,
    "short": 2,
    "char": 1,
    "byte": 1,
    "bool": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "complexfloat": 8,
    "complexdouble": 16,
    "uint32": 4,
    "uint64": 8,
    "uint16": 2,
}

XLA_SIZE = {"f64": 8, "f32": 4, "bf16": 2, "f16": 2, "s64": 8, "u64": 8, "s32": 4, "u32": 4,
            "s16": 2, "u16": 2, "s8": 1, "u8": 1, "pred": 1, "c64": 8, "c128": 16,
            "f8e4m3fn": 1, "f8e5m2": 1}  # fmt: skip

#: Collectives whose every member takes part (usable as clock references); not point-to-point.
WHOLE_GROUP = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce",
               "barrier")  # fmt: skip

_CANONICAL = (
    ("reducescatter", "reduce_scatter"), ("allreduce", "all_reduce"),
    ("allgather", "all_gather"), ("alltoall", "all_to_all"),
    ("collectivepermute", "send_recv"), ("sendrecv", "send_recv"),
    ("broadcast", "broadcast"), ("barrier", "barrier"), ("scatter", "scatter"),
    ("gather", "gather"), ("reduce", "reduce"), ("send", "send"), ("recv", "recv"),
)  # fmt: skip


def normalize_collective(name: Any) -> str | None:
    """``"allreduce"``, ``"_allgather_base"``, ``"all-reduce"``, ``"nccl:all_to_all"``,
    ``"AllReduce"`` … → the canonical type (None when it is not a collective name)."""
    if not isinstance(name, str) or not name:
        return None
    s = name.lower()
    s = s.split(":", 1)[1] if s.startswith(("nccl:", "gloo:", "rccl:")) else s
    s = re.sub(r"[^a-z]", "", s)
    for pat, canon in _CANONICAL:
        if pat in s:
            return canon
    return None


def kernel_parts(name: Any) -> dict[str, str | None]:
    """Collective type, algorithm and protocol from an NCCL/RCCL kernel name, in either naming
    (``ncclKernel_AllReduce_RING_LL_Sum_float``, ``ncclDevKernel_AllReduce_Sum_f32_RING_LL``)."""
    out: dict[str, str | None] = {"collective": None, "algorithm": None, "protocol": None}
    if not isinstance(name, str):
        return out
    base = name.split("(", 1)[0]
    m = re.match(r"(?:nccl|rccl)(?:Dev)?Kernel_(.*)", base)
    if not m:
        return out
    rest = m.group(1)
    toks = rest.split("_")
    out["collective"] = normalize_collective(toks[0]) if toks else None
    joined = "_" + rest.upper() + "_"
    out["algorithm"] = next((a for a in ALGORITHMS if f"_{a}_" in joined), None)
    out["protocol"] = next((p for p in PROTOCOLS if f"_{p}_" in joined), None)
    return out


def busbw_factor(kind: str | None, n: float) -> float:
    """nccl-tests' busbw/algbw factor of a collective type in a group of ``n`` (NaN: unknown
    type or group)."""
    f = BUSBW_FACTOR.get(kind or "")
    if f is None or not n or n != n or n < 1:
        return float("nan")
    return float(f(n))


def decode_arg(v: Any) -> Any:
    """An arg as DuckDB's ``json_extract(...)::varchar`` gives it, decoded (None when null)."""
    if v is None or (isinstance(v, float) and v != v):
        return None
    if isinstance(v, str):
        return decode_json(v, default=v)
    return v


def as_int(v: Any) -> int | None:
    """An integer arg, whether written as a number or as digits (None otherwise)."""
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float) and v == v:
        return int(v)
    if isinstance(v, str) and v.strip().lstrip("-").isdigit():
        return int(v)
    return None


def ranks_list(v: Any) -> list[int] | None:
    """``Process Group Ranks``: a list, or its JSON text (``"[0, 1, 2, 3]"``)."""
    if isinstance(v, list):
        return [int(x) for x in v if as_int(x) is not None]
    if isinstance(v, str) and v.strip().startswith("["):
        got = decode_json(v)
        return ranks_list(got) if isinstance(got, list) else None
    return None


def comm_bytes(args: dict[str, Any]) -> float | None:
    """max(In, Out msg nelems) × dtype size, from record_param_comms-style args."""
    size = COMM_DTYPE_SIZE.get(str(args.get("dtype", "")).lower().replace("c10::", ""))
    ins = [as_int(args.get("In msg nelems")), as_int(args.get("Out msg nelems"))]
    ins = [x for x in ins if x is not None]
    if size is None or not ins:
        return None
    return float(max(ins) * size)


def tensor_bytes(args: dict[str, Any]) -> float | None:
    """The largest tensor of an op's ``Input Dims``/``Input type``."""
    from xpuprof.costmodel.call import ITEMSIZE

    dims, types = args.get("Input Dims"), args.get("Input type")
    if not isinstance(dims, list) or not isinstance(types, list):
        return None
    best = None
    for d, t in zip(dims, types, strict=False):
        z = ITEMSIZE.get(t) if isinstance(t, str) else None
        if z is None or not isinstance(d, list) or not all(isinstance(x, int) for x in d):
            continue
        v = float(np.prod(d, dtype=np.float64)) * z if d else float(z)
        best = v if best is None else max(best, v)
    return best


def xla_shape_bytes(shape: Any) -> float | None:
    """Bytes of an HLO ``shape_with_layout`` (``f32[8,128]{1,0}``, tuples summed)."""
    if not isinstance(shape, str):
        return None
    total = 0.0
    found = False
    for et, dims in re.findall(r"([a-z]+[0-9]*(?:e[0-9]m[0-9][a-z]*)?)\[([0-9,]*)\]", shape):
        z = XLA_SIZE.get(et)
        if z is None:
            continue
        n = 1.0
        for x in dims.split(","):
            if x:
                n *= int(x)
        total += n * z
        found = True
    return total if found else None


def replica_group_size(long_name: Any) -> tuple[int | None, str | None]:
    """Group size and the group spec from an HLO instruction's ``replica_groups``."""
    if not isinstance(long_name, str):
        return None, None
    m = re.search(r"replica_groups=(\{\{[^=]*?\}\}|\[[0-9,]+\]<=\[[0-9,]+\](?:T\([0-9,]+\))?)",
                  long_name)  # fmt: skip
    if not m:
        return None, None
    spec = m.group(1)
    if spec.startswith("{{"):
        first = spec[2:].split("}", 1)[0]
        return len([x for x in first.split(",") if x.strip()]), spec
    shape = [int(x) for x in spec[1:].split("]", 1)[0].split(",") if x]
    return (shape[-1] if shape else None), spec
