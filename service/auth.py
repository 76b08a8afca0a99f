"""Who may call: bearer API keys for ``/v1``, a session cookie for the dashboard, CSRF tokens
for its actions.

- ``/v1/*``: ``Authorization: Bearer KEY`` with one of the configured keys (401 in the OpenAI
  shape otherwise). Without keys the service listens on loopback only (service.config) and
  every call is let in.
- The dashboard: a browser cannot send a bearer header, so ``/login`` takes a key once and sets
  a cookie (HttpOnly, SameSite=Strict) holding a digest of it, which any replica with the same
  keys accepts; the bearer header works too.
- Each dashboard form carries a CSRF token, an HMAC of the session under the service's secret
  (derived from the keys, so replicas agree; without keys a random one per process); a POST
  without the right token is refused (403), on top of the SameSite cookie.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

from starlette.requests import Request

from service.errors import ApiError

SESSION_COOKIE = "radixq_session"


class Auth:
    def __init__(self, api_keys: tuple[str, ...]) -> None:
        self.keys = api_keys
        self._sessions = {self._session_of(key) for key in api_keys}
        seed = "\n".join(sorted(api_keys)).encode() if api_keys else secrets.token_bytes(32)
        self._secret = hashlib.sha256(b"radixq-serve-csrf\n" + seed).digest()

    @property
    def required(self) -> bool:
        return bool(self.keys)

    @staticmethod
    def _session_of(key: str) -> str:
        return hashlib.sha256(b"radixq-serve-session\n" + key.encode()).hexdigest()

    def key_ok(self, key: str) -> bool:
        return any(hmac.compare_digest(key.encode(), known.encode()) for known in self.keys)

    def check_api(self, request: Request) -> None:
        """ApiError 401 unless the request carries a valid bearer key (or no key is configured)."""
        if not self.required:
            return
        header = request.headers.get("authorization", "")
        scheme, _, key = header.partition(" ")
        if not header or scheme.lower() != "bearer" or not key.strip():
            raise ApiError(
                401,
                "You didn't provide an API key. You need to provide your API key in an Authorization "
                "header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).",
            )
        if not self.key_ok(key.strip()):
            raise ApiError(401, "Incorrect API key provided.", code="invalid_api_key")

    def session(self, request: Request) -> str | None:
        """The dashboard session of a request: "open" without keys, the cookie's (or a bearer
        key's) session digest when valid, else None."""
        if not self.required:
            return "open"
        cookie = request.cookies.get(SESSION_COOKIE, "")
        if cookie and any(hmac.compare_digest(cookie, known) for known in self._sessions):
            return cookie
        scheme, _, key = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and self.key_ok(key.strip()):
            return self._session_of(key.strip())
        return None

    def login_cookie(self, key: str) -> str | None:
        return self._session_of(key) if self.key_ok(key) else None

    def csrf_token(self, session: str) -> str:
        return hmac.new(self._secret, session.encode(), hashlib.sha256).hexdigest()

    def csrf_ok(self, session: str, token: str) -> bool:
        return hmac.compare_digest(self.csrf_token(session), token)
