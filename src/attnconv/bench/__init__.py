"""Benchmark suites run by `attnconv bench --suite NAME`: each is a module ``attnconv.bench.NAME``
with ``main(argv) -> int`` (layers: this package's core layer; local, convert: other suites).
Shared helpers (subprocess timing, peak memory, FLOP counting, tables) are in ``common``."""
