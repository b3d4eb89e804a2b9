"""`python -m engine bench`: the engine's benchmarks, scripts rather than tests.

`cli` (the subcommand: plain vs speculative decoding, interleaved per prompt), `contenders` (what is timed:
the engine and transformers' generate), `shapes` (random weights with real models' shapes, for GPU timing).
"""
