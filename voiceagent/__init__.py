"""The voice agent: audio, text, time and sockets around the speculative engine.

It reaches the engine through one module (its LLM stage). The pipeline (VAD, streaming ASR, LLM turn,
phrase chunking, streaming TTS) and the gateway (WebRTC, WebSocket, Twilio) build on this package.
"""

__all__: list[str] = []
