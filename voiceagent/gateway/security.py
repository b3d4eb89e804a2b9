"""Who may connect: the API key, the browser Origin allow-list, and Twilio's request signature.

`check_client(connection, settings)` is the one check for every browser-facing endpoint (/ws and the
WebRTC signalling): it takes a Starlette `HTTPConnection` (a `Request` or a `WebSocket`) and returns a
`Refusal` (close code, HTTP status, reason) or None when the client may go on.

- API key (VOICEAGENT_API_KEY): `Authorization: Bearer KEY` or `?token=KEY` (browsers cannot set headers
  on a WebSocket). Compared in constant time.
- Origin: a request without an Origin header is not from a browser page and passes; a browser's Origin
  must be the server's own (the Host it asked for, or VOICEAGENT_PUBLIC_URL) or in
  VOICEAGENT_ALLOWED_ORIGINS ("*" allows any). This stops other sites' pages from using the agent.
- Twilio: X-Twilio-Signature is base64(HMAC-SHA1(auth token, URL + each POST parameter's name and value,
  sorted by name)), over the URL Twilio called (`public_url`); see `twilio_refusal`.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Mapping
from urllib.parse import urlsplit

from starlette.requests import HTTPConnection

from voiceagent.config import Settings
from voiceagent.gateway.codes import Close, Refusal


def presented_key(connection: HTTPConnection) -> str | None:
    """The key the client sent: `Authorization: Bearer KEY`, else the `token` query parameter."""
    header = connection.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    return connection.query_params.get("token") or None


def key_ok(connection: HTTPConnection, settings: Settings) -> bool:
    if settings.api_key is None:
        return True
    presented = presented_key(connection)
    expected = settings.api_key.get_secret_value()
    return presented is not None and hmac.compare_digest(presented.encode(), expected.encode())


def origin_ok(connection: HTTPConnection, settings: Settings) -> bool:
    origin = connection.headers.get("origin")
    if origin is None:
        return True
    origin = origin.rstrip("/")
    allowed = settings.origins
    if "*" in allowed or origin in allowed:
        return True
    own_hosts = {connection.headers.get("host", "")}
    if settings.public_url is not None:
        own_hosts.add(urlsplit(settings.public_url).netloc)
    return urlsplit(origin).netloc in own_hosts


def check_client(connection: HTTPConnection, settings: Settings) -> Refusal | None:
    """None if this browser-facing client may connect, else why not (see the module docstring)."""
    if not origin_ok(connection, settings):
        origin = connection.headers.get("origin", "")[:60]
        return Refusal(Close.FORBIDDEN_ORIGIN, 403, f"origin {origin} is not allowed")
    if not key_ok(connection, settings):
        return Refusal(Close.UNAUTHORIZED, 401, "missing or invalid API key")
    return None


# ----- Twilio ---------------------------------------------------------------------------------------


def twilio_signature(auth_token: str, url: str, params: Mapping[str, str]) -> str:
    """The X-Twilio-Signature Twilio sends for a request to `url` with these POST parameters."""
    payload = url + "".join(f"{name}{params[name]}" for name in sorted(params))
    digest = hmac.new(auth_token.encode(), payload.encode(), hashlib.sha1).digest()
    return base64.b64encode(digest).decode()


def public_origin(connection: HTTPConnection, settings: Settings, family: str) -> str:
    """`scheme://host[:port]` as the caller sees this server: VOICEAGENT_PUBLIC_URL, else the Host header
    and X-Forwarded-Proto (a TLS proxy in front). `family` ("http" or "ws") picks the scheme family; the
    secure variant follows the public scheme."""
    if settings.public_url is not None:
        base = urlsplit(settings.public_url)
        secure, netloc = base.scheme == "https", base.netloc
    else:
        forwarded = connection.headers.get("x-forwarded-proto", connection.url.scheme)
        secure = forwarded.split(",")[0].strip() in ("https", "wss")
        netloc = connection.headers.get("host", connection.url.netloc)
    return f"{family}{'s' if secure else ''}://{netloc}"


def public_url(connection: HTTPConnection, settings: Settings) -> str:
    """The URL the caller used for this request (path and query included), as Twilio signs it."""
    family = "ws" if connection.scope["type"] == "websocket" else "http"
    url = public_origin(connection, settings, family) + connection.url.path
    return f"{url}?{connection.url.query}" if connection.url.query else url


def twilio_refusal(connection: HTTPConnection, settings: Settings, params: Mapping[str, str]) -> str | None:
    """Why a Twilio request is refused, or None. With VOICEAGENT_TWILIO_AUTH_TOKEN its signature must
    match. Without it the phone endpoints are open, unless VOICEAGENT_API_KEY protects the server: Twilio
    cannot send that key, so a keyed server takes calls only with signatures checked."""
    if settings.twilio_auth_token is None:
        if settings.api_key is None:
            return None
        return "set VOICEAGENT_TWILIO_AUTH_TOKEN to take calls on a server with an API key"
    return None if _twilio_signed(connection, settings, params) else "invalid X-Twilio-Signature"


def _twilio_signed(connection: HTTPConnection, settings: Settings, params: Mapping[str, str]) -> bool:
    assert settings.twilio_auth_token is not None
    signature = connection.headers.get("x-twilio-signature", "")
    token = settings.twilio_auth_token.get_secret_value()
    url = public_url(connection, settings)
    # Twilio signs the URL as configured: with or without an explicit standard port.
    candidates = {url, _without_default_port(url)}
    return any(
        hmac.compare_digest(twilio_signature(token, candidate, params), signature) for candidate in candidates
    )


def _without_default_port(url: str) -> str:
    parts = urlsplit(url)
    default = {"http": 80, "ws": 80, "https": 443, "wss": 443}.get(parts.scheme)
    if parts.port is not None and parts.port == default:
        return parts._replace(netloc=parts.hostname or "").geturl()
    return url
