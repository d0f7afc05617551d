"""Data movement and metadata ops: copies, fills, concatenation (0 FLOPs, bytes moved), views
and allocations (0 FLOPs, 0 bytes)."""

from __future__ import annotations

from collections.abc import Callable

from xpuprof.costmodel.call import Call, Cost, add, dtype_size


def _copy(src: int, dst_from: int | None = None, dtype_arg: int | None = None) -> Callable:
    """Data movement, 0 FLOPs: ``src`` read, an output of its shape written (``dst_from``'s dtype,
    or a ``dtype`` argument's, else the source's)."""

    def cost(c: Call) -> Cost:
        n, zs = c.numel(src), c.itemsize(src)
        if n is None:
            return None, None
        if dst_from is not None:
            zd = c.itemsize(dst_from)
        elif dtype_arg is not None and c.text(dtype_arg) is not None:
            zd = dtype_size(c, dtype_arg)
        elif dtype_arg is not None and c.type(dtype_arg) != "":
            zd = None  # a dtype was given but its value not recorded (older traces)
        else:
            zd = zs  # no dtype argument: the source's
        return 0.0, add(n * zs if zs is not None else None, n * zd if zd is not None else None)

    return cost


def _fill(c: Call) -> Cost:
    """fill_/zero_: 0 FLOPs, the tensor written."""
    return 0.0, add(c.nbytes(0))


def _item(c: Call) -> Cost:
    return 0.0, add(c.itemsize(0))


def _cat(c: Call) -> Cost:
    """cat: 0 FLOPs; bytes unknown (a tensor list's dtype is not recorded)."""
    return 0.0, None


def _zero_cost(c: Call) -> Cost:
    return 0.0, 0.0


_VIEWS = (
    "view _unsafe_view _reshape_alias as_strided as_strided_ t transpose transpose_ permute "
    "expand expand_as squeeze squeeze_ unsqueeze unsqueeze_ select slice narrow split "
    "split_with_sizes unsafe_split tensor_split chunk unsafe_chunk unbind alias detach detach_ "
    "view_as unflatten diagonal unfold movedim swapaxes lift_fresh _nested_view_from_buffer "
    "real imag numpy_T mT T _conj _neg_view view_as_real view_as_complex"
)
_ALLOCATIONS = (
    "empty empty_strided empty_like new_empty new_empty_strided resize_ resize_as_ set_ "
    "record_stream is_pinned _nnpack_available result_type size stride numel dim is_contiguous"
)

#: (kind, op names without ``aten::``, rule, whether the rule reads the arguments): read by
#: ``costmodel/ops.py``. Views, allocations and ``cat`` never need their arguments decoded.
RULES: list[tuple[str, str, Callable[[Call], Cost], bool]] = [
    ("memory", "copy_", _copy(1, dst_from=0), True),
    ("memory", "clone", _copy(0), True),
    ("memory", "_to_copy", _copy(0, dtype_arg=1), True),
    ("memory", "fill_ zero_", _fill, True),
    ("memory", "item _local_scalar_dense", _item, True),
    ("memory", "cat _cat concat concatenate", _cat, False),
    ("view", _VIEWS + " " + _ALLOCATIONS, _zero_cost, False),
]
