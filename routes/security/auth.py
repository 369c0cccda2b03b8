"""Logins: password hashes, where credentials come from, and throttling of failed attempts.

Credentials come from any mix of
  --auth USER:PASS            (plain; visible in `ps`, kept for quick local use)
  --auth-file FILE            one `USER:HASH` per line; `#` comments and blank lines are ignored
  PAGED_CHAT_AUTH=...         `USER:PASS` or `USER:HASH` entries separated by newlines or `;`
Plain passwords are hashed as soon as they are read; only hashes stay in memory.

Hash format (make one with `python -m routes.security.auth USER`):
  scrypt$N$r$p$SALT$HASH           hashlib.scrypt, SALT and HASH standard base64 (16-byte salt,
                                   32-byte key); written with N=2**14, r=8, p=1
  pbkdf2_sha256$ITERATIONS$SALT$HASH   hashlib.pbkdf2_hmac('sha256'), also accepted
A value is treated as a hash only when it starts with `scrypt$` or `pbkdf2_sha256$`.

Throttling: Gradio's /login checks passwords as fast as they arrive (500 guesses in 0.9 s).
`LoginThrottle` is the backoff rule: after FREE_FAILURES failures a key must wait 1 s, then 2, 4,
... up to MAX_DELAY_S before its next attempt is even checked (429 with Retry-After). Which keys
count, and the rest of the login's defences, are routes/security/login_guard.py. Hashing goes through one
global budget (routes/security/hash_budget.py) so that attempts cannot starve generation.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
import sys
import threading
import time
from collections import OrderedDict

from routes.security.hash_budget import HashBudget

FREE_FAILURES = 5
MAX_DELAY_S = 300.0
MAX_TRACKED = 10_000  # (user, address) pairs remembered; the oldest are forgotten
SCRYPT_N, SCRYPT_R, SCRYPT_P = 2**14, 8, 1
HASH_PREFIXES = ("scrypt$", "pbkdf2_sha256$")


# ---- hashes ---------------------------------------------------------------------------------
def hash_password(password: str, *, salt: bytes | None = None) -> str:
    if not isinstance(password, str) or not password:
        raise ValueError("password must be a non-empty string")
    salt = salt if salt is not None else secrets.token_bytes(16)
    key = hashlib.scrypt(password.encode(), salt=salt, n=SCRYPT_N, r=SCRYPT_R, p=SCRYPT_P, dklen=32)
    b64 = lambda b: base64.b64encode(b).decode()
    return f"scrypt${SCRYPT_N}${SCRYPT_R}${SCRYPT_P}${b64(salt)}${b64(key)}"


def check_hash_format(encoded: str) -> None:
    """Raise ValueError unless `encoded` is a hash this module can verify."""
    _parse_hash(encoded)


def _parse_hash(encoded: str):
    parts = encoded.split("$")
    try:
        if parts[0] == "scrypt" and len(parts) == 6:
            n, r, p = (int(x) for x in parts[1:4])
            if n < 2 or n & (n - 1) or not 1 <= r <= 64 or not 1 <= p <= 16:
                raise ValueError
            return (
                "scrypt",
                (n, r, p),
                base64.b64decode(parts[4], validate=True),
                base64.b64decode(parts[5], validate=True),
            )
        if parts[0] == "pbkdf2_sha256" and len(parts) == 4:
            iterations = int(parts[1])
            if iterations < 1:
                raise ValueError
            return (
                "pbkdf2_sha256",
                (iterations,),
                base64.b64decode(parts[2], validate=True),
                base64.b64decode(parts[3], validate=True),
            )
    except (ValueError, TypeError):
        pass
    raise ValueError(
        "not a valid password hash (expected scrypt$N$r$p$SALT$HASH or "
        "pbkdf2_sha256$ITERATIONS$SALT$HASH; make one with `python -m routes.security.auth USER`)"
    )


def verify_password(password: str, encoded: str) -> bool:
    kind, params, salt, expected = _parse_hash(encoded)
    if kind == "scrypt":
        n, r, p = params
        got = hashlib.scrypt(
            password.encode(),
            salt=salt,
            n=n,
            r=r,
            p=p,
            dklen=len(expected),
            maxmem=256 * n * r * p + (1 << 20),
        )
    else:
        got = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, params[0], dklen=len(expected))
    return hmac.compare_digest(got, expected)


# ---- where credentials come from ---------------------------------------------------------------
def _split_entry(entry: str, where: str) -> tuple[str, str]:
    user, sep, secret = entry.strip().partition(":")
    user = user.strip()
    if not sep or not user or not secret:
        raise ValueError(f"{where}: expected USER:SECRET, got {entry.strip()[:40]!r}")
    return user, secret


def parse_auth_file_text(text: str, source: str = "auth file") -> dict[str, str]:
    users: dict[str, str] = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        user, secret = _split_entry(line, f"{source} line {lineno}")
        try:
            check_hash_format(secret.strip())
        except ValueError as e:
            raise ValueError(f"{source} line {lineno} ({user}): {e}") from None
        users[user] = secret.strip()
    return users


def load_auth_file(path: str) -> dict[str, str]:
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if os.name == "posix" and os.stat(path).st_mode & 0o077:
        print(f"WARNING: {path} is readable by other users; `chmod 600 {path}`", file=sys.stderr)
    return parse_auth_file_text(text, path)


def parse_env_auth(value: str) -> dict[str, str]:
    users: dict[str, str] = {}
    for k, entry in enumerate(value.replace(";", "\n").splitlines(), 1):
        if not entry.strip():
            continue
        user, secret = _split_entry(entry, f"PAGED_CHAT_AUTH entry {k}")
        users[user] = secret if secret.startswith(HASH_PREFIXES) else hash_password(secret)
        check_hash_format(users[user])
    return users


def load_credentials(
    pairs: list[tuple[str, str]] | None = None,
    auth_file: str | None = None,
    env_value: str | None = None,
) -> "Credentials | None":
    """All sources merged (later ones win for the same user); None when no user is configured."""
    users: dict[str, str] = {}
    for user, password in pairs or []:
        users[user] = hash_password(password)
    if auth_file:
        users.update(load_auth_file(auth_file))
    if env_value:
        users.update(parse_env_auth(env_value))
    return Credentials(users) if users else None


class Credentials:
    """Hashed users. `gradio_auth` is the async check to hand to Gradio's `auth=`."""

    def __init__(
        self,
        users: dict[str, str],
        throttle: "LoginThrottle | None" = None,
        budget: HashBudget | None = None,
    ):
        for encoded in users.values():
            check_hash_format(encoded)
        self.users = dict(users)
        self.throttle = throttle or LoginThrottle()
        self.budget = budget or HashBudget()
        self._dummy = hash_password(secrets.token_urlsafe(12))

    def verify(self, username: str, password: str) -> bool:
        """Constant work whether or not the user exists (no user-name probing by timing)."""
        encoded = self.users.get(username)
        ok = verify_password(password if isinstance(password, str) else "", encoded or self._dummy)
        return ok and encoded is not None

    @property
    def gradio_auth(self):
        """Every check takes the global hashing slot (routes/security/hash_budget.py); an unknown name waits
        there as long as a hash takes but hashes nothing (#29.7)."""

        async def check(username: str, password: str) -> bool:
            known = isinstance(username, str) and username in self.users
            ok = await self.budget.run(lambda: self.verify(username, password), hash_it=known)
            return bool(ok)

        check.throttle = self.throttle
        check.budget = self.budget
        check.credentials = self
        return check


