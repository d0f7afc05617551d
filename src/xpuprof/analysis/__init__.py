"""Analyses of a normalized trace: pure functions ``(Trace, options) -> DataFrame`` (or a
``Result`` of several, with notes on what could not be computed). Printing and rendering belong
to ``xpuprof.ui``."""
