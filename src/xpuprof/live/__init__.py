"""Live sessions: ``xpuprof.profile``/``xpuprof.step`` (``profile``, with ``assemble`` turning a
stopped capture into a store) and on-demand capture of a running job (``remote``:
``xpuprof.serve`` in the job, over the bounded server of ``httpd``; ``client``:
``request_capture`` from outside; ``docs/capture.md``).

They drive the whole pipeline from a running program: the recorders of ``capture/`` produce raw
tables, the readers of ``formats/`` read the framework profilers' files, and ``trace/`` writes the
store. That is why they sit right of ``trace/`` (``docs/architecture.md``), while the recorders
they drive sit at the left end. Submodules are imported on use, never here.
"""