# ---- throttling -------------------------------------------------------------------------------
class LoginThrottle:
    """Exponential backoff per (user, address) after FREE_FAILURES failed attempts.
    forget_after_s: a key idle that long starts from zero again (None: only a success clears it)."""

    def __init__(
        self,
        free_failures: int = FREE_FAILURES,
        max_delay_s: float = MAX_DELAY_S,
        clock=time.monotonic,
        forget_after_s: float | None = None,
    ):
        self.free_failures, self.max_delay_s, self.clock = free_failures, max_delay_s, clock
        self.forget_after_s = forget_after_s
        self._failures: OrderedDict[tuple[str, str], tuple[int, float]] = OrderedDict()
        self._lock = threading.Lock()

    def _count(self, key) -> tuple[int, float]:
        count, last = self._failures.get(key, (0, 0.0))
        if self.forget_after_s is not None and count and self.clock() - last > self.forget_after_s:
            return 0, 0.0
        return count, last

    def retry_after(self, user: str, address: str) -> float:
        """Seconds this pair must still wait before an attempt is checked (0 = go ahead)."""
        with self._lock:
            count, last = self._count((user, address))
        if count < self.free_failures:
            return 0.0
        delay = min(self.max_delay_s, 2.0 ** (count - self.free_failures))
        return max(0.0, last + delay - self.clock())

    def failed(self, user: str, address: str) -> None:
        with self._lock:
            count, _ = self._count((user, address))
            self._failures.pop((user, address), None)
            self._failures[(user, address)] = (count + 1, self.clock())
            while len(self._failures) > MAX_TRACKED:
                self._failures.popitem(last=False)

    def succeeded(self, user: str, address: str) -> None:
        with self._lock:
            self._failures.pop((user, address), None)


def main(argv=None) -> int:
    """`python -m routes.security.auth USER`: ask for a password (twice) and print an auth-file line."""
    import getpass

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or ":" in args[0] or not args[0].strip():
        print(
            "usage: python -m routes.security.auth USER   (prints USER:HASH for --auth-file)",
            file=sys.stderr,
        )
        return 2
    if sys.stdin.isatty():
        password = getpass.getpass("Password: ")
        if getpass.getpass("Again: ") != password:
            print("passwords differ", file=sys.stderr)
            return 1
    else:
        password = sys.stdin.readline().rstrip("\n")
    if not password:
        print("the password must not be empty", file=sys.stderr)
        return 1
    print(f"{args[0].strip()}:{hash_password(password)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
