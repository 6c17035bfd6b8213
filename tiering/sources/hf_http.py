"""huggingface_hub's HTTP client as weightd's Hub imports use it (``tiering.sources.hf``).

huggingface_hub shares one ``httpx2.Client`` per process, made by a factory; :func:`bound_requests`
installs weightd's (``set_client_factory``, so the client huggingface_hub drops and makes again after a
connection error keeps these rules; changing the first client's attributes would not survive that):

- every request gives up after CONNECT_TIMEOUT_S to connect and READ_TIMEOUT_S between two reads
  (huggingface_hub's own client waits for ever: a Hub that accepts a connection and never answers
  would hold an import, and its repository's lock, for good);
- a GET or HEAD answered 429 (rate-limited) or 500/502/503/504 is sent again, at most RETRIES times,
  after the wait the Hub asks for (``Retry-After``, else the ``RateLimit`` header's ``t=``), else 1, 2,
  4 s; a wait longer than MAX_WAIT_S is not waited for. Then :class:`RetriesSpent` is raised, which
  ``hf._translate`` makes a one-line error saying when to try again. Left to itself huggingface_hub
  sleeps whatever ``Retry-After`` says, up to six times, for some requests (an hour each, if the
  Hub says so), 23 s of back-off for others, and none at all for ``model_info``.

Each wait is told to the ``note`` given to :func:`bound_requests` (the URL without its query and
without any ``user:password@``; a token is a header, never in a URL).
"""

from __future__ import annotations

import re
import time
from typing import Any, Callable, Mapping
from urllib.parse import urlsplit, urlunsplit

CONNECT_TIMEOUT_S, READ_TIMEOUT_S = 10.0, 60.0
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
RETRIES = 3
MAX_WAIT_S = 30.0
_RATELIMIT_T = re.compile(r";\s*t\s*=\s*([0-9]{1,9})\b")
_SECONDS = re.compile(r"[0-9]{1,9}")   # (a wait over 31 years is no wait: not read)

_note: list[Callable[[str], None]] = [lambda line: None]
_installed = [False]


class RetriesSpent(Exception):
    """A GET or HEAD the Hub kept refusing (429 or 5xx): what it last answered, the wait it asked for
    (seconds, or None), and how many times it was sent."""

    def __init__(self, status: int, retry_after_s: float | None, tries: int, url: str) -> None:
        self.status, self.retry_after_s, self.tries, self.url = status, retry_after_s, tries, url
        super().__init__(f"{url}: {status} after {tries} tries")


def asked_wait(headers: Mapping[str, str]) -> float | None:
    """The seconds a reply asks a client to wait: ``Retry-After: N`` (an HTTP date is not read), else
    the IETF ``RateLimit: "api";r=0;t=N`` huggingface.co sends; None when it asks nothing."""
    value = (headers.get("retry-after") or "").strip()
    if _SECONDS.fullmatch(value):   # (ASCII digits only: str.isdigit takes "²", which float() refuses)
        return float(value)
    m = _RATELIMIT_T.search(headers.get("ratelimit") or "")
    return float(m.group(1)) if m else None


def shown_url(url: str) -> str:
    """``url`` as a message may show it: no query, no ``user:password@``."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2], query="", fragment=""))


def _patient_client(hooks: Mapping[str, Any]) -> Any:
    import httpx2

    class PatientClient(httpx2.Client):
        """huggingface_hub's client with the retries of this module's docstring."""

        def send(self, request: Any, **kw: Any) -> Any:
            tries = 0
            while True:
                response = super().send(request, **kw)
                tries += 1
                if request.method not in ("GET", "HEAD") or response.status_code not in RETRY_STATUSES:
                    return response
                wait = asked_wait(response.headers)
                response.close()
                if tries > RETRIES or (wait is not None and wait > MAX_WAIT_S):
                    raise RetriesSpent(response.status_code, wait, tries, shown_url(str(request.url)))
                delay = wait if wait is not None else float(2 ** (tries - 1))
                _note[0](f"{shown_url(str(request.url))}: the Hub answered {response.status_code}; trying again in "
                         f"{delay:g} s ({tries}/{RETRIES})")
                time.sleep(delay)

    return PatientClient(event_hooks=dict(hooks), follow_redirects=True,
                         timeout=httpx2.Timeout(READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S))


def bound_requests(note: Callable[[str], None] = lambda line: None) -> None:
    """Install this module's client factory in huggingface_hub (once per process; ``note`` is the
    latest caller's). The client keeps the event hooks of huggingface_hub's own (offline mode, request
    ids) and its proxy settings from the environment."""
    _note[0] = note
    if _installed[0]:
        return
    from huggingface_hub import get_session, set_client_factory
    hooks = get_session().event_hooks
    set_client_factory(lambda: _patient_client(hooks))
    _installed[0] = True


__all__ = ["CONNECT_TIMEOUT_S", "MAX_WAIT_S", "READ_TIMEOUT_S", "RETRIES", "RETRY_STATUSES", "RetriesSpent",
           "asked_wait", "bound_requests", "shown_url"]
