"""A reply proposed ahead: ids the caller expects the target to write, verified like one long draft.

A voice agent starts its reply on a partial transcript (voiceagent/preempt.py). When the final transcript
then differs a little ("?" for "."), the reply already written is most likely what the target writes to the
final words too. Instead of throwing it away, the caller passes its ids as `proposal` to
`Conversation.generate`: the first blocks verify them as drafts (no draft model runs), so the accepted
prefix costs one forward per block, not one per token. Exact by construction: a proposed id is committed
only where the target would have chosen it (greedy), or with the target's own probability of it (sampling:
a proposal is a draft distribution with all its mass on the proposed id, as prompt-lookup drafts are).

Once the target writes anything the proposal did not say, the rest of it answers another continuation and
is dropped. How many proposed ids go into one block follows the verify-cost table (`SpeculationStats`):
the number that commits the most ids per second if all are accepted, within `MAX_PROPOSAL_ROWS` rows so that
the first block (which also carries the prompt's changed tail) stays quick.
"""

from __future__ import annotations

from collections.abc import Sequence

from engine.adaptive import SpeculationStats

MAX_PROPOSAL_ROWS = 16  # ids in one verifying forward: pending ids (a prompt's tail) + proposed ids
UNMEASURED_PROPOSAL = 4  # ids a block takes when no verify cost has been measured


class Proposal:
    """The ids expected after the prompt; `take` hands out the next ones while the output still follows."""

    def __init__(self, ids: Sequence[int]) -> None:
        self.ids = [int(i) for i in ids]
        self.n_proposed = 0  # ids handed to verification so far
        self.n_kept = 0  # of them, committed (the output still equals the proposal's prefix)
        self.diverged = False

    def follow(self, generated: Sequence[int]) -> None:
        """Records the ids generated so far: the proposal holds while they are its own prefix."""
        if self.diverged:
            return
        kept = 0
        for made, proposed in zip(generated, self.ids, strict=False):
            if made != proposed:
                self.diverged = True
                break
            kept += 1
        self.n_kept = kept

    def take(self, n_generated: int, n_pending: int, limit: int, stats: SpeculationStats) -> list[int]:
        """The ids to verify in the next block (empty once diverged or used up): at most `limit`, after
        `n_pending` ids the target has not seen yet."""
        left = self.ids[n_generated:] if not self.diverged else []
        most = min(len(left), limit, max(0, MAX_PROPOSAL_ROWS - n_pending))
        if most <= 0:
            return []
        n = _best_length(most, n_pending, stats)
        self.n_proposed = max(self.n_proposed, n_generated + n)
        return left[:n]


def _best_length(most: int, n_pending: int, stats: SpeculationStats) -> int:
    """The count k in 1..most that commits the most ids per second of verify if every one is accepted:
    k + 1 ids (the proposed ones and the target's next) for a forward of n_pending + k rows."""
    if stats.verify_s(1) is None:
        return min(most, UNMEASURED_PROPOSAL)
    best, best_rate = 1, 0.0
    for k in range(1, most + 1):
        seconds = stats.verify_s(n_pending + k)
        rate = (k + 1) / seconds if seconds else 0.0
        if rate > best_rate:
            best, best_rate = k, rate
    return best
