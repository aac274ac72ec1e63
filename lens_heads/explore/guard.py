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
   request carries it -- ``?token=`` in the URL the server prints (the page then keeps it in a
   ``SameSite=Strict`` cookie), or ``Authorization: token …`` -- else 403.
3. **Cross-site**: a request whose ``Origin`` is not the server's own, or that the browser marks
   ``Sec-Fetch-Site: cross-site`` / ``same-site`` on ``/api/``, is a 403.
4. **POST bodies**: only ``application/json`` (415 otherwise: an HTML form or a no-cors fetch
   cannot send it without a CORS preflight, which this server never grants), at most
   ``MAX_BODY`` bytes, counted before the body is read (413).

The routes then parse the body into typed requests (``explore.requests``).
"""

from __future__ import annotations

import hashlib
import json
import secrets
from dataclasses import dataclass
from http.cookies import SimpleCookie
from urllib.parse import parse_qs, urlsplit

LOOPBACK = ("127.0.0.1", "localhost", "::1")
WILDCARD = ("0.0.0.0", "::", "")
MAX_BODY = 64 * 1024  # bytes: a 512-token prompt is a few KiB; nothing the page sends comes near


def is_loopback(host: str) -> bool:
    return host.strip("[]") in LOOPBACK


def new_token() -> str:
    return secrets.token_urlsafe(24)


def _host_port(value: str) -> tuple[str, int | None] | None:
    """(name, port) of a Host header or an origin's netloc; None if it does not parse."""
    try:
        parts = urlsplit("//" + value)
        return (parts.hostname or "").lower(), parts.port
    except ValueError:
        return None


@dataclass(frozen=True)
class Policy:
    """What the guard enforces: the host the server was started for, and its token (None: no token)."""

    host: str = "127.0.0.1"
    token: str | None = None
    max_body: int = MAX_BODY

    @property
    def cookie(self) -> str:
        """The token's cookie name (one per token: two explorers on one machine keep their own)."""
        return "lens_heads_" + hashlib.sha256((self.token or "").encode()).hexdigest()[:12]

    def names(self) -> set[str] | None:
        """Host names a loopback server answers to; None: any (bound beyond loopback, where it may
        be reached by names it cannot know, the token guards it)."""
        if not is_loopback(self.host):
            return None
        return {*LOOPBACK, self.host.strip("[]").lower()}


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
        try:
            set_cookie = self.check(scope, headers)
        except Refused as e:
            await _json(send, e.status, {"error": str(e)})
            return
        if set_cookie:
            send = _with_cookie(send, set_cookie)
        if scope["method"] == "POST":
            receive = _capped(receive, self.policy.max_body)
        await self.app(scope, receive, send)

    def check(self, scope, headers: dict) -> str | None:
        """Refuse (``Refused``) what the policy forbids; the Set-Cookie value to add, if any."""
        p = self.policy
        host = _host_port(headers.get("host", ""))
        server_port = (scope.get("server") or (None, None))[1]
        if host is None or not host[0]:
            raise Refused(400, "bad Host header")
        names = p.names()
        if names is not None and (host[0] not in names or (host[1] or 80) != server_port):
            raise Refused(400, f"this explorer answers only {', '.join(sorted(names))} on port {server_port}, "
                               f"not Host {headers.get('host')!r}")
        set_cookie = None
        if p.token is not None:
            given = _token_of(scope, headers, p.cookie)
            if given is None or not secrets.compare_digest(given[0], p.token):
                raise Refused(403, "this explorer needs its token: open the URL it printed (…/?token=…), or send "
                                   "'Authorization: token …'")
            if given[1] == "query":
                set_cookie = f"{p.cookie}={p.token}; Path=/; HttpOnly; SameSite=Strict"
        path = scope.get("path", "")
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
        return set_cookie


def _token_of(scope, headers: dict, cookie_name: str) -> tuple[str, str] | None:
    """(the token a request carries, where): the query, an Authorization header, or the cookie."""
    query = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("token")
    if query:
        return query[0], "query"
    auth = headers.get("authorization", "")
    scheme, _, value = auth.partition(" ")
    if scheme.lower() in ("token", "bearer") and value.strip():
        return value.strip(), "header"
    if "cookie" in headers:
        jar = SimpleCookie()
        try:
            jar.load(headers["cookie"])
        except Exception:  # noqa: BLE001 -- a malformed cookie header carries no token
            return None
        if cookie_name in jar:
            return jar[cookie_name].value, "cookie"
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


def _with_cookie(send, cookie: str):
    async def wrapped(message):
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", []), (b"set-cookie", cookie.encode())]}
        await send(message)
    return wrapped


async def _json(send, status: int, body: dict) -> None:
    data = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]})
    await send({"type": "http.response.body", "body": data})
