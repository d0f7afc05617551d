"""Validation cases of ``benchmarks/whatif_validation.py``, one module per kind of change.

Each module exposes ``run(args) -> dict[str, dict]``: case name → row with at least
``change`` (the what-if change text), ``predicted`` and ``measured`` (mean step, seconds, of
the unprofiled run: the prediction made from the baseline trace alone), ``speedup_predicted``
and ``speedup_measured`` (baseline / …), and optional ``note``. Medians over ``args.runs``.
"""
