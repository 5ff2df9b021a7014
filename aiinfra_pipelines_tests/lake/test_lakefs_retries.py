"""``LakeFSLake`` against a scripted lakeFS API over real HTTP: what is retried, what is not.

The server (``http_fakes.FakeLakeFS``) answers with the status codes and JSON bodies lakeFS
uses and counts every request, so "retried N times" and "not retried" are facts observed on
the wire, not assumptions about our code.
"""

from __future__ import annotations

import logging
import random
import socket

import pytest

from aiinfra_pipelines.lake import (
    BranchExistsError,
    LakeAuthError,
    LakeFSLake,
    LakeUnavailableError,
    NotFoundError,
)
from aiinfra_pipelines.lake.retry import RetryPolicy, attempts_made, call_with_retries
from aiinfra_pipelines_tests.support.http_fakes import (
    Reply,
    commit_json,
    repository_json,
)
from aiinfra_pipelines_tests.support.lakefs_api import config_json

REPO = "/api/v1/repositories/drive-data"
SECRET = "s3cr3t-DO-NOT-LOG-9f2c"
ACCESS_KEY = "AKIA-RETRY-TESTS"


def _lake(url: str, **overrides) -> LakeFSLake:
    settings = {
        "endpoint": url,
        "access_key_id": ACCESS_KEY,
        "secret_access_key": SECRET,
        "retry_max_attempts": 4,
        "retry_initial_backoff_s": 0.01,
        "retry_max_backoff_s": 0.05,
        "connect_timeout_s": 1.0,
        # Generous: the scripted server answers at once, so no request may time out on a busy
        # runner and add a retry the exact counts below do not expect. Timeouts are provoked
        # with stalled replies, which never answer.
        "read_timeout_s": 30.0,
    }
    return LakeFSLake(**{**settings, **overrides})


def test_503s_are_retried_with_backoff_until_lakefs_answers(fake, caplog) -> None:
    fake.route(
        "GET", f"{REPO}/commits/main", Reply(503), Reply(503), then=Reply(200, commit_json("c1"))
    )
    with caplog.at_level(logging.WARNING, logger="aiinfra_pipelines.lake.retry"):
        assert _lake(fake.url).resolve_ref("main") == "c1"
    assert fake.count("GET", f"{REPO}/commits/main") == 3
    retries = [r.getMessage() for r in caplog.records if "retrying in" in r.getMessage()]
    assert len(retries) == 2 and "attempt 1/4" in retries[0] and "attempt 2/4" in retries[1]


def test_a_commit_refused_with_503_is_sent_again_and_lands(fake) -> None:
    fake.route(
        "POST",
        f"{REPO}/branches/ingest-b1/commits",
        Reply(503, headers={"Retry-After": "0"}),
        Reply(502),
        then=Reply(201, commit_json("c2", ["c1"])),
    )
    assert _lake(fake.url).commit("ingest-b1", "land batch") == "c2"
    assert fake.count("POST", f"{REPO}/branches/ingest-b1/commits") == 3


def test_persistent_5xx_gives_up_after_max_attempts_with_a_typed_error(fake) -> None:
    fake.route("GET", f"{REPO}/commits/main", then=Reply(503, {"message": "kv store down"}))
    with pytest.raises(LakeUnavailableError, match=r"503.*kv store down.*4 attempt") as caught:
        _lake(fake.url).resolve_ref("main")
    assert "lakefs://drive-data/main" in str(caught.value), "names the operation"
    assert fake.count("GET", f"{REPO}/commits/main") == 4


def test_409_conflict_is_not_retried(fake) -> None:
    fake.route("POST", f"{REPO}/branches", then=Reply(409, {"message": "branch exists"}))
    with pytest.raises(BranchExistsError, match="ingest-b1"):
        _lake(fake.url).create_branch("ingest-b1")
    assert fake.count("POST", f"{REPO}/branches") == 1


def test_404_is_not_retried(fake) -> None:
    fake.route("GET", f"{REPO}/commits/nope", then=Reply(404, {"message": "not found"}))
    fake.route("GET", "/api/v1/config", then=Reply(200, config_json()))
    fake.route("GET", REPO, then=Reply(200, repository_json()))
    fake.route("GET", f"{REPO}/refs/main/objects", then=Reply(404, {"message": "no such path"}))
    lake = _lake(fake.url)
    with pytest.raises(NotFoundError):
        lake.resolve_ref("nope")
    with pytest.raises(NotFoundError, match=r"missing\.json"):
        lake.get_object("main", "missing.json")
    assert fake.count("GET", f"{REPO}/commits/nope") == 1
    assert fake.count("GET", f"{REPO}/refs/main/objects") == 1


def test_a_post_answered_500_is_not_repeated_and_says_it_may_have_applied(fake) -> None:
    fake.route("POST", f"{REPO}/branches/main/commits", then=Reply(500, {"message": "boom"}))
    with pytest.raises(LakeUnavailableError, match="may have been applied"):
        _lake(fake.url).commit("main", "x")
    assert fake.count("POST", f"{REPO}/branches/main/commits") == 1


