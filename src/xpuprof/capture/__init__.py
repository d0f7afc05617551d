"""Recorders that run inside the user's process: our own annotations (``annotate``, collected
into ``records``), model-layer spans and the profiler of PyTorch (``torch``), JAX's profiler
(``jax``) and telemetry. They produce raw tables; the sessions that drive them and write stores
(``xpuprof.profile``, ``xpuprof.serve``) are in ``xpuprof.live``.

Submodules are imported on use, never here, so that ``import xpuprof.capture.annotate`` (which
every annotated program pays for) does not pull in torch, jax or pyarrow.
"""
