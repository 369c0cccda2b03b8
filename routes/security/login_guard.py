"""What stands in front of Gradio's POST /login: one credential per form, cross-site refusal,
throttles per account and per address, device cookies, and the hashing budget's queue bound.

Why each (issue #29):
- *Exactly what is authenticated* (item 1). The throttle used to read the first `username` field
  of the form, Gradio authenticates the last one, so a first field that changed every time was
  never throttled. The form is now parsed by Starlette's own parser (the one FastAPI uses for
  Gradio's `OAuth2PasswordRequestForm`), and a form with anything but one `username` and one
  `password` is refused (400) and counted against the address. The name is stripped as Gradio does.
- *Per account and per address.* Failures count per (name, address), 5 free, then 1, 2, 4 ... s
  (routes/auth.LoginThrottle), and per address over all names (ADDRESS_FREE_FAILURES free, then
  the same backoff; forgotten after ADDRESS_FORGET_S idle), so fresh or made-up names from one
  address are throttled too (item 7). A success does not clear the address count: one valid
  account must not buy unlimited spraying of the others.
- *Never lock a user out with her correct password* (item 6). Requests sent by another site's page
  (routes/security/cross_site.py) are refused (403) before anything is checked or counted. And a successful
  login gets a device cookie (HttpOnly, SameSite=Strict, signed with a per-process secret, bound to
  the user name): a later attempt with a valid device cookie for that name is throttled on its own
  key, not on the address, so failures by someone else at the same address (another local account,
  a script) cannot make her correct password fail in that browser.
- *Bounded hashing* (item 7): when MAX_WAITING attempts already wait for the hashing slot
  (routes/security/hash_budget.py), more are answered 429 at once, before Gradio or scrypt see them.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets

from starlette.datastructures import UploadFile
from starlette.requests import Request

from routes.security.asgi_body import BodyTooLarge, read_body, replaying
from routes.security.auth import LoginThrottle
from routes.security.cross_site import foreign_origin
from routes.security.hash_budget import HashBudget

MAX_LOGIN_BODY = 64 * 1024
ADDRESS_FREE_FAILURES = 20
ADDRESS_FORGET_S = 900.0
DEVICE_COOKIE = "paged-chat-device"
DEVICE_MAX_AGE_S = 30 * 24 * 3600


class DeviceCookies:
    """`nonce.mac` with mac = HMAC(secret, nonce NUL user): only this process can issue one."""

    def __init__(self, secret: bytes | None = None):
        self._secret = secret or secrets.token_bytes(32)

    def _mac(self, nonce: str, user: str) -> str:
        digest = hmac.new(self._secret, f"{nonce}\x00{user}".encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).decode().rstrip("=")

    def issue(self, user: str) -> str:
        nonce = secrets.token_urlsafe(12)
        return f"{nonce}.{self._mac(nonce, user)}"

    def device_of(self, value: str | None, user: str) -> str | None:
        """The device id of a valid cookie for `user` (None: no cookie, forged, or another user's)."""
        nonce, _, mac = (value or "").partition(".")
        if not nonce or not mac or not hmac.compare_digest(mac, self._mac(nonce, user)):
            return None
        return nonce


def _cookie(scope, name: str) -> str | None:
    for k, v in scope.get("headers", []):
        if k == b"cookie":
            for part in v.decode("latin-1").split(";"):
                key, _, value = part.strip().partition("=")
                if key == name:
                    return value
    return None


async def login_fields(scope, body: bytes) -> tuple[list, list]:
    """(usernames, passwords) of the form as Gradio's FastAPI route parses it."""

    async def no_more():
        return {"type": "http.disconnect"}

    form = await Request({**scope, "type": "http"}, replaying(body, no_more)).form()
    try:
        return form.getlist("username"), form.getlist("password")
    finally:
        await form.close()


class LoginThrottleMiddleware:
    """ASGI, in front of the mounted Gradio app (routes/security.install_security)."""

    def __init__(
        self,
        app,
        throttle: LoginThrottle | None = None,
        budget: HashBudget | None = None,
        address_throttle: LoginThrottle | None = None,
        devices: DeviceCookies | None = None,
    ):
        self.app = app
        self.throttle = throttle or LoginThrottle()
        self.budget = budget
        self.addresses = address_throttle or LoginThrottle(
            free_failures=ADDRESS_FREE_FAILURES,
            clock=self.throttle.clock,
            forget_after_s=ADDRESS_FORGET_S,
        )
        self.devices = devices or DeviceCookies()

    async def __call__(self, scope, receive, send):
        if (
            scope["type"] != "http"
            or scope.get("method") != "POST"
            or not scope.get("path", "").rstrip("/").endswith("/login")
        ):
            return await self.app(scope, receive, send)
        reason = foreign_origin(scope)
        if reason:  # another site's page: refused, and it counts for nobody
            return await _json(send, 403, {"detail": f"Login refused: {reason}."})
        try:
            body = await read_body(receive, MAX_LOGIN_BODY)
        except BodyTooLarge:
            return await _json(send, 413, {"detail": "login request too large"})
        if body is None:
            return
        if (
            self.budget is not None and self.budget.full()
        ):  # before any parsing: a flood costs little
            return await _json(
                send,
                429,
                {"detail": "The server is busy checking other logins. Try again in a few seconds."},
                [(b"retry-after", b"2")],
            )
        address = (scope.get("client") or ("?", 0))[0]
        try:
            users, passwords = await login_fields(scope, body)
        except Exception:  # a form Starlette cannot parse: Gradio could not either
            users, passwords = [], []
        if (
            len(users) != 1
            or len(passwords) != 1
            or isinstance(users[0], UploadFile)
            or isinstance(passwords[0], UploadFile)
        ):
            wait = self.addresses.retry_after("", address)
            if wait > 0:
                return await _too_many(send, wait)
            self.addresses.failed("", address)
            return await _json(
                send,
                400,
                {"detail": "A login form must have exactly one username and one password field."},
            )
        user = users[0].strip()
        device = self.devices.device_of(_cookie(scope, DEVICE_COOKIE), user)
        key = f"device:{device}" if device else address
        wait = self.throttle.retry_after(user, key)
        if not device:
            wait = max(wait, self.addresses.retry_after("", address))
        if wait > 0:
            return await _too_many(send, wait)

        async def watch(message):
            if message["type"] == "http.response.start":
                if message["status"] == 200:
                    self.throttle.succeeded(user, key)
                    cookie = (
                        f"{DEVICE_COOKIE}={self.devices.issue(user)}; Max-Age={DEVICE_MAX_AGE_S}; "
                        f"Path=/; HttpOnly; SameSite=Strict"
                    )
                    message = {
                        **message,
                        "headers": [*message.get("headers", []), (b"set-cookie", cookie.encode())],
                    }
                elif message["status"] in (400, 401, 403, 422):
                    self.throttle.failed(user, key)
                    if not device:
                        self.addresses.failed("", address)
            await send(message)

        await self.app(scope, replaying(body, receive), watch)


async def _too_many(send, wait: float) -> None:
    await _json(
        send,
        429,
        {"detail": f"Too many failed logins. Try again in {wait:.0f} s."},
        [(b"retry-after", str(max(1, round(wait))).encode())],
    )


async def _json(send, status: int, payload: dict, headers=()) -> None:
    body = json.dumps(payload).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