def test_read_timeouts_are_retried_for_reads_but_not_for_commits(fake) -> None:
    fake.route(
        "GET",
        f"{REPO}/commits/main",
        Reply(200, commit_json("slow"), stall=True),
        then=Reply(200, commit_json("c1")),
    )
    fake.route(
        "POST",
        f"{REPO}/branches/main/commits",
        then=Reply(201, commit_json("c9"), stall=True),
    )
    # A stalled reply never comes, so the timeout fires however loaded the runner is; the
    # answered retry has seconds to spare.
    lake = _lake(fake.url, read_timeout_s=3.0)
    assert lake.resolve_ref("main") == "c1"
    assert fake.count("GET", f"{REPO}/commits/main") == 2
    with pytest.raises(LakeUnavailableError, match="ReadTimeoutError"):
        lake.commit("main", "x")
    assert fake.count("POST", f"{REPO}/branches/main/commits") == 1, "outcome unknown: no retry"


def test_an_unreachable_server_is_retried_then_reported_unavailable() -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(LakeUnavailableError, match=r"unreachable after 4 attempt"):
        _lake(f"http://127.0.0.1:{port}").resolve_ref("main")


def test_auth_failure_is_typed_not_retried_and_never_shows_the_secret(fake, caplog) -> None:
    fake.route("GET", f"{REPO}/commits/main", then=Reply(401, {"message": "error authenticating"}))
    with caplog.at_level(logging.DEBUG), pytest.raises(LakeAuthError, match="401") as caught:
        _lake(fake.url).resolve_ref("main")
    assert fake.count("GET", f"{REPO}/commits/main") == 1
    chain: list[BaseException] = []
    error: BaseException | None = caught.value
    while error is not None:
        chain.append(error)
        error = error.__cause__ or error.__context__
    texts = [str(e) for e in chain] + [repr(e) for e in chain] + [caplog.text]
    assert all(SECRET not in text for text in texts)
    headers = fake.requests[0][2]
    assert headers.get("Authorization", "").startswith("Basic "), "credentials were sent"


def test_configured_retry_policy_reaches_the_transport(fake) -> None:
    fake.route("GET", f"{REPO}/commits/main", then=Reply(503))
    with pytest.raises(LakeUnavailableError, match="2 attempt"):
        _lake(fake.url, retry_max_attempts=2).resolve_ref("main")
    assert fake.count("GET", f"{REPO}/commits/main") == 2
    with pytest.raises(ValueError, match="max_attempts"):
        _lake(fake.url, retry_max_attempts=0).resolve_ref("main")


# ------------------------------------------------------------------ the policy on its own
class _Flaky(Exception):
    pass


def test_backoff_is_exponential_with_full_jitter_and_honours_retry_after() -> None:
    policy = RetryPolicy(max_attempts=5, initial_backoff_s=1.0, max_backoff_s=4.0)
    slept: list[float] = []
    calls = {"n": 0}

    def attempt() -> str:
        calls["n"] += 1
        if calls["n"] < 5:
            raise _Flaky(f"try {calls['n']}")
        return "ok"

    result = call_with_retries(
        "op",
        attempt,
        policy,
        retryable=lambda exc: isinstance(exc, _Flaky),
        retry_after=lambda exc: 3.5 if "try 1" in str(exc) else None,
        sleep=slept.append,
        rng=random.Random(7),
    )
    assert result == "ok" and calls["n"] == 5
    assert slept[0] == pytest.approx(3.5), "Retry-After beats a shorter jittered delay"
    for number, delay in enumerate(slept[1:], start=2):
        assert 0.0 <= delay <= min(4.0, 2 ** (number - 1)), (number, delay)
    draws = [policy.backoff(3, random.Random(seed)) for seed in range(200)]
    assert min(draws) < 0.5 and max(draws) > 3.5, "full jitter spans [0, cap]"


def test_non_retryable_errors_escape_at_once_and_exhaustion_is_noted() -> None:
    policy = RetryPolicy(max_attempts=3, initial_backoff_s=0.0, max_backoff_s=0.0)
    calls = {"n": 0}

    def conflict() -> None:
        calls["n"] += 1
        raise KeyError("409")

    with pytest.raises(KeyError):
        call_with_retries("op", conflict, policy, retryable=lambda e: False, sleep=lambda s: None)
    assert calls["n"] == 1

    def always() -> None:
        raise _Flaky("down")

    with pytest.raises(_Flaky) as caught:
        call_with_retries("op", always, policy, retryable=lambda e: True, sleep=lambda s: None)
    assert attempts_made(caught.value) == 3


def test_retry_settings_are_validated() -> None:
    assert RetryPolicy.from_settings({"max_attempts": 2}).max_attempts == 2
    with pytest.raises(ValueError, match="max_attemps"):
        RetryPolicy.from_settings({"max_attemps": 2})
    with pytest.raises(ValueError, match="below"):
        RetryPolicy(initial_backoff_s=5.0, max_backoff_s=1.0)
