"""Fuzz the gateway (/ws, /twilio, /webrtc/offer) and the engine server (/v1/*) with generated hostile
messages while a healthy session uses the same servers; print progress, then one JSON line of counts.

    .venv/bin/python bench/fuzz.py --messages 100000              # as fast as the servers take them
    .venv/bin/python bench/fuzz.py --messages 100000 --rate 250   # paced: hostile content, moderate load

The generators and drivers are tests/support/fuzzing/ (tests/gateway/test_fuzz.py runs a short round). Exit
status 1 when a server crashed, logged an unhandled exception, or answered a message against the protocol.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.fuzzing import Plan, Tally, fuzz_round  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--messages", type=int, default=100_000, help="messages in all (default 100000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--parallel", type=int, default=4, help="fuzzing connections at a time")
    parser.add_argument("--baseline-s", type=float, default=20.0, help="healthy clients alone, first")
    parser.add_argument("--loris", type=int, default=40, help="slow-loris connections")
    parser.add_argument("--rate", type=float, default=None, help="messages a second (default: unpaced)")
    parser.add_argument("--logs", type=Path, default=None, help="keep the servers' logs here")
    args = parser.parse_args()
    plan = Plan(args.messages, seed=args.seed, parallel=args.parallel, loris=args.loris, rate=args.rate)
    log_dir = args.logs or Path(tempfile.mkdtemp(prefix="voiceagent-fuzz-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    began, last = time.monotonic(), [0.0]

    def progress(tally: Tally) -> None:
        now = time.monotonic()
        if now - last[0] >= 10:
            last[0] = now
            print(f"[{now - began:6.0f} s] {tally.messages} messages {dict(tally.sent)}, "
                  f"{tally.n_mismatches} unexpected answers", file=sys.stderr, flush=True)  # fmt: skip

    pace = f"{args.rate:g}/s" if args.rate else "unpaced"
    print(f"fuzzing {args.messages} messages ({pace}, seed {args.seed}); logs in {log_dir}", file=sys.stderr)
    # the slow-loris bodies are cut at 10 s (gateway) and 30 s (engine server) after their headers, which a
    # sender of a byte every 20 ms on a busy client loop takes up to tens of seconds to finish: held 90 s
    result = fuzz_round(plan, log_dir, args.baseline_s, loris_hold_s=90.0, progress=progress)
    summary = result.summary()
    print(json.dumps(summary))
    failed = summary["crashes"] or any(summary["log_faults"].values()) or summary["mismatches"]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
