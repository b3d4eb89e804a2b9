"""Spoken test audio for the benchmarks: espeak-ng speech of a text, and silence (16 kHz int16). They stay in
tests/fakes.py, with the fakes the unit tests build from them."""

from tests.fakes import espeak_speech, silence

__all__ = ["espeak_speech", "silence"]
