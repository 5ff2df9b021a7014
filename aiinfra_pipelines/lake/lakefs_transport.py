"""The HTTP transport under the lakeFS SDK: timeouts and ``RetryPolicy`` on every request.

The ``lakefs`` wrapper and ``lakefs-sdk`` send everything through one ``urllib3.PoolManager``
(``ApiClient.rest_client.pool_manager``) — API calls, raw uploads and presigned transfers
alike. Replacing that pool with ``RetryingPoolManager`` gives every request the same retry
rules (``aiinfra_pipelines.lake.retry``) and a finite timeout, without patching the SDK's
call sites. The SDK's own default (urllib3's ``Retry(3)``, no backoff, no timeout) is
switched off so retries never multiply.
"""

from __future__ import annotations

import json
import ssl
from typing import Any
from urllib.parse import urlsplit

import urllib3
from urllib3.exceptions import (
    ConnectTimeoutError,
    MaxRetryError,
    NewConnectionError,
    ProtocolError,
    ReadTimeoutError,
)

from aiinfra_pipelines.lake.retry import (
    IDEMPOTENT_METHODS,
    RetryPolicy,
    call_with_retries,
    status_is_retryable,
)

# urllib3 itself retries nothing (we do), but still follows redirects: presigned reads are
# 302s to the object store. Connection errors surface as MaxRetryError(reason=...), read errors
# as themselves.
_URLLIB3_RETRIES = urllib3.Retry(
    total=None, connect=0, read=False, status=0, other=0, redirect=5, raise_on_status=False
)


class ServerError(Exception):
    """A 5xx answer that was retried as far as the policy (and the method) allows.

    Not a ``LakeError`` on purpose: it travels up through the SDK untouched and the adapter
    translates it with the context of the port operation.
    """

    def __init__(self, method: str, path: str, status: int, message: str, attempts: int) -> None:
        self.method = method
        self.path = path
        self.status = status
        self.message = message
        self.attempts = attempts
        super().__init__(f"{method} {path}: HTTP {status}: {message}")


def _server_message(response: urllib3.BaseHTTPResponse) -> str:
    body = response.data or b""
    try:
        parsed = json.loads(body)
        if isinstance(parsed, dict) and parsed.get("message"):
            return str(parsed["message"])[:300]
    except (ValueError, UnicodeDecodeError):
        pass
    text = body[:300].decode("utf-8", "replace").strip()
    return text or (response.reason or "server error")


def _retry_after(exc: BaseException) -> float | None:
    if isinstance(exc, _RetryableResponse):
        value = exc.response.headers.get("Retry-After")
        if value:
            try:
                return max(0.0, float(value))
            except ValueError:
                return None
    return None


class _RetryableResponse(Exception):
    def __init__(self, response: urllib3.BaseHTTPResponse) -> None:
        super().__init__(f"HTTP {response.status}")
        self.response = response


def transport_error_is_retryable(exc: BaseException, method: str) -> bool:
    """Whether a urllib3 failure of a ``method`` request may be repeated (see ``retry``)."""
    if isinstance(exc, MaxRetryError) and exc.reason is not None:
        exc = exc.reason
    if isinstance(exc, NewConnectionError | ConnectTimeoutError):
        return True  # never reached the server
    if isinstance(exc, ReadTimeoutError | ProtocolError):
        return method.upper() in IDEMPOTENT_METHODS
    return False


class RetryingPoolManager(urllib3.PoolManager):
    """A ``PoolManager`` that applies ``policy`` and ``timeout`` to every request it sends."""

    def __init__(self, policy: RetryPolicy, timeout: urllib3.Timeout, **pool_kwargs: Any) -> None:
        super().__init__(retries=_URLLIB3_RETRIES, timeout=timeout, **pool_kwargs)
        self.policy = policy

    def urlopen(self, method: str, url: str, redirect: bool = True, **kw: Any):  # type: ignore[override]
        if kw.get("timeout") is None:
            kw.pop("timeout", None)  # the SDK passes None = "no timeout": use ours instead
        body = kw.get("body")
        start = body.tell() if hasattr(body, "seek") and hasattr(body, "tell") else None
        path = urlsplit(url).path  # never the query: it may carry presigned credentials
        method = method.upper()

        def attempt() -> urllib3.BaseHTTPResponse:
            if start is not None:
                body.seek(start)  # a retried upload re-sends the whole stream
            response = super(RetryingPoolManager, self).urlopen(
                method, url, redirect=redirect, **kw
            )
            if 500 <= response.status <= 599:
                response.data  # noqa: B018 - read (and cache) the body, release the connection
                raise _RetryableResponse(response)
            return response

        def retryable(exc: BaseException) -> bool:
            if isinstance(exc, _RetryableResponse):
                return status_is_retryable(exc.response.status, method)
            return transport_error_is_retryable(exc, method)

        attempts = 0

        def counted() -> urllib3.BaseHTTPResponse:
            nonlocal attempts
            attempts += 1
            return attempt()

        try:
            return call_with_retries(
                f"lakeFS {method} {path}",
                counted,
                self.policy,
                retryable=retryable,
                retry_after=_retry_after,
            )
        except _RetryableResponse as failed:
            response = failed.response
            raise ServerError(
                method, path, response.status, _server_message(response), attempts
            ) from None


def install(api_client: Any, policy: RetryPolicy, connect_timeout_s: float, read_timeout_s: float):
    """Swap ``api_client.rest_client.pool_manager`` (a ``lakefs_sdk.ApiClient``) for a
    ``RetryingPoolManager`` built with the same TLS settings."""
    configuration = api_client.configuration
    if configuration.proxy:
        raise ValueError("LakeFSLake does not support an HTTP proxy for the lakeFS API")
    pool_kwargs: dict[str, Any] = {
        "num_pools": 4,
        "maxsize": configuration.connection_pool_maxsize or 4,
        "cert_reqs": ssl.CERT_REQUIRED if configuration.verify_ssl else ssl.CERT_NONE,
        "ca_certs": configuration.ssl_ca_cert,
        "cert_file": configuration.cert_file,
        "key_file": configuration.key_file,
    }
    if configuration.assert_hostname is not None:
        pool_kwargs["assert_hostname"] = configuration.assert_hostname
    if configuration.tls_server_name:
        pool_kwargs["server_hostname"] = configuration.tls_server_name
    if configuration.socket_options is not None:
        pool_kwargs["socket_options"] = configuration.socket_options
    old = api_client.rest_client.pool_manager
    api_client.rest_client.pool_manager = RetryingPoolManager(
        policy, urllib3.Timeout(connect=connect_timeout_s, read=read_timeout_s), **pool_kwargs
    )
    old.clear()
