"""Who may call the explorer (docs/methods.md §11, "Threat model").

The explorer is a local server: a web page on any site the researcher visits can make the
browser send it requests. One ASGI middleware answers every request before it reaches a route,
in this order, with one JSON message and no computation:

1. **Host** (DNS rebinding): a server bound to loopback answers only the names it was started
   for -- ``127.0.0.1``, ``localhost``, ``[::1]`` -- with its own port; anything else is a 400.
   (Starlette's ``TrustedHostMiddleware`` checks the name but not the port, hence this check.)
   A server bound beyond loopback (``0.0.0.0``, a LAN address) cannot know the names it is
   reached by, so its guard is the token.
2. **Token**: when one is set (by default whenever the server listens beyond loopback), every
   ``/api/`` request carries it as ``Authorization: token …`` (the page reads it from the
   ``?token=`` of the URL the server prints and keeps it in the tab's ``sessionStorage``, which,
   unlike a cookie, no other port of the host can read), else 403. The page and circuitsvis'
   bundle are static files and need none.
3. **Cross-site**: a request whose ``Origin`` is not the server's own, or that the browser marks
   ``Sec-Fetch-Site: cross-site`` / ``same-site`` on ``/api/``, is a 403.
4. **POST bodies**: only ``application/json`` (415 otherwise: an HTML form or a no-cors fetch
   cannot send it without a CORS preflight, which this server never grants), at most
   ``MAX_BODY`` bytes, counted before the body is read (413).
5. **Framing**: every response says ``Content-Security-Policy: frame-ancestors`` the loopback
   origins only, so a page on another site cannot frame the explorer and trick a click.

The routes then parse the body into typed requests (``explore.requests``).
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass

LOOPBACK = ("127.0.0.1", "localhost", "::1")
WILDCARD = ("0.0.0.0", "::", "")
MAX_BODY = 64 * 1024  # bytes: a 512-token prompt is a few KiB; nothing the page sends comes near


def is_loopback(host: str) -> bool:
    return host.strip("[]") in LOOPBACK


def new_token() -> str:
    return secrets.token_urlsafe(24)


def exposure_warning(host: str, token: bool) -> str | None:
    """What to tell a user who binds the explorer beyond loopback (None on loopback)."""
    if is_loopback(host):
        return None
    if token:
        return (f"note: the explorer listens on {host}: whoever can reach this machine and has the URL with its "
                f"token can use the model (and see what you type)")
    return (f"warning: the explorer listens on {host} without a token: anyone who can reach this machine can use "
            f"the model (and see what you type), and any web page can drive it; an SSH tunnel to 127.0.0.1 "
            f"keeps it local")


_HOST = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+)(?::([0-9]{1,5}))?")
FRAME_ANCESTORS = "frame-ancestors 'self' http://127.0.0.1:* http://localhost:*"  # (CSP has no IPv6 literal sources)


def _host_port(value: str) -> tuple[str, int | None] | None:
    """(name, port) of a Host header: a name or [IPv6] and an optional port, nothing else
    (no user info, path or stray characters); None if it is not that."""
    m = _HOST.fullmatch(value)
    if m is None:
        return None
    return m.group(1).strip("[]").lower(), None if m.group(2) is None else int(m.group(2))


@dataclass(frozen=True)
class Policy:
    """What the guard enforces: the host the server was started for, and its token (None: no token)."""

    host: str = "127.0.0.1"
    token: str | None = None
    max_body: int = MAX_BODY

    def names(self) -> set[str] | None:
        """Host names a loopback server answers to; None: any (bound beyond loopback, where it may
        be reached by names it cannot know, the token guards it)."""
        return set(LOOPBACK) if is_loopback(self.host) else None


class Refused(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class Guard:
    """ASGI middleware enforcing ``policy`` on every HTTP request (see the module docstring)."""

    def __init__(self, app, policy: Policy):
        self.app = app
        self.policy = policy

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        send = _framed(send)
        try:
            self.check(scope, headers)
        except Refused as e:
            await _json(send, e.status, {"error": str(e)})
            return
        except Exception:  # noqa: BLE001 -- a request the checks cannot even read is refused, not a 500
            await _json(send, 400, {"error": "malformed request"})
            return
        if scope["method"] == "POST":
            receive = _capped(receive, self.policy.max_body)
        await self.app(scope, receive, send)

    def check(self, scope, headers: dict) -> None:
        """Refuse (``Refused``) what the policy forbids."""
        p = self.policy
        host = _host_port(headers.get("host", ""))
        server_port = (scope.get("server") or (None, None))[1]
        if host is None or not host[0]:
            raise Refused(400, "bad Host header")
        names = p.names()
        if names is not None and (host[0] not in names or (host[1] or 80) != server_port):
            raise Refused(400, f"this explorer answers only {', '.join(sorted(names))} on port {server_port}, "
                               f"not Host {headers.get('host')!r}")
        path = scope.get("path", "")
        if p.token is not None and path.startswith("/api/"):
            given = _token_of(headers)
            if given is None or not secrets.compare_digest(given.encode("utf-8", "surrogateescape"),
                                                           p.token.encode()):
                raise Refused(403, "this explorer needs its token: open the URL it printed (…/?token=…), or send "
                                   "'Authorization: token …'")
        origin = headers.get("origin")
        if origin is not None and origin.lower() != f"http://{headers['host']}".lower():
            raise Refused(403, f"cross-site request refused (Origin {origin!r})")
        if path.startswith("/api/") and headers.get("sec-fetch-site", "same-origin") not in ("same-origin", "none"):
            raise Refused(403, "cross-site request refused (Sec-Fetch-Site "
                               f"{headers.get('sec-fetch-site')!r})")
        if scope["method"] == "POST":
            media = headers.get("content-type", "").split(";")[0].strip().lower()
            if media != "application/json":
                raise Refused(415, f"POST bodies must be application/json, not {media or 'untyped'!r}")
            length = headers.get("content-length")
            if length is not None and (not length.isdigit() or int(length) > p.max_body):
                raise Refused(413, f"the request body is over {p.max_body // 1024} KiB")


def _token_of(headers: dict) -> str | None:
    """The token an ``Authorization: token …`` (or ``Bearer …``) header carries."""
    scheme, _, value = headers.get("authorization", "").partition(" ")
    if scheme.lower() in ("token", "bearer") and value.strip():
        return value.strip()
    return None


class BodyTooLarge(Exception):
    """A body that grew past the cap while it was read (no Content-Length, or a false one)."""


def _capped(receive, limit: int):
    seen = 0

    async def wrapped():
        nonlocal seen
        message = await receive()
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > limit:
                raise BodyTooLarge(f"the request body is over {limit // 1024} KiB")
        return message
    return wrapped


def _framed(send):
    """Every response says who may frame it (``FRAME_ANCESTORS``) and that nothing is sniffed."""
    async def wrapped(message):
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", []),
                                              (b"content-security-policy", FRAME_ANCESTORS.encode()),
                                              (b"x-content-type-options", b"nosniff")]}
        await send(message)
    return wrapped


async def _json(send, status: int, body: dict) -> None:
    data = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]})
    await send({"type": "http.response.body", "body": data})
