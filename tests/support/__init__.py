"""Code the tests and the benchmarks share; bench/ imports this package, never a test module.

- `servers`: a free loopback port, waiting until a server process is healthy, stopping it.
- `fuzzing`: hostile-input generators, the fuzz targets in their own processes, and one fuzzing round.
- `gateway`: the gateway harness (an app served on loopback, a recording client, callers that drop), kept
  in tests/gateway/ and named here.
- `audio`: spoken test audio (espeak-ng speech, silence), kept with the fakes in tests/fakes.py.

This module imports nothing, so `tests.support.servers` stays light for the engine's tests.
"""
