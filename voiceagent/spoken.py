"""What the user actually heard of a reply: phrases with their audio length, and the playback position.

After a barge-in the assistant's message in the history is cut to these words, so the model never
believes it said what the user did not hear.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SpokenReply:
    phrases: list[tuple[str, int]] = field(default_factory=list)  # (text, samples at the output rate)
    played_samples: int = 0

    def add_audio(self, phrase: str, n_samples: int) -> None:
        """Audio of `phrase` was synthesised (a phrase may come in several chunks)."""
        if self.phrases and self.phrases[-1][0] == phrase:
            self.phrases[-1] = (phrase, self.phrases[-1][1] + n_samples)
        else:
            self.phrases.append((phrase, n_samples))

    @property
    def total_samples(self) -> int:
        return sum(n for _, n in self.phrases)

    def played_text(self) -> str:
        """Whole phrases played, plus the share of words of the phrase playing now."""
        words: list[str] = []
        remaining = self.played_samples
        for text, n_samples in self.phrases:
            if remaining >= n_samples:
                words += text.split()
                remaining -= n_samples
                continue
            phrase_words = text.split()
            words += phrase_words[: int(len(phrase_words) * remaining / max(n_samples, 1))]
            break
        return " ".join(words)
