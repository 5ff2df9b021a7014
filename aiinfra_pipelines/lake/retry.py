"""Retries for calls to remote lake services: exponential backoff with full jitter.

One policy serves both remote paths of ``LakeFSLake`` (the lakeFS API over urllib3 and the S3
gateway over botocore), so an operator tunes retries in one place (``resources/environments/
<env>.yaml`` → ``lake.retry``) and every retry is logged the same way.

What is retried is decided per *request*, never per port method, so a retry never re-runs
multi-step logic (a merge's conflict analysis, a commit's precondition check):

* a connection that could not be established (refused, DNS, connect timeout): the request was
  never sent, so any method is retried;
* a 5xx answer: retried for idempotent methods (GET, HEAD, PUT, DELETE, OPTIONS); for POST
  (lakeFS commits, merges, branch and tag creation, multipart completion) only 502 and 503,
  where the server or its gateway says the request was not processed — a 500 or 504 on a POST
  may have been applied, and repeating it would turn a success into a confusing 4xx;
* a timeout or broken connection *after* the request was sent: idempotent methods only.

4xx answers are never retried: they are the caller's or the configuration's problem and come
back at once as typed ``aiinfra_pipelines.lake.errors`` (including 429: lakeFS uses it for
branch-lock contention, which the port reports as ``ConcurrentUpdateError``).

Backoff is "full jitter" (``uniform(0, min(cap, base * 2**n))``), which spreads the retries of
many pods hitting one recovering server instead of synchronising them; a server's
``Retry-After`` is honoured (up to the cap).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any, TypeVar

logger = logging.getLogger(__name__)

T = TypeVar("T")

IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS"})
# 5xx statuses that say "not processed" strongly enough to repeat a non-idempotent request.
UNPROCESSED_STATUSES = frozenset({502, 503})


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently a failed request is repeated.

    ``max_attempts`` counts the first try (1 = never retry). The n-th retry waits a uniformly
    random time in ``[0, min(max_backoff_s, initial_backoff_s * 2**(n-1))]``.
    """

    max_attempts: int = 5
    initial_backoff_s: float = 0.5
    max_backoff_s: float = 20.0

    def __post_init__(self) -> None:
        if int(self.max_attempts) != self.max_attempts or self.max_attempts < 1:
            raise ValueError(f"retry max_attempts must be an integer >= 1, got {self.max_attempts}")
        if self.initial_backoff_s < 0 or self.max_backoff_s < 0:
            raise ValueError("retry backoff times must be >= 0")
        if self.max_backoff_s < self.initial_backoff_s:
            raise ValueError(
                f"retry max_backoff_s ({self.max_backoff_s}) is below initial_backoff_s "
                f"({self.initial_backoff_s})"
            )

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any] | None) -> RetryPolicy:
        """A policy from a configuration mapping; an unknown key is a typo, so it is refused."""
        settings = dict(settings or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(settings) - known)
        if unknown:
            raise ValueError(
                f"unknown retry setting(s) {unknown}; expected some of {sorted(known)}"
            )
        return cls(**settings)

    def backoff(self, retry_number: int, rng: random.Random | None = None) -> float:
        """Seconds to wait before retry ``retry_number`` (1-based), full jitter."""
        ceiling = min(self.max_backoff_s, self.initial_backoff_s * 2 ** (retry_number - 1))
        return (rng or random).uniform(0.0, ceiling)


def status_is_retryable(status: int | None, method: str) -> bool:
    """Whether an HTTP answer with ``status`` to ``method`` may be repeated (see module doc)."""
    if status is None or not 500 <= status <= 599:
        return False
    return method.upper() in IDEMPOTENT_METHODS or status in UNPROCESSED_STATUSES


def call_with_retries(
    operation: str,
    attempt: Callable[[], T],
    policy: RetryPolicy,
    *,
    retryable: Callable[[BaseException], bool],
    retry_after: Callable[[BaseException], float | None] = lambda _exc: None,
    sleep: Callable[[float], None] = time.sleep,
    rng: random.Random | None = None,
) -> T:
    """``attempt()``, repeated per ``policy`` while it raises something ``retryable``.

    The last exception propagates unchanged once attempts are exhausted or the failure is not
    retryable; it carries a note with the attempt count (shown in tracebacks), and the caller
    translates it into a lake error. Each retry is logged at WARNING with ``operation`` and the
    failure's type and text — callers must keep secrets out of both (URLs and SDK messages
    here carry none).
    """
    for number in range(1, policy.max_attempts + 1):
        try:
            return attempt()
        except Exception as exc:
            if not retryable(exc):
                raise
            if number >= policy.max_attempts:
                exc.add_note(f"{operation}: gave up after {number} attempt(s)")
                raise
            delay = policy.backoff(number, rng)
            hinted = retry_after(exc)
            if hinted is not None:
                delay = min(max(delay, hinted), policy.max_backoff_s)
            logger.warning(
                "%s: attempt %d/%d failed (%s: %s); retrying in %.2fs",
                operation,
                number,
                policy.max_attempts,
                type(exc).__name__,
                str(exc)[:300],
                delay,
            )
            sleep(delay)
    raise AssertionError("unreachable: the loop returns or raises")  # pragma: no cover


def attempts_made(exc: BaseException) -> int | None:
    """How many attempts ``call_with_retries`` made before giving up on ``exc`` (or None)."""
    for note in getattr(exc, "__notes__", ()):
        marker = "gave up after "
        if marker in note:
            try:
                return int(note.split(marker, 1)[1].split(" ", 1)[0])
            except ValueError:
                return None
    return None
