"""The gateway harness the benchmarks drive, named in one place: an app served on a free loopback port
(`running`), a WebSocket client that records what the server sends (`client`, `Client`), and callers that
drop their connection at any point of a turn, with the process gauges to check afterwards (the drops
module). Both stay in tests/gateway/, beside the tests that use them most."""

from tests.gateway.drops import (
    DropPipeline,
    DropResult,
    Resources,
    drop_many,
    gauges,
    one_full_turn,
    random_plans,
    settle,
    tally,
)
from tests.gateway.helpers import Client, client, running

__all__ = [
    "Client",
    "DropPipeline",
    "DropResult",
    "Resources",
    "client",
    "drop_many",
    "gauges",
    "one_full_turn",
    "random_plans",
    "running",
    "settle",
    "tally",
]
