"""Live capture: our own annotations (``annotate``), collectors around framework profilers
(PyTorch, JAX), on-demand remote capture and telemetry.

Submodules are imported on use, never here, so that ``import xpuprof.capture.annotate`` (which
every annotated program pays for) does not pull in torch, jax or pyarrow.
"""
