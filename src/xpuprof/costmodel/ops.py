"""The op table: which cost rule each framework op has, and its kind.

Kinds: ``matmul``, ``conv``, ``attention`` are exact (``torch.utils.flop_counter``'s
conventions, :data:`EXACT_KINDS`); ``elementwise``, ``reduction``, ``softmax``, ``norm``,
``embedding``, ``loss`` are estimated; ``memory`` and ``view`` cost 0 FLOPs. Each family module
lists its rules in ``RULES``; a later family overrides an earlier one for the same name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from xpuprof.costmodel import (
    attention,
    conv,
    elementwise,
    embedding,
    loss,
    matmul,
    movement,
    norm,
    reduction,
)
from xpuprof.costmodel.call import EXACT_KINDS, Call, Cost

Rule = Callable[[Call], Cost]

#: Op name (without ``aten::``) → (kind, rule, whether the rule reads the arguments).
RULES: dict[str, tuple[str, Rule, bool]] = {}

for _family in (matmul, conv, attention, elementwise, reduction, norm, embedding, loss, movement):
    for _kind, _names, _rule, *_needs in _family.RULES:
        for _name in _names.split():
            RULES[_name] = (_kind, _rule, _needs[0] if _needs else True)
del _family, _kind, _names, _rule, _needs, _name

__all__ = ["EXACT_KINDS", "RULES", "base_name", "op_cost", "op_kind", "supported_ops"]


def base_name(name: str) -> str:
    """The op name without the profiler's ``aten::`` prefix."""
    return name[6:] if name.startswith("aten::") else name


def op_kind(name: str) -> str | None:
    """The kind of an op (module docstring), None if we have no model for it."""
    r = RULES.get(base_name(name))
    return r[0] if r else None


def supported_ops() -> dict[str, str]:
    """Every op name with a cost model (as the profiler spells it) and its kind."""
    return {f"aten::{n}": r[0] for n, r in sorted(RULES.items())}


def op_cost(
    name: str, dims: list[Any] | None, types: list[Any] | None, concrete: list[Any] | None = None
) -> Cost:
    """FLOPs and bytes of one op call, from its ``Input Dims``, ``Input type`` and
    ``Concrete Inputs`` as the profiler records them; None for what cannot be known.

    ``name`` may carry the ``aten::`` prefix (the profiler's spelling) or not. Bytes are the
    tensor inputs read plus the outputs written (``docs/costmodel.md`` says what is left out).
    """
    rule = RULES.get(base_name(name))
    if rule is None:
        return None, None
    try:
        f, b = rule[1](Call(dims, types, concrete))
    except (TypeError, ValueError, IndexError, ZeroDivisionError, OverflowError):
        return None, None  # the shapes do not fit the op's signature
    return (None if f is None else float(f)), (None if b is None else float(b))
