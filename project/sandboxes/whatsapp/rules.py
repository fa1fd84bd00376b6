"""The sandbox's test controls: scripted failure rules and its configuration, checked as posted."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from project.sandboxes.whatsapp.graph_errors import GraphError
from project.sandboxes.whatsapp.validation import TO_RE

STATUS_SEQUENCE = ("sent", "delivered", "read")

DEFAULT_STATUS_DELAYS_MS: tuple[float, ...] = (20.0, 40.0, 60.0)


@dataclass
class Rule:
    """A scripted failure for one recipient (``to`` digits) or everyone (``"*"``)."""

    to: str
    code: int | None = None
    http_status: int | None = None
    times: int | None = None
    webhook_failure_code: int | None = None
    error_subcode: int | None = None
    retry_after: int | None = None  # seconds, sent as Retry-After with the error
    # Accepted and recorded, then the connection is dropped before any answer (broken after the request).
    hang_up: bool = False

    @property
    def rejects(self) -> bool:
        """True when the send itself fails; False when it is accepted and fails in the webhook."""
        return self.code is not None or self.http_status is not None

    def error(self) -> GraphError:
        """The Graph error a rejecting rule answers with."""
        code = self.code
        if code is None:
            status = self.http_status or 500
            code = 2 if status >= 500 else {401: 190, 429: 130429}.get(status, 100)
        return GraphError(
            code, http_status=self.http_status, error_subcode=self.error_subcode, retry_after=self.retry_after
        )

    @classmethod
    def parse(cls, data: Mapping[str, Any]) -> Rule:
        """Build a rule from its JSON form; raises ValueError naming the bad field."""
        unknown = set(data) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown rule fields: {sorted(unknown)}")
        hang_up = data.get("hang_up", False)
        if not isinstance(hang_up, bool):
            raise ValueError('"hang_up" must be true or false')
        to = data.get("to")
        if not isinstance(to, str) or not (to == "*" or TO_RE.fullmatch(to)):
            raise ValueError('"to" must be "*" or a phone number of 8-15 digits')
        values: dict[str, int | None] = {}
        for name in ("code", "http_status", "times", "webhook_failure_code", "error_subcode", "retry_after"):
            value = data.get(name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
                raise ValueError(f'"{name}" must be an integer or null')
            values[name] = value
        status, times = values["http_status"], values["times"]
        if status is not None and not 400 <= status <= 599:
            raise ValueError('"http_status" must be an HTTP error status (400-599)')
        if times is not None and times < 1:
            raise ValueError('"times" must be 1 or more, or null for every send')
        if values["retry_after"] is not None and values["retry_after"] < 0:
            raise ValueError('"retry_after" must be 0 or more seconds')
        scripted = (values["code"], status, values["webhook_failure_code"])
        if all(value is None for value in scripted) and not hang_up:
            raise ValueError('a rule needs "code", "http_status", "webhook_failure_code" or "hang_up"')
        return cls(to=to.lstrip("+"), hang_up=hang_up, **values)


@dataclass
class SandboxConfig:
    """What ``POST /_sandbox/config`` and :meth:`SandboxServer.configure` can change."""

    latency_ms: float = 0.0
    drop_ninth_digit: bool = False
    webhook_url: str | None = None
    app_secret: str | None = None
    status_delays_ms: tuple[float, ...] = DEFAULT_STATUS_DELAYS_MS
    waba_id: str = "102290129340398"
    display_phone_number: str = "5511940000000"

    def update(self, changes: Mapping[str, Any]) -> None:
        """Apply ``changes`` all or nothing; raises ValueError naming the bad key."""
        new = dict(asdict(self))
        for key, value in changes.items():
            if key not in new:
                raise ValueError(f"unknown config key {key!r}")
            new[key] = _check_config_value(key, value)
        for key, value in new.items():
            setattr(self, key, value)

    def public(self) -> dict[str, Any]:
        """The configuration as JSON, with the app secret masked."""
        data = asdict(self)
        data["status_delays_ms"] = list(self.status_delays_ms)
        data["app_secret"] = "********" if self.app_secret else None
        return data


def _check_config_value(key: str, value: Any) -> Any:
    """Return ``value`` normalised for config ``key``; raises ValueError if it has the wrong type."""
    check = _CONFIG_CHECKS.get(key)
    if check is not None:
        return check(value)
    if not isinstance(value, str) or not value:
        raise ValueError(f"{key} must be a non-empty string")
    return value


def _latency_ms(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ValueError("latency_ms must be a number >= 0")
    return float(value)


def _drop_ninth_digit(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError("drop_ninth_digit must be true or false")
    return value


def _status_delays_ms(value: Any) -> tuple[float, ...]:
    if not isinstance(value, list | tuple) or len(value) > len(STATUS_SEQUENCE):
        raise ValueError("status_delays_ms must be a list of at most 3 delays (sent, delivered, read)")
    if any(isinstance(v, bool) or not isinstance(v, int | float) or v < 0 for v in value):
        raise ValueError("status_delays_ms must hold numbers >= 0")
    return tuple(float(v) for v in value)


def _webhook_url(value: Any) -> str | None:
    if value is not None and not (isinstance(value, str) and value.startswith(("http://", "https://"))):
        raise ValueError("webhook_url must be an http(s) URL or null")
    return value


def _app_secret(value: Any) -> str | None:
    if value is not None and not (isinstance(value, str) and value):
        raise ValueError("app_secret must be a non-empty string or null")
    return value


# The config keys that are not a non-empty string, and how each is checked.
_CONFIG_CHECKS: dict[str, Callable[[Any], Any]] = {
    "latency_ms": _latency_ms,
    "drop_ninth_digit": _drop_ninth_digit,
    "status_delays_ms": _status_delays_ms,
    "webhook_url": _webhook_url,
    "app_secret": _app_secret,
}
