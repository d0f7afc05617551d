"""The inputs of one op call as the profiler records them (``Input Dims``, ``Input type``,
``Concrete Inputs``), with accessors that answer None instead of raising, and the dtype
sizes every family's byte count needs. Conventions: ``docs/costmodel.md``."""

from __future__ import annotations

import math
from typing import Any

Cost = tuple[float | None, float | None]

#: Item size of the dtype names the profiler writes in ``Input type`` (c10's type names, as
#: ``caffe2::TypeMeta::name()`` gives them on Linux/GCC; a few other spellings seen in traces).
ITEMSIZE: dict[str, int] = {
    "float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2,
    "long int": 8, "long": 8, "long long": 8, "__int64": 8, "int64_t": 8,
    "int": 4, "short int": 2, "short": 2, "signed char": 1, "unsigned char": 1, "bool": 1,
    "short unsigned int": 2, "unsigned short": 2, "unsigned int": 4,
    "long unsigned int": 8, "unsigned long": 8,
    "c10::complex<c10::Half>": 4, "c10::complex<float>": 8, "c10::complex<double>": 16,
    "c10::Float8_e4m3fn": 1, "c10::Float8_e5m2": 1, "c10::Float8_e4m3fnuz": 1,
    "c10::Float8_e5m2fnuz": 1, "c10::Float8_e8m0fnu": 1, "c10::Float4_e2m1fn_x2": 1,
    "c10::qint8": 1, "c10::quint8": 1, "c10::qint32": 4, "c10::quint4x2": 1, "c10::quint2x4": 1,
    "c10::bits1x8": 1, "c10::bits2x4": 1, "c10::bits4x2": 1, "c10::bits8": 1, "c10::bits16": 2,
}  # fmt: skip

#: Item size by ``c10::ScalarType`` code, as a ``dtype`` argument appears in ``Concrete Inputs``
#: (``aten::to(x, 6)`` is float32), from c10/core/ScalarType.h's enumeration order.
SCALAR_TYPE_ITEMSIZE: dict[int, int] = {
    0: 1, 1: 1, 2: 2, 3: 4, 4: 8, 5: 2, 6: 4, 7: 8, 8: 4, 9: 8, 10: 16, 11: 1, 12: 1, 13: 1,
    14: 4, 15: 2, 16: 1, 17: 1, 18: 1, 19: 1, 20: 1, 21: 1, 22: 2, 23: 1, 24: 1, 25: 1, 26: 1,
    27: 2, 28: 4, 29: 8, 44: 1, 45: 1,
}  # fmt: skip

#: ``Input type`` values that are not tensors (current and 2021 spellings).
NOT_TENSOR = frozenset(
    {"", "Scalar", "ScalarList", "GenericList", "TensorList", "Int", "Bool", "Double", "String",
     "Device", "Layout", "ScalarType", "MemoryFormat", "None", "c10::string_view", "str"}
)  # fmt: skip

#: The kinds whose FLOPs follow ``torch.utils.flop_counter`` and are compared against it.
EXACT_KINDS = frozenset({"matmul", "conv", "attention"})


class Call:
    """One op call's inputs, with typed accessors that answer None instead of raising."""

    __slots__ = ("dims", "types", "concrete")

    def __init__(self, dims: Any, types: Any, concrete: Any) -> None:
        self.dims: list[Any] = dims if isinstance(dims, list) else []
        self.types: list[Any] = types if isinstance(types, list) else []
        self.concrete: list[Any] | None = concrete if isinstance(concrete, list) else None

    def __len__(self) -> int:
        return len(self.dims)

    def type(self, i: int) -> str:
        t = self.types[i] if i < len(self.types) else ""
        return t if isinstance(t, str) else ""

    def is_tensor(self, i: int) -> bool:
        if i < 0 or i >= len(self.dims):
            return False
        t = self.type(i)
        if t in ITEMSIZE:
            return True
        d = self.dims[i]
        # a dtype we do not know the size of: still a tensor if it has a shape
        return t not in NOT_TENSOR and isinstance(d, list) and all(isinstance(x, int) for x in d)

    def shape(self, i: int) -> list[int] | None:
        """Shape of tensor argument ``i`` (``[]`` for a 0-dim tensor), None if not a tensor."""
        if not self.is_tensor(i):
            return None
        d = self.dims[i]
        return d if isinstance(d, list) and all(isinstance(x, int) for x in d) else None

    def itemsize(self, i: int) -> int | None:
        return ITEMSIZE.get(self.type(i)) if self.is_tensor(i) else None

    def numel(self, i: int) -> int | None:
        s = self.shape(i)
        return math.prod(s) if s is not None else None

    def nbytes(self, i: int) -> int | None:
        n, z = self.numel(i), self.itemsize(i)
        return n * z if n is not None and z is not None else None

    def tensor_list(self, i: int) -> list[list[int]] | None:
        """Shapes of a ``TensorList`` argument (the profiler nests them), None otherwise."""
        if i < 0 or i >= len(self.dims) or self.type(i) not in ("TensorList", "GenericList"):
            return None
        d = self.dims[i]
        if not isinstance(d, list) or not all(
            isinstance(s, list) and all(isinstance(x, int) for x in s) for s in d
        ):
            return None
        return d if d else None  # an empty list here means "not recorded" (2021 traces)

    def text(self, i: int) -> str | None:
        """The recorded value of scalar argument ``i``; None when absent or not recorded."""
        c = self.concrete
        if c is None or i < 0 or i >= len(c) or not isinstance(c[i], str) or c[i] == "":
            return None
        return c[i]

    def ints(self, i: int) -> list[int] | None:
        """An int-list argument (``"[1, 1]"``), or a single int as a one-element list."""
        t = self.text(i)
        if t is None:
            return None
        t = t.strip()
        try:
            if t.startswith("["):
                body = t[1:-1].strip()
                return [int(x) for x in body.split(",")] if body else []
            return [int(t)]
        except ValueError:
            return None

    def int(self, i: int) -> int | None:
        t = self.text(i)
        if t is None or t.startswith("["):
            return None
        try:
            return int(t)
        except ValueError:
            return None

    def flag(self, i: int) -> bool | None:
        t = self.text(i)
        return {"True": True, "False": False, "1": True, "0": False}.get(t) if t else None

    def flags(self, i: int) -> list[bool] | None:
        t = self.text(i)
        if t is None or not t.startswith("["):
            return None
        out = [{"True": True, "False": False}.get(x.strip()) for x in t[1:-1].split(",")]
        return None if any(x is None for x in out) else out  # type: ignore[return-value]


def add(*terms: float | int | None) -> float | None:
    """Sum of byte terms; unknown if any term is unknown."""
    if any(t is None for t in terms):
        return None
    return float(sum(terms))  # type: ignore[arg-type]


def broadcast(shapes: list[list[int]]) -> list[int] | None:
    nd = max((len(s) for s in shapes), default=0)
    out = [1] * nd
    for s in shapes:
        for k, d in enumerate(s):
            j = nd - len(s) + k
            if out[j] == 1:
                out[j] = d
            elif d not in (1, out[j]):
                return None
    return out


def dtype_size(c: Call, i: int) -> int | None:
    """Item size of a ``dtype`` argument given as a ScalarType code."""
    v = c.int(i)
    return SCALAR_TYPE_ITEMSIZE.get(v) if v is not None else None
