"""The gateway: `voiceagent serve` puts the voice pipeline behind real transports, in one process.

- app.py      `build_app(pipeline, settings, extra_routes=())`: the Starlette app (/, /healthz, /metrics,
              /ws, /twilio/voice, /twilio, then `extra_routes`, then the static demo at /)
- hub.py      `SessionHub` (`app.state.hub`): the session cap every transport shares;
              `async with hub.open(transport, options) as live` gives a `LiveSession` (its Session, trace
              and metrics; `live.events()`, `live.finish_turn(turn, outcome)`), or raises
              `SessionLimitError` at once when full
- security.py `check_client(connection, settings)`: API key + Origin for any browser-facing endpoint;
              Twilio signatures
- ws.py, ws_protocol.py           the /ws WebSocket API
- twilio.py, twilio_protocol.py   Twilio Media Streams
- outbound.py `Outbound`: a session's events as the /ws JSON events and paced audio, for /ws and WebRTC
              (the transport gives the message sender and the audio sink)
- playout.py  real-time pacing of the agent's audio with a playback model; inbound.py: any-rate input
              audio to the session's 20 ms frames; channel.py: one WebSocket; codes.py: close codes; body.py:
              HTTP request bodies with a size cap and a deadline (413, 408)
- serve.py    loads and warms the pipeline, runs uvicorn; mounts `voiceagent.gateway.webrtc.routes()`
              when that module exists (the WebRTC signalling)

A new transport opens sessions through the hub, checks clients with `check_client`, and closes with the
codes in codes.py; docs/protocol.md documents the wire formats.
"""
