"""Writers that turn a store back into files other tools open (Chrome trace / Perfetto)."""
