"""The error every provider client raises: the job decides what to do with it."""

from __future__ import annotations


class IntegrationError(Exception):
    """A provider call that did not succeed.

    retryable: the same call may succeed later (timeouts, 5xx, throttling);
    code: the provider's own error code (Meta's Graph code, an SMTP reply code...);
    status: the HTTP status, when there was one;
    retry_after: seconds the provider asked to wait first (Retry-After, integrations.retry), if any;
    maybe_delivered: no answer came back to a request that went out: it may have taken effect, so a
    resend may act twice (integrations.retry.Verdict.MAYBE_DELIVERED).
    """

    def __init__(
        self,
        message: str,
        *,
        retryable: bool,
        code: int | None = None,
        status: int | None = None,
        details: str = "",
        retry_after: float | None = None,
        maybe_delivered: bool = False,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.retryable = retryable
        self.code = code
        self.status = status
        self.details = details
        self.retry_after = retry_after
        self.maybe_delivered = maybe_delivered

    def __str__(self) -> str:
        parts = [self.message]
        if self.code is not None:
            parts.insert(0, f"[{self.code}]")
        return " ".join(parts)
