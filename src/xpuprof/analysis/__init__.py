"""Analyses of a normalized trace, one module per tool: pure functions
``tool(trace, *, ranks=None, steps=None, **options) -> Result`` (tables, notes, typed facts;
``xpuprof.core.result``), every step by default. ``common`` holds what every analysis needs
(step selection, the kernel-type classifier, interval arithmetic); ``device`` the one selection
of device work the breakdown and idle time share; ``hta`` HTA's behaviours for
``hta_compatible``. Printing and rendering belong to ``xpuprof.ui``."""
