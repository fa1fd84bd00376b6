"""Client of an HTTP handler (docs/runner-http-contract.md): /process, /process-batch, /produce.

Answers are turned into ItemOutcomes; nothing is retried here (a retried POST can run twice):
the runner decides from `retryable`, which integrations.retry sets. The contract makes `/process`
idempotent on `item_id`, so a request that went out without an answer is retryable too.
"""

from __future__ import annotations

import threading
from typing import Any

import httpx

from integrations import http, retry
from integrations.errors import IntegrationError
from integrations.runner.contract import ItemIn, ItemOutcome, ProducedPage
from integrations.text import excerpt

TIMEOUT = httpx.Timeout(connect=5.0, read=30.0, write=10.0, pool=30.0)
_clients: dict[str, httpx.Client] = {}
_clients_lock = threading.Lock()


def _client(base_url: str) -> httpx.Client:
    """One keep-alive client per endpoint per process (no TLS handshake per item)."""
    with _clients_lock:
        c = _clients.get(base_url)
        if c is None:
            c = _clients[base_url] = http.client(base_url=base_url.rstrip("/"), timeout=TIMEOUT)
        return c


def _error_text(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return excerpt(response.text)
    if isinstance(body, dict) and body.get("error"):
        return excerpt(str(body["error"]))
    return excerpt(response.text)


def _post(base_url: str, path: str, body: dict[str, Any], headers: dict[str, str]) -> httpx.Response:
    return _client(base_url).post(path, json=body, headers=headers)


def _headers(auth_header: str, auth_value: str) -> dict[str, str]:
    return {auth_header: auth_value} if auth_header and auth_value else {}


def _whole_failure(items: list[ItemIn], *, retryable: bool, error: str) -> list[ItemOutcome]:
    return [
        ItemOutcome(i.item_id, False, retryable=retryable, error=error, systemic=retryable) for i in items
    ]


def process(
    base_url: str, items: list[ItemIn], *, auth_header: str = "", auth_value: str = "", batch: bool = False
) -> list[ItemOutcome]:
    """POST /process (one item) or /process-batch (many); one outcome per item, in order."""
    headers = _headers(auth_header, auth_value)
    try:
        if batch:
            response = _post(base_url, "/process-batch", {"items": [i.as_json() for i in items]}, headers)
        else:
            response = _post(base_url, "/process", items[0].as_json(), headers)
    except httpx.HTTPError as exc:
        return _whole_failure(items, retryable=_no_answer(exc).retryable, error=_no_answer_text(exc))
    if response.status_code >= 300:
        error = f"HTTP {response.status_code}: {_error_text(response)}"
        retryable = retry.for_response(response).retryable
        if not batch and response.status_code == 422:
            body = _json(response)
            retryable = bool(body.get("retryable", False)) if isinstance(body, dict) else False
            return [ItemOutcome(items[0].item_id, False, retryable=retryable, error=error)]
        return _whole_failure(items, retryable=retryable, error=error)
    body = _json(response)
    if not batch:
        result = body.get("result") if isinstance(body, dict) else None
        return [ItemOutcome(items[0].item_id, True, result=result)]
    return _batch_outcomes(items, body)


def _no_answer(exc: httpx.HTTPError) -> retry.Decision:
    return retry.for_transport(retry.httpx_transport(exc), idempotent=True)


def _no_answer_text(exc: httpx.HTTPError) -> str:
    if isinstance(exc, httpx.TimeoutException):
        return f"timeout: {exc.__class__.__name__}"
    return f"unreachable: {exc}"


def _json(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return None


def _batch_outcomes(items: list[ItemIn], body: Any) -> list[ItemOutcome]:
    results = body.get("results") if isinstance(body, dict) else None
    if not isinstance(results, list):
        return _whole_failure(items, retryable=True, error="malformed /process-batch answer: no results list")
    by_id = {r.get("item_id"): r for r in results if isinstance(r, dict)}
    outcomes = []
    for item in items:
        r = by_id.get(item.item_id)
        if r is None:
            outcomes.append(ItemOutcome(item.item_id, False, retryable=True, error="no result for this item"))
        elif r.get("status") == "ok":
            outcomes.append(ItemOutcome(item.item_id, True, result=r.get("result")))
        else:
            outcomes.append(
                ItemOutcome(
                    item.item_id,
                    False,
                    retryable=bool(r.get("retryable", False)),
                    error=str(r.get("error") or "error")[:2000],
                )
            )
    return outcomes


def produce(
    base_url: str, body: dict[str, Any], *, auth_header: str = "", auth_value: str = ""
) -> ProducedPage:
    """POST /produce: one page of items to create; raises IntegrationError when it cannot."""
    try:
        response = _post(base_url, "/produce", body, _headers(auth_header, auth_value))
    except httpx.HTTPError as exc:
        raise IntegrationError(f"produce: {exc}", retryable=_no_answer(exc).retryable) from exc
    if response.status_code >= 300:
        decision = retry.for_response(response)
        raise IntegrationError(
            f"produce: HTTP {response.status_code}: {_error_text(response)}",
            retryable=decision.retryable,
            status=response.status_code,
            retry_after=decision.delay,
        )
    data = _json(response)
    if not isinstance(data, dict) or not isinstance(data.get("items"), list):
        raise IntegrationError("produce: malformed answer (no items list)", retryable=False)
    return ProducedPage(items=data["items"], next_cursor=data.get("next_cursor"))
