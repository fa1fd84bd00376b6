"""The Millennium sandbox's records, built deterministically from an index (customers' names,
CPF/CNPJ, sales) and its OData answers (JSON, errors)."""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Mapping
from datetime import datetime
from decimal import Decimal
from typing import Any

from aiohttp import web

from integrations.millennium.client import (
    cnpj_check_digits,
    cpf_check_digits,
    format_date,
)

_PHONE_DIGITS = 10**7  # a customer's mobile carries (i * 7919) mod 10^7, so i is recovered from it
_PHONE_INVERSE = pow(7919, -1, _PHONE_DIGITS)

_FIRST = [
    "ANA",
    "BRUNO",
    "CAMILA",
    "DIEGO",
    "EDUARDA",
    "FELIPE",
    "GABRIELA",
    "HENRIQUE",
    "ISABELA",
    "JOÃO",
    "LARISSA",
    "MARCOS",
    "NATÁLIA",
    "OTÁVIO",
    "PAULA",
    "RAFAEL",
    "SOFIA",
    "THIAGO",
    "VITÓRIA",
    "YURI",
]
_LAST = ["SILVA", "SANTOS", "OLIVEIRA", "SOUZA", "RODRIGUES", "FERREIRA", "ALVES", "PEREIRA", "LIMA", "GOMES"]
_DDD = ["11", "21", "31", "41", "47", "51", "61", "71", "81", "85", "91", "62"]


def _ascii(text: str) -> str:
    return unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode().lower()


def _json_response(payload: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> web.Response:
    return web.Response(
        body=json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode(),
        status=status,
        content_type="application/json",
        headers=headers,
    )


def _odata_error(status: int, message: str, headers: Mapping[str, str] | None = None) -> web.Response:
    body = {"error": {"code": str(status), "message": {"lang": "pt-BR", "value": message}}}
    return _json_response(body, status, headers)


class _BadRequest(Exception):
    pass


def _cpf(i: int) -> str:
    base = f"{(i * 7919 + 123_456_789) % 10**9:09d}"
    if len(set(base)) == 1:
        base = "123456789"
    return base + cpf_check_digits(base)


def _cnpj(i: int) -> str:
    base = f"{(i * 104_729 + 11_222_333) % 10**8:08d}0001"
    return base + cnpj_check_digits(base)


def _sale_record(
    number: int, cliente: int | None, store_code: str, sold_at: datetime, total: Decimal, items: list
) -> dict[str, Any]:
    """A sale as the API renders it (its trans_id from its number)."""
    return {
        "pedidov": number,
        "trans_id": number * 10 + 3,
        "cliente": cliente,
        "filial": store_code,
        "data_emissao": format_date(sold_at),
        "valor_final": float(total),
        "itens": items,
    }


def _trans_id(item: tuple[dict[str, Any], datetime]) -> int:
    return int(item[0]["trans_id"])
