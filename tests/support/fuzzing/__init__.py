"""Hostile input for the gateway and the engine server: seeded generators, the servers to aim them at, and
drivers that check every answer. tests/gateway/test_fuzz.py runs a short round; bench/fuzz.py a long one.

Generators take a `random.Random` and return `Probe`s: what to send and what the protocol (docs/protocol.md,
the OpenAI error rules of engine/server/protocol.py) says the server must answer. The expectations come from
small oracles written from the documented rules, not from the server's own parsers. One module a target:

- `ws`, `twilio`: scripts of /ws messages and Twilio calls, each bad message with its error or close code;
- `gateway`: those and POST /webrtc/offer bodies against the gateway, plus a healthy /ws session;
- `engine_server`: malformed and mutated OpenAI requests against /v1/*, plus a healthy client;
- `loris`: slow-loris sockets against either server;
- `values` (hostile JSON-ish values) and `tally` (counts, pace, plan) are shared by all of them;
- `round`: both servers in processes of their own (`targets`), logs captured, and one round over all.
"""

from tests.support.fuzzing.gateway import sample_offer
from tests.support.fuzzing.round import RoundResult, fuzz_round, server_process
from tests.support.fuzzing.tally import Plan, Tally
from tests.support.fuzzing.targets import FuzzTokenizer

__all__ = ["FuzzTokenizer", "Plan", "RoundResult", "Tally", "fuzz_round", "sample_offer", "server_process"]
