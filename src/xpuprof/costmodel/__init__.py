"""FLOPs and bytes of framework ops from their recorded shapes and dtypes, split by op family
(``matmul``, ``conv``, ``attention``, ``elementwise``, ``reduction``, ``norm``, ``embedding``,
``loss``, ``movement``); ``ops`` is the table of which rule each op has, ``derive`` costs a whole
column of events. The conventions (what is exact, what is estimated, what bytes mean, why
values are inclusive) are in ``docs/costmodel.md``.

Submodules are imported on use: ``from xpuprof.costmodel.derive import derive``.
"""
