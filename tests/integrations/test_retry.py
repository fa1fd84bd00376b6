"""The one retry rule of the outbound clients (integrations.retry): statuses, Retry-After, and how far
a request that got no answer went, for each HTTP library the clients use."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import httpx
import pytest
import requests
from hypothesis import example, given
from hypothesis import strategies as st
from urllib3.exceptions import MaxRetryError, NewConnectionError, ReadTimeoutError

from integrations import http, http_pool, retry
from integrations.retry import MAX_RETRY_AFTER, Decision, Transport, Verdict
from integrations.whatsapp.errors import Action
from integrations.whatsapp.errors import classify as meta_classify

NOW = datetime(2026, 12, 2, 8, 0, 0, tzinfo=UTC)
R, P, OK = Verdict.RETRY, Verdict.PERMANENT, Verdict.OK


@pytest.mark.parametrize(
    ("status", "verdict"),
    [
        (200, OK),
        (201, OK),
        (204, OK),
        (299, OK),
        (100, P),
        (301, P),  # redirects are not followed: the configured URL is wrong
        (304, P),
        (400, P),
        (401, P),
        (403, P),
        (404, P),
        (409, P),
        (422, P),
        (408, R),  # request timeout: the server did not act on it
        (425, R),  # too early
        (429, R),  # throttled
        (500, R),
        (502, R),
        (503, R),
        (504, R),
        (599, R),
    ],
)
def test_statuses(status, verdict):
    assert retry.for_status(status).verdict is verdict


@pytest.mark.parametrize(
    ("header", "seconds"),
    [
        (None, None),
        ("", None),
        ("120", 120.0),
        (" 7 ", 7.0),
        ("0", 0.0),
        ("99999999999999999999999999", MAX_RETRY_AFTER),  # capped
        (str(int(MAX_RETRY_AFTER) + 1), MAX_RETRY_AFTER),
        ("-5", None),  # not delay-seconds (1*DIGIT)
        ("1.5", None),
        ("٣", None),  # a non-ASCII digit is not a DIGIT
        ("soon", None),
        ("Wed, 02 Dec 2026 08:01:30 GMT", 90.0),  # IMF-fixdate
        ("Wed Dec  2 08:02:00 2026", 120.0),  # asctime
        ("Wed, 02 Dec 2026 07:00:00 GMT", 0.0),  # in the past: now
        ("Thu, 03 Dec 2026 08:00:00 GMT", MAX_RETRY_AFTER),  # a day away: capped
    ],
)
def test_retry_after(header, seconds):
    assert retry.retry_after(header, now=NOW) == seconds


def test_a_retryable_answer_carries_its_retry_after_and_a_final_one_does_not():
    assert retry.for_status(503, retry_after_header="30") == Decision(R, 30.0)
    assert retry.for_status(429, retry_after_header="Wed, 02 Dec 2026 08:00:10 GMT", now=NOW) == Decision(
        R, 10.0
    )
    assert retry.for_status(400, retry_after_header="30") == Decision(P)
    assert retry.for_status(200, retry_after_header="30") == Decision(OK)


@pytest.mark.parametrize(
    ("transport", "idempotent", "verdict"),
    [
        (Transport.NOT_SENT, False, R),
        (Transport.NOT_SENT, True, R),
        (Transport.MAYBE_SENT, True, R),
        (Transport.MAYBE_SENT, False, Verdict.MAYBE_DELIVERED),  # never resent blindly
        (Transport.INVALID, True, P),
        (Transport.INVALID, False, P),
    ],
)
def test_no_answer(transport, idempotent, verdict):
    decision = retry.for_transport(transport, idempotent=idempotent)
    assert decision.verdict is verdict
    assert decision.delay is None


@pytest.mark.parametrize(
    ("exc", "transport"),
    [
        (http_pool.NotSent("refused"), Transport.NOT_SENT),
        (http_pool.NoAnswer("the connection closed before the whole answer"), Transport.MAYBE_SENT),
        (http_pool.AnswerTooLarge("too long"), Transport.MAYBE_SENT),
    ],
)
def test_post_pool_failures(exc, transport):
    assert retry.pool_transport(exc) is transport


def _wrapped(reason: Exception, *, by_anymail: bool = False) -> requests.ConnectionError:
    """As requests raises it: a ConnectionError around urllib3's MaxRetryError; anymail raises its
    own error (of the same requests class) from that one."""
    inner = requests.exceptions.ConnectionError(MaxRetryError(None, "/email", reason=reason))  # type: ignore[arg-type]
    if not by_anymail:
        return inner
    outer = requests.exceptions.ConnectionError("Postmark API response 0: connection refused")
    outer.__cause__ = inner
    return outer


@pytest.mark.parametrize(
    ("exc", "transport"),
    [
        (requests.exceptions.ConnectTimeout(), Transport.NOT_SENT),
        (requests.exceptions.SSLError(), Transport.NOT_SENT),
        (_wrapped(NewConnectionError(None, "refused")), Transport.NOT_SENT),  # type: ignore[arg-type]
        (_wrapped(NewConnectionError(None, "refused"), by_anymail=True), Transport.NOT_SENT),  # type: ignore[arg-type]
        (_wrapped(ReadTimeoutError(None, "/email", "read")), Transport.MAYBE_SENT),  # type: ignore[arg-type]
        (requests.exceptions.ConnectionError("connection aborted"), Transport.MAYBE_SENT),
        (requests.exceptions.ReadTimeout(), Transport.MAYBE_SENT),
        (requests.exceptions.InvalidURL(), Transport.INVALID),
        (requests.exceptions.MissingSchema(), Transport.INVALID),
    ],
)
def test_requests_failures(exc, transport):
    assert retry.requests_transport(exc) is transport


def test_the_httpx_clients_errors_say_what_the_policy_decided():
    request = httpx.Request("POST", "https://chatwoot.example/api/v1/messages")
    throttled = httpx.Response(429, headers={"Retry-After": "12"}, request=request)
    error = http.status_error("Chatwoot POST", throttled, details="slow down")
    assert (error.retryable, error.status, error.retry_after, error.details) == (True, 429, 12.0, "slow down")
    refused = http.status_error("Chatwoot POST", httpx.Response(404, request=request), details="")
    assert (refused.retryable, refused.retry_after) == (False, None)

    unanswered = http.no_answer_error("Chatwoot POST", httpx.ReadTimeout("read"), idempotent=False)
    assert (unanswered.retryable, unanswered.maybe_delivered) == (True, True)
    assert str(unanswered) == "Chatwoot POST: timed out (ReadTimeout)"
    read = http.no_answer_error("Millennium GET", httpx.ReadTimeout("read"), idempotent=True)
    assert (read.retryable, read.maybe_delivered) == (True, False)
    never_sent = http.no_answer_error("Chatwoot POST", httpx.ConnectError("refused"), idempotent=False)
    assert (never_sent.retryable, never_sent.maybe_delivered) == (True, False)
    bad_url = http.no_answer_error("Chatwoot GET", httpx.UnsupportedProtocol("ftp"), idempotent=True)
    assert (bad_url.retryable, bad_url.maybe_delivered) == (False, False)


def test_meta_codes_come_first_and_the_rest_follows_the_policy():
    assert meta_classify(code=130429, status=400) is Action.THROTTLED
    assert meta_classify(code=190, status=401) is Action.PAUSE_NUMBER  # the token is the number's
    for status in (408, 425, 429, 500, 503):
        assert meta_classify(code=None, status=status) is Action.RETRY
    for status in (400, 404, 422):
        assert meta_classify(code=None, status=status) is Action.DROP_RECIPIENT


# -- properties --------------------------------------------------------------------------------------

HEADER = st.one_of(
    st.none(),
    st.text(),
    st.from_regex(r"\A\s*[0-9]{1,40}\s*\Z"),
    st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30), timezones=st.just(UTC)).map(
        lambda d: format_datetime(d, usegmt=True)
    ),
)


@given(status=st.integers(min_value=100, max_value=999), header=HEADER)
@example(status=503, header="9" * 5000)
@example(status=429, header="Mon, 01 Jan 0001 00:00:00 GMT")
def test_any_status_and_header_give_a_decision_and_a_bounded_delay(status, header):
    decision = retry.for_status(status, retry_after_header=header, now=NOW)
    assert decision.verdict in (OK, R, P)  # an answer is never "maybe delivered"
    if decision.delay is not None:
        assert decision.verdict is R
        assert 0.0 <= decision.delay <= MAX_RETRY_AFTER
    if 200 <= status < 300:
        assert decision == Decision(OK)
    elif 400 <= status < 500 and status not in (408, 425, 429):
        assert decision == Decision(P)
    elif status >= 500 or status in (408, 425, 429):
        assert decision.verdict is R


@given(header=HEADER)
def test_retry_after_never_raises_and_stays_in_bounds(header):
    seconds = retry.retry_after(header, now=NOW)
    assert seconds is None or 0.0 <= seconds <= MAX_RETRY_AFTER


@given(seconds=st.integers(min_value=0, max_value=10**12))
def test_delay_seconds_are_obeyed_up_to_the_cap(seconds):
    assert retry.retry_after(str(seconds), now=NOW) == min(float(seconds), MAX_RETRY_AFTER)


@given(ahead=st.integers(min_value=-(10**6), max_value=10**6))
def test_an_http_date_is_the_time_until_it(ahead):
    header = format_datetime(NOW + timedelta(seconds=ahead), usegmt=True)
    assert retry.retry_after(header, now=NOW) == min(max(float(ahead), 0.0), MAX_RETRY_AFTER)
