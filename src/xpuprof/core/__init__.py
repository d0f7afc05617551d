"""The bottom layer: names, the normalized schema, the raw-trace contract between readers and the
normaliser, errors and the ``Result`` every tool returns. It imports nothing else of xpuprof, so
every other layer may import it."""
