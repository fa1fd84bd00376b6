"""The sandbox's validation of a send as Graph does it (template messages, parameters, lengths)."""

from __future__ import annotations

import re
from typing import Any

from project.sandboxes.whatsapp.graph_errors import GraphError

VERSION_RE = re.compile(r"v\d+\.\d+")
TO_RE = re.compile(r"\+?\d{8,15}")
# 55 + two-digit area code + the mobile "9" + eight digits.
BR_MOBILE_RE = re.compile(r"(55\d{2})9(\d{8})")
# Meta refuses template text parameters with these (error 132018: "Param text cannot have
# new-line/tab characters or more than 4 consecutive spaces"). Every line break counts here (\r, a
# vertical tab, U+2028...): the sandbox errs on the strict side, so what passes it passes Meta.
BAD_WHITESPACE_RE = re.compile(r"[\n\r\t\v\f\x85\u2028\u2029]| {5,}")
# The text of a body parameter: 1,024 characters when the template has other components, 32,768 when
# the body is alone (Cloud API reference, parameter object); Meta answers 132005 beyond.
BODY_TEXT_MAX = 1024
BODY_ONLY_TEXT_MAX = 32768
COMPONENT_TYPES = frozenset({"header", "body", "button", "carousel", "limited_time_offer"})
BUTTON_SUB_TYPES = frozenset({"url", "quick_reply", "copy_code", "flow", "catalog", "mpm", "voice_call"})
MEDIA_PARAMETER_TYPES = frozenset({"image", "video", "document", "location"})
MAX_CALLBACK_DATA = 512


def _require(condition: bool, code: int, details: str) -> None:
    if not condition:
        raise GraphError(code, details)


def _validate_parameter(component: str, parameter: Any) -> None:
    """Raise the GraphError Meta answers for a bad template parameter."""
    _require(isinstance(parameter, dict), 100, f"Each {component} parameter must be an object")
    kind = parameter.get("type")
    _require(isinstance(kind, str) and bool(kind), 131008, f"Parameter of {component} is missing type")
    if kind == "text":
        text = parameter.get("text")
        _require(
            isinstance(text, str) and bool(text.strip()),
            131008,
            f"Parameter of type text is missing text value in {component}",
        )
        if BAD_WHITESPACE_RE.search(text):
            raise GraphError(132018)
    elif kind in MEDIA_PARAMETER_TYPES:
        media = parameter.get(kind)
        _require(isinstance(media, dict), 131008, f"Parameter of type {kind} is missing {kind} object")
        if kind != "location":
            _require(
                bool(media.get("link") or media.get("id")),
                131008,
                f"Parameter of type {kind} needs link or id",
            )
    elif kind == "payload":
        _require(bool(parameter.get("payload")), 131008, "Parameter of type payload is missing payload value")
    elif kind == "currency":
        currency = parameter.get("currency")
        _require(
            isinstance(currency, dict) and {"fallback_value", "code", "amount_1000"} <= set(currency),
            131008,
            "Parameter of type currency needs fallback_value, code and amount_1000",
        )
    elif kind == "date_time":
        date_time = parameter.get("date_time")
        _require(
            isinstance(date_time, dict) and "fallback_value" in date_time,
            131008,
            "Parameter of type date_time needs fallback_value",
        )
    elif kind not in ("coupon_code", "action", "limited_time_offer"):
        raise GraphError(100, f"Invalid parameter type {kind!r} in {component}")


def _check_body_length(components: list[dict[str, Any]]) -> None:
    """Raise 132005 for a body text parameter over Meta's limit (counted in UTF-16 code units, the
    strict reading of "characters")."""
    alone = all(component.get("type") == "body" for component in components)
    limit = BODY_ONLY_TEXT_MAX if alone else BODY_TEXT_MAX
    for component in components:
        if component.get("type") != "body":
            continue
        for parameter in component.get("parameters", []):
            text = parameter.get("text") if parameter.get("type") == "text" else None
            if isinstance(text, str) and len(text.encode("utf-16-le")) // 2 > limit:
                raise GraphError(132005, f"Param text is over {limit} characters")


def validate_message(payload: Any) -> tuple[str, dict[str, Any]]:
    """Check a send request like Meta; returns ``(to, template)`` or raises :class:`GraphError`."""
    _require(isinstance(payload, dict), 100, "The request body must be a JSON object")
    product = payload.get("messaging_product")
    _require(
        product == "whatsapp", 100, f'Param messaging_product must be one of {{WHATSAPP}} - got "{product}".'
    )
    _require(
        payload.get("recipient_type", "individual") == "individual",
        100,
        "Param recipient_type must be individual",
    )
    to = payload.get("to")
    _require(
        isinstance(to, str) and bool(TO_RE.fullmatch(to)),
        100,
        "Param to must be a phone number of 8 to 15 digits, optionally prefixed with +",
    )
    kind = payload.get("type", "text")
    _require(
        kind in ("template", "text"), 100, f'Param type must be "template" or "text" here - got "{kind}"'
    )
    if kind == "text":
        text = payload.get("text")
        body = text.get("body") if isinstance(text, dict) else None
        _require(isinstance(body, str) and bool(body.strip()), 100, "Param text['body'] is required")
        assert isinstance(body, str)
        _require(len(body) <= 4096, 100, "Param text['body'] must be at most 4096 characters")
        return to, {"type": "text", "body": body}
    template = payload.get("template")
    _require(isinstance(template, dict), 100, "Param template must be an object")
    name = template.get("name")
    _require(isinstance(name, str) and bool(name), 100, "Param template['name'] is required")
    language = template.get("language")
    _require(
        isinstance(language, dict) and isinstance(language.get("code"), str) and bool(language.get("code")),
        100,
        "Param template['language']['code'] is required",
    )
    components = template.get("components", [])
    _require(isinstance(components, list), 100, "Param template['components'] must be an array")
    for component in components:
        _require(isinstance(component, dict), 100, "Each template component must be an object")
        ctype = component.get("type")
        _require(ctype in COMPONENT_TYPES, 100, f"Invalid component type {ctype!r}")
        if ctype == "button":
            sub_type, index = component.get("sub_type"), component.get("index")
            _require(sub_type is not None, 131008, "Button component is missing sub_type")
            _require(index is not None, 131008, "Button component is missing index")
            _require(sub_type in BUTTON_SUB_TYPES, 100, f"Invalid button sub_type {sub_type!r}")
            _require(
                str(index).isdigit() and 0 <= int(str(index)) <= 9,
                100,
                "Button index must be between 0 and 9",
            )
        parameters = component.get("parameters", [])
        _require(isinstance(parameters, list), 100, f"Param parameters of {ctype} must be an array")
        for parameter in parameters:
            _validate_parameter(str(ctype), parameter)
    _check_body_length(components)
    callback = payload.get("biz_opaque_callback_data")
    _require(
        callback is None or (isinstance(callback, str) and len(callback) <= MAX_CALLBACK_DATA),
        100,
        f"Param biz_opaque_callback_data must be a string of at most {MAX_CALLBACK_DATA} characters",
    )
    return to, template
