"""Audio between aiortc and a voice session, both ways.

In: aiortc decodes the browser's Opus to s16 stereo 48 kHz frames ([1, 1920] per 20 ms, interleaved);
`frame_to_mono_pcm16` downmixes them, and the gateway's `InboundAudio` (one soxr stream per connection)
cuts them into the session's 20 ms PCM16 mono 16 kHz frames.

Out: `OutboundAudioTrack` is the track aiortc encodes to Opus. It hands out one 20 ms frame each time
aiortc asks, paced to real time by the injected clock (aiortc asks as fast as it can encode otherwise), and
silence when there is nothing to say. Each frame handed out counts as played: the track is the output
clock, so it reports the turn's played samples back to the session, which is how a barge-in knows which
words the user heard. `flush` drops queued audio at once (barge-in).
"""

from __future__ import annotations

import fractions
from collections import deque
from collections.abc import Callable

import av
import numpy as np
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from voiceagent.audio import FRAME_MS, to_mono, to_pcm16
from voiceagent.clock import Clock

# When the loop falls this far behind the output clock, restart the clock instead of bursting frames.
_MAX_LAG_NS = 200_000_000


def frame_to_mono_pcm16(frame: av.AudioFrame) -> np.ndarray:
    """Any PyAV audio frame (s16/flt, packed or planar, any channel count) -> [samples] int16."""
    channels = len(frame.layout.channels)
    array = frame.to_ndarray()  # packed: [1, samples * channels]; planar: [channels, samples]
    interleaved = array.reshape(-1, channels) if frame.format.is_packed else array.T
    if frame.format.name in ("s16", "s16p"):
        pcm16 = interleaved.astype(np.int16, copy=False)
    elif frame.format.name in ("flt", "fltp"):
        pcm16 = to_pcm16(interleaved)
    else:
        raise ValueError(f"unsupported audio sample format {frame.format.name!r} (want s16 or flt)")
    return to_mono(pcm16)


PlayedCallback = Callable[[int, int], None]  # (turn, samples of that turn played so far)


class OutboundAudioTrack(MediaStreamTrack):
    """The agent's voice as a WebRTC track: PCM16 mono at `rate`, 20 ms per frame, real-time paced."""

    kind = "audio"

    def __init__(self, clock: Clock, rate: int, on_played: PlayedCallback) -> None:
        super().__init__()
        if rate * FRAME_MS % 1000:
            raise ValueError(f"the output rate must give whole 20 ms frames, got {rate} Hz")
        self.clock, self.rate, self.on_played = clock, rate, on_played
        self.frame_samples = rate * FRAME_MS // 1000
        self._queue: deque[tuple[int, np.ndarray]] = deque()  # (turn, samples), in order
        self._played: dict[int, int] = {}
        self._next_ns: int | None = None
        self._pts = 0
        self._time_base = fractions.Fraction(1, rate)

    @property
    def queued_samples(self) -> int:
        return sum(len(samples) for _, samples in self._queue)

    def push(self, turn: int, samples: np.ndarray) -> None:
        """Queues the turn's audio ([n] int16 at the track's rate) behind what is already queued."""
        if samples.ndim != 1 or samples.dtype != np.int16:
            raise ValueError(f"outbound audio must be [n] int16, got {samples.shape} {samples.dtype}")
        if len(samples):
            self._queue.append((turn, samples))

    def flush(self) -> None:
        """Drops everything queued (barge-in): the next frame is silence."""
        self._queue.clear()

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        await self._wait_for_frame_time()
        pcm = self._take(self.frame_samples)
        frame = av.AudioFrame.from_ndarray(pcm.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = self.rate
        frame.pts = self._pts
        frame.time_base = self._time_base
        self._pts += self.frame_samples
        return frame

    async def _wait_for_frame_time(self) -> None:
        now = self.clock.now_ns()
        if self._next_ns is None or now - self._next_ns > _MAX_LAG_NS:
            self._next_ns = now
        elif self._next_ns > now:
            await self.clock.sleep((self._next_ns - now) / 1e9)
        self._next_ns += FRAME_MS * 1_000_000

    def _take(self, count: int) -> np.ndarray:
        """The next `count` samples (silence-padded), reporting each turn's played position."""
        out = np.zeros(count, dtype=np.int16)
        filled = 0
        touched: list[int] = []
        while filled < count and self._queue:
            turn, samples = self._queue[0]
            used = min(count - filled, len(samples))
            out[filled : filled + used] = samples[:used]
            filled += used
            self._played[turn] = self._played.get(turn, 0) + used
            if turn not in touched:
                touched.append(turn)
            if used == len(samples):
                self._queue.popleft()
            else:
                self._queue[0] = (turn, samples[used:])
        for turn in touched:
            self.on_played(turn, self._played[turn])
        return out
