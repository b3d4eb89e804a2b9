"""The gateway: `voiceagent serve` puts the voice pipeline behind real transports, in one process.

- app.py      `build_app(pipeline, settings, extra_routes=())`: the Starlette app (/, /healthz, /metrics,
              /ws, /twilio/voice, /twilio, then `extra_routes`, then the static demo at /)
- hub.py      `SessionHub` (`app.state.hub`): the session cap every transport shares;
              `async with hub.open(transport, options) as live` gives a `LiveSession` (its Session, trace
              and metrics; `live.events()`, `live.finish_turn(turn, outcome)`), or raises
              `SessionLimitError` at once when full
- security.py `check_client(connection, settings)`: API key + Origin for any browser-facing endpoint;
              Twilio signatures
- ws.py, ws_protocol.py           the /ws WebSocket API (ws_protocol.py builds every /ws message)
- twilio.py, twilio_protocol.py   Twilio Media Streams
- webrtc.py, webrtc_peer.py, webrtc_tracks.py   WebRTC for the browser (signalling, one peer, audio tracks)
- outbound.py `Outbound`: a session's events as paced audio and the /ws JSON events, for every transport
              (each gives an `OutboundSink`: `WsSink`, `TrackSink` for WebRTC, `TwilioSink` with marks)
- inbound.py  `InboundAudio`: any-rate input audio to the session's 20 ms frames stamped with their
              arrival, which every transport hands to the session with `push_frames`
- playout.py  real-time pacing of the agent's audio with a playback model; channel.py: one WebSocket;
              codes.py: close codes; body.py: HTTP request bodies with a size cap and a deadline (413, 408)
- serve.py    loads and warms the pipeline, runs uvicorn with `webrtc.routes()` (the WebRTC signalling)

A new transport opens sessions through the hub, checks clients with `check_client`, and closes with the
codes in codes.py; docs/protocol.md documents the wire formats.
"""
