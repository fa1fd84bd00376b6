"""A flow's JSON, validated strictly: every key known, every value of its type, extra keys refused.

`flow_parse(data)` returns the cleaned definition or raises FlowSchemaError naming the path of the
first problem ("steps[2].minutes: expected an integer >= 0"). docs/flows.md lists every option.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Any

from campaigns.models import Segment
from campaigns.variables import VARIABLE_SOURCES


class FlowSchemaError(ValueError):
    """A flow definition that is not valid; the message names the offending path."""


TRIGGER_TYPES = (
    "sale",
    "customer_created",
    "date",
    "no_purchase",
    "segment_entered",
    "whatsapp_reply",
    "link_clicked",
    "survey_answered",
)
STEP_TYPES = ("wait", "send_whatsapp", "send_email", "condition", "split", "handoff", "runner")
CONDITIONS = ("purchased_since_entry", "in_segment", "consent", "replied")
EXIT_EVENTS = ("sale", "whatsapp_reply", "link_clicked", "survey_answered", "segment_entered")
SEND_STEPS = ("send_whatsapp", "send_email")
_TIME = re.compile(r"^([01]\d|2[0-3]):[0-5]\d$")

# Per trigger type: its keys besides "type", each with its checker.
_TRIGGER_KEYS: dict[str, dict[str, str]] = {
    "sale": {"min_total": "decimal", "store": "store"},
    "customer_created": {},
    "date": {"field": "date_field", "offset_days": "int", "at": "time"},
    "no_purchase": {"days": "positive", "at": "time"},
    "segment_entered": {"segment": "segment"},
    "whatsapp_reply": {"keywords": "words"},
    "link_clicked": {"campaign": "positive"},
    "survey_answered": {"max_score": "score"},
}
_REQUIRED_TRIGGER: dict[str, tuple[str, ...]] = {"no_purchase": ("days",), "segment_entered": ("segment",)}
_STEP_KEYS: dict[str, dict[str, str]] = {
    "wait": {"minutes": "nonnegative", "hours": "nonnegative", "days": "nonnegative", "at": "time"},
    "send_whatsapp": {
        "template": "text",
        "language": "text",
        "variables": "variables",
        "category": "category",
        "header_image_url": "text",
    },
    "send_email": {"subject": "text", "body": "text", "body_format": "body_format"},
    "condition": {"if": "condition", "segment": "segment", "then": "then"},
    "split": {"branches": "branches"},
    "handoff": {"note": "text", "assignee_id": "positive", "team_id": "positive"},
    "runner": {"integration": "text", "handler": "text"},
}
_REQUIRED_STEP: dict[str, tuple[str, ...]] = {
    "send_whatsapp": ("template",),
    "send_email": ("subject", "body"),
    "condition": ("if", "then"),
    "split": ("branches",),
    "runner": ("integration", "handler"),
}
_TOP_KEYS = ("key", "name", "trigger", "reentry", "exit_on", "steps", "transactional")


def _fail(path: str, problem: str) -> FlowSchemaError:
    return FlowSchemaError(f"{path}: {problem}")


def _int(path: str, value: Any, low: int | None = None, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(path, "expected an integer")
    if (low is not None and value < low) or (high is not None and value > high):
        raise _fail(path, f"expected an integer between {low} and {high if high is not None else '∞'}")
    return value


def _text(path: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise _fail(path, "expected a non-empty string")
    return value


def _decimal(path: str, value: Any) -> str:
    try:
        amount = Decimal(str(value))
    except InvalidOperation:
        raise _fail(path, 'expected an amount such as "100.00"') from None
    if isinstance(value, bool) or not amount.is_finite() or amount < 0:
        raise _fail(path, "expected an amount >= 0")
    return str(amount)


def _choice(path: str, value: Any, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise _fail(path, f"expected one of {', '.join(choices)}")
    return str(value)


def _branches(path: str, value: Any) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not value:
        raise _fail(path, "expected a non-empty list of branches")
    out: list[dict[str, Any]] = []
    names: set[str] = set()
    for i, branch in enumerate(value):
        at = f"{path}[{i}]"
        _keys(at, branch, ("name", "percent", "holdout"))
        name = _text(f"{at}.name", branch.get("name"))
        if name in names:
            raise _fail(f"{at}.name", f"branch {name!r} named twice")
        names.add(name)
        holdout = branch.get("holdout", False)
        if not isinstance(holdout, bool):
            raise _fail(f"{at}.holdout", "expected true or false")
        out.append(
            {
                "name": name,
                "percent": _int(f"{at}.percent", branch.get("percent"), 0, 100),
                "holdout": holdout,
            }
        )
    if sum(b["percent"] for b in out) != 100:
        raise _fail(path, "the branches' percentages must add up to 100")
    return out


def _value(path: str, kind: str, value: Any) -> Any:  # noqa: C901, PLR0912 - a table of checkers
    if kind == "int":
        return _int(path, value, -366, 366)
    if kind == "nonnegative":
        return _int(path, value, 0, 100_000)
    if kind == "positive":
        return _int(path, value, 1, 2_000_000_000)
    if kind == "score":
        return _int(path, value, 0, 10)
    if kind == "decimal":
        return _decimal(path, value)
    if kind == "text":
        return _text(path, value)
    if kind == "time":
        if not isinstance(value, str) or not _TIME.match(value):
            raise _fail(path, 'expected a local time "HH:MM"')
        return value
    if kind == "store":
        if isinstance(value, bool) or not isinstance(value, int | str) or value == "":
            raise _fail(path, "expected a store's ERP code (string) or id (integer)")
        return value
    if kind == "date_field":
        return _choice(path, value, ("birth_date",))
    if kind == "segment":
        return _choice(path, value, tuple(Segment.values))
    if kind == "words":
        if not isinstance(value, list) or not all(isinstance(w, str) and w.strip() for w in value):
            raise _fail(path, "expected a list of non-empty strings")
        return [w.strip() for w in value]
    if kind == "variables":
        if not isinstance(value, list):
            raise _fail(path, "expected a list")
        for i, v in enumerate(value):
            _choice(f"{path}[{i}]", v, tuple(VARIABLE_SOURCES))
        return list(value)
    if kind == "category":
        return _choice(path, value, ("marketing", "utility"))
    if kind == "body_format":
        return _choice(path, value, ("mjml", "html"))
    if kind == "condition":
        return _choice(path, value, CONDITIONS)
    if kind == "then":
        return _choice(path, value, ("exit", "continue"))
    if kind == "branches":
        return _branches(path, value)
    raise AssertionError(kind)


def _keys(path: str, value: Any, allowed: tuple[str, ...] | list[str]) -> None:
    if not isinstance(value, dict):
        raise _fail(path, "expected an object")
    extra = sorted(set(value) - set(allowed))
    if extra:
        raise _fail(path, f"unknown key(s) {', '.join(map(repr, extra))}; allowed: {', '.join(allowed)}")


def _trigger(data: Any) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise _fail("trigger", "expected an object")
    kind = _choice("trigger.type", data.get("type"), TRIGGER_TYPES)
    spec = _TRIGGER_KEYS[kind]
    _keys("trigger", data, ["type", *spec])
    out: dict[str, Any] = {"type": kind}
    for name in _REQUIRED_TRIGGER.get(kind, ()):
        if name not in data:
            raise _fail(f"trigger.{name}", f"required for a {kind} trigger")
    for name, checker in spec.items():
        if name in data:
            out[name] = _value(f"trigger.{name}", checker, data[name])
    return out


def _step(i: int, data: Any, branches: set[str]) -> dict[str, Any]:
    path = f"steps[{i}]"
    if not isinstance(data, dict):
        raise _fail(path, "expected an object")
    kind = _choice(f"{path}.type", data.get("type"), STEP_TYPES)
    spec = _STEP_KEYS[kind]
    _keys(path, data, ["type", "branch", *spec])
    for name in _REQUIRED_STEP.get(kind, ()):
        if name not in data:
            raise _fail(f"{path}.{name}", f"required for a {kind} step")
    out: dict[str, Any] = {"type": kind}
    for name, checker in spec.items():
        if name in data:
            out[name] = _value(f"{path}.{name}", checker, data[name])
    if "branch" in data:
        out["branch"] = _choice(
            f"{path}.branch", data["branch"], tuple(sorted(branches)) or ("(no split before)",)
        )
    if kind == "wait" and not {"minutes", "hours", "days", "at"} & set(out):
        raise _fail(path, "a wait step needs minutes, hours, days or at")
    if kind == "condition" and out["if"] == "in_segment" and "segment" not in out:
        raise _fail(f"{path}.segment", "required when if is in_segment")
    return out


def _reentry(value: Any) -> Any:
    if value in ("once", "always"):
        return value
    if isinstance(value, dict):
        _keys("reentry", value, ("once_per_days",))
        return {"once_per_days": _int("reentry.once_per_days", value.get("once_per_days"), 1, 36_500)}
    raise _fail("reentry", 'expected "once", "always" or {"once_per_days": N}')


def flow_parse(data: Any) -> dict[str, Any]:
    """The cleaned flow definition (defaults filled in); raises FlowSchemaError."""
    _keys("flow", data, _TOP_KEYS)
    key = _text("key", data.get("key"))
    if not re.match(r"^[-a-zA-Z0-9_]{1,100}$", key):
        raise _fail("key", "expected letters, digits, '-' or '_' (at most 100)")
    steps_in = data.get("steps")
    if not isinstance(steps_in, list) or not steps_in:
        raise _fail("steps", "expected a non-empty list")
    branches: set[str] = set()
    steps = []
    for i, raw in enumerate(steps_in):
        step = _step(i, raw, branches)
        if step["type"] == "split":
            branches |= {b["name"] for b in step["branches"]}
        steps.append(step)
    exit_on = data.get("exit_on", [])
    if not isinstance(exit_on, list):
        raise _fail("exit_on", "expected a list")
    transactional = data.get("transactional", False)
    if not isinstance(transactional, bool):
        raise _fail("transactional", "expected true or false")
    return {
        "key": key,
        "name": _text("name", data.get("name", key)),
        "trigger": _trigger(data.get("trigger")),
        "reentry": _reentry(data.get("reentry", "once")),
        "exit_on": [_choice(f"exit_on[{i}]", e, EXIT_EVENTS) for i, e in enumerate(exit_on)],
        "steps": steps,
        "transactional": transactional,
    }
