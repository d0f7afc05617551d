"""Writers that turn a store back into files other tools open: Chrome trace / Perfetto
(``chrome``, with overlays and the replay's simulated timeline) and Chakra execution traces
(``chakra``) for ASTRA-sim."""
