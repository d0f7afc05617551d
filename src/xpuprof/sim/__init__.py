"""Replay a trace in a simulator (DESIGN.md, "Replay in a simulator"): ``graph`` builds the
replay graph from the store, ``engine`` schedules it, ``costs`` says what each edge costs,
``replay`` is the public API. ``docs/replay.md`` defines every edge and number."""

from xpuprof.sim.replay import Replay, replay

__all__ = ["Replay", "replay"]
