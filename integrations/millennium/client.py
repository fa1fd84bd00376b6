"""Linx Millennium ERP client: plain values in, typed records out.

The API is OData-flavoured JSON: every list answers ``{"value": [...]}``, dates come as
``/Date(1700000000000-0300)/`` (milliseconds since the epoch, UTC, and the writer's offset), and
lists are paged with a ``trans_id`` cursor: ``trans_id=T&$top=N`` answers at most N records whose
trans_id is greater than T, ascending. The client walks the pages (each request starts after the
largest trans_id of the page before) and stops on an empty page or when the cursor does not
advance. It yields one page at a time, so a caller never holds more than a page.

Failures are IntegrationErrors: timeouts, network errors, 5xx and 429 are retryable; any other 4xx
(a wrong password, a bad parameter) and an answer that is not the expected JSON are not. A record
that cannot be read (no id, a broken date, an invalid CPF/CNPJ...) is not an error: it is reported
as a MalformedRecord on its page and the rest of the page goes on.

    with MillenniumClient(base_url=..., username=..., password=...) as erp:
        for page in erp.customer_pages(trans_id=saved, top=1000):
            upsert(page.records); report(page.malformed); save(page.next_trans_id)
"""

from __future__ import annotations

import base64
import functools
import json
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal, InvalidOperation
from types import TracebackType
from typing import Any, Generic, Self, TypeVar

import httpx
import phonenumbers
from django.core.exceptions import ValidationError
from django.core.validators import validate_email
from django.utils.translation import gettext_noop

from integrations import http
from integrations.errors import IntegrationError

CUSTOMERS_PATH = "/api/millenium/clientes/lista"
SALES_PATH = "/api/millenium/pedido_venda/lista"
DEFAULT_PAGE_SIZE = 1000
EXCERPT_CHARS = 500

_DATE_RE = re.compile(r"^/Date\((-?\d{1,15})([+-]\d{4})?\)/$")
_NOT_DOC = re.compile(r"[\s./\-]")
_CNPJ_RE = re.compile(r"^[0-9A-Z]{12}[0-9]{2}$")
_NON_DIGITS = re.compile(r"\D")

T = TypeVar("T")
PARAM_CHARS = 200


# Why a record cannot be read: message ids, each shown in its reader's language.
NOT_A_DATE = gettext_noop("not a date: %(value)s")
DATE_OUT_OF_RANGE = gettext_noop("date out of range: %(value)s")
NOT_A_DATE_VALUE = gettext_noop("not a /Date(ms±hhmm)/ value: %(value)s")
DATE_WITHOUT_ZONE = gettext_noop("a date without a time zone: %(value)s")
DOCUMENT_NOT_TEXT = gettext_noop("CPF/CNPJ is not text: %(value)s")
INVALID_CPF = gettext_noop("invalid CPF %(value)s (check digits)")
NOT_A_DOCUMENT = gettext_noop("not a CPF or CNPJ: %(value)s")
INVALID_CNPJ = gettext_noop("invalid CNPJ %(value)s (check digits)")
NOT_A_NUMBER = gettext_noop("%(what)s is not a number: %(value)s")
TRANS_ID_NOT_INTEGER = gettext_noop("trans_id is not an integer: %(value)s")
TRANS_ID_NEGATIVE = gettext_noop("trans_id is negative: %(value)s")
MISSING = gettext_noop("no %(what)s")
NOT_AN_ID = gettext_noop("%(what)s is not an id: %(value)s")
ID_TOO_LONG = gettext_noop("%(what)s is longer than 64 characters")
NOT_TEXT = gettext_noop("%(what)s is not text: %(value)s")
ITEMS_NOT_A_LIST = gettext_noop("itens is not a list: %(value)s")
ITEM_NOT_AN_OBJECT = gettext_noop("item %(n)s is not an object")
TOTAL_OUT_OF_RANGE = gettext_noop("valor_final out of range: %(value)s")
RECORD_NOT_AN_OBJECT = gettext_noop("the record is not an object")
RECORD_MESSAGES = (
    NOT_A_DATE,
    DATE_OUT_OF_RANGE,
    NOT_A_DATE_VALUE,
    DATE_WITHOUT_ZONE,
    DOCUMENT_NOT_TEXT,
    INVALID_CPF,
    NOT_A_DOCUMENT,
    INVALID_CNPJ,
    NOT_A_NUMBER,
    TRANS_ID_NOT_INTEGER,
    TRANS_ID_NEGATIVE,
    MISSING,
    NOT_AN_ID,
    ID_TOO_LONG,
    NOT_TEXT,
    ITEMS_NOT_A_LIST,
    ITEM_NOT_AN_OBJECT,
    TOTAL_OUT_OF_RANGE,
    RECORD_NOT_AN_OBJECT,
)


class RecordError(ValueError):
    """Why a record cannot be read, as an untranslated message id (marked with gettext_noop, so the
    catalogue has it) and its values: the domain stores both and each reader sees it in their own
    language. str() is the English sentence."""

    def __init__(self, message: str, **params: Any) -> None:
        self.message = message
        self.params = {k: str(v)[:PARAM_CHARS] for k, v in params.items()}
        super().__init__(message % self.params)


def _shown(value: Any) -> str:
    return repr(value)[:PARAM_CHARS]


# --- values ------------------------------------------------------------------------------------


def parse_date(value: Any) -> datetime:
    """An aware datetime from ``/Date(ms±hhmm)/`` (or an ISO 8601 string); raises ValueError.

    The milliseconds are UTC; the offset only says in which zone the ERP wrote it, so the result
    is that instant expressed in that offset (UTC when there is none)."""
    if not isinstance(value, str):
        raise RecordError(NOT_A_DATE, value=_shown(value))
    match = _DATE_RE.match(value.strip())
    if match:
        millis, offset = match.groups()
        zone: timezone = UTC
        if offset:
            sign = -1 if offset[0] == "-" else 1
            zone = timezone(sign * timedelta(hours=int(offset[1:3]), minutes=int(offset[3:5])))
        try:
            return datetime.fromtimestamp(int(millis) / 1000, tz=zone)
        except (OverflowError, OSError, ValueError):
            raise RecordError(DATE_OUT_OF_RANGE, value=_shown(value)) from None
    try:
        parsed = datetime.fromisoformat(value.strip())
    except ValueError:
        raise RecordError(NOT_A_DATE_VALUE, value=_shown(value)) from None
    if parsed.tzinfo is None:
        raise RecordError(DATE_WITHOUT_ZONE, value=_shown(value))
    return parsed


def format_date(when: datetime) -> str:
    """``/Date(ms±hhmm)/`` of an aware datetime, with its own offset (as Millennium writes them)."""
    if when.tzinfo is None:
        raise ValueError("an aware datetime is needed")
    millis = int(when.timestamp() * 1000)
    offset = when.utcoffset() or timedelta(0)
    minutes = int(offset.total_seconds()) // 60
    sign = "-" if minutes < 0 else "+"
    return f"/Date({millis}{sign}{abs(minutes) // 60:02d}{abs(minutes) % 60:02d})/"


def cpf_check_digits(base: str) -> str:
    """The two check digits of a CPF's first nine digits."""
    digits = [int(c) for c in base]
    for _ in range(2):
        weight = len(digits) + 1
        total = sum(d * (weight - i) for i, d in enumerate(digits))
        rest = total % 11
        digits.append(0 if rest < 2 else 11 - rest)
    return f"{digits[-2]}{digits[-1]}"


_CNPJ_WEIGHTS = (6, 5, 4, 3, 2, 9, 8, 7, 6, 5, 4, 3, 2)


def cnpj_check_digits(base: str) -> str:
    """The two check digits of a CNPJ's first twelve characters (numeric or, since July 2026,
    alphanumeric: each character counts as its ASCII code minus 48)."""
    values = [ord(c) - 48 for c in base]
    for _ in range(2):
        weights = _CNPJ_WEIGHTS[-len(values) :]
        rest = sum(v * w for v, w in zip(values, weights, strict=True)) % 11
        values.append(0 if rest < 2 else 11 - rest)
    return f"{values[-2]}{values[-1]}"


def normalize_cpf_cnpj(value: Any) -> str:
    """A CPF (11 digits) or CNPJ (14 characters) without punctuation, check digits verified.

    "" for an empty value. Leading zeros lost by a numeric column are put back. Raises ValueError
    (saying why) for anything that is not a valid CPF or CNPJ."""
    if value is None or value == "":
        return ""
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise RecordError(DOCUMENT_NOT_TEXT, value=_shown(value))
    raw = _NOT_DOC.sub("", str(value)).upper()
    if not raw:
        return ""
    if raw.isdigit():
        if len(raw) <= 11:
            doc = raw.zfill(11)
            if len(set(doc)) == 1 or doc[9:] != cpf_check_digits(doc[:9]):
                raise RecordError(INVALID_CPF, value=_shown(value))
            return doc
        if len(raw) <= 14:
            raw = raw.zfill(14)
    if not _CNPJ_RE.match(raw):
        raise RecordError(NOT_A_DOCUMENT, value=_shown(value))
    if len(set(raw)) == 1 or raw[12:] != cnpj_check_digits(raw[:12]):
        raise RecordError(INVALID_CNPJ, value=_shown(value))
    return raw


def mobile_e164(ddd: Any, celular: Any) -> str:
    """E.164 of a Brazilian mobile from Millennium's area code and number; "" when there is none
    or it cannot be a valid number. A number that already carries its area code (or +55) is
    accepted, and an old 8-digit mobile gets its ninth digit."""
    number = _NON_DIGITS.sub("", str(celular or "")).lstrip("0")
    area = _NON_DIGITS.sub("", str(ddd or "")).lstrip("0")
    if not number:
        return ""
    if number.startswith("55") and len(number) in (12, 13):
        national = number[2:]
    elif len(number) in (10, 11):
        national = number
    else:
        national = area + number
    if len(national) == 10 and national[2] in "6789":
        national = f"{national[:2]}9{national[2:]}"  # an 8-digit mobile from before 2016
    if len(national) == 11 and national[2] == "9" and _mobile_area(national[:2]):
        # The common case, decided without a full parse (a sync reads millions): phonenumbers
        # accepts any 9 + 8 digits in an area code it knows for mobiles.
        return "+55" + national
    try:
        parsed = phonenumbers.parse("+55" + national)
    except phonenumbers.NumberParseException:
        return ""
    if not phonenumbers.is_valid_number(parsed):
        return ""
    return phonenumbers.format_number(parsed, phonenumbers.PhoneNumberFormat.E164)


@functools.lru_cache(maxsize=128)
def _mobile_area(area: str) -> bool:
    """Does phonenumbers know `area` as a Brazilian area code with 9-digit mobiles?"""
    try:
        return phonenumbers.is_valid_number(phonenumbers.parse(f"+55{area}987654321"))
    except phonenumbers.NumberParseException:
        return False


def normalize_email(value: Any) -> str:
    """The address, trimmed and lower-cased; "" when absent or not a valid address."""
    if not isinstance(value, str):
        return ""
    address = value.strip().lower()
    if not address or len(address) > 254:
        return ""
    try:
        validate_email(address)
    except ValidationError:
        return ""
    return address


def _decimal(value: Any, what: str) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise RecordError(NOT_A_NUMBER, what=what, value=_shown(value))
    try:
        number = Decimal(str(value).strip())
    except InvalidOperation:
        raise RecordError(NOT_A_NUMBER, what=what, value=_shown(value)) from None
    if not number.is_finite():
        raise RecordError(NOT_A_NUMBER, what=what, value=_shown(value))
    return number


def _trans_id(value: Any) -> int:
    if isinstance(value, bool):
        raise RecordError(TRANS_ID_NOT_INTEGER, value=_shown(value))
    if isinstance(value, int):
        number = value
    elif isinstance(value, str) and value.strip().isdigit():
        number = int(value)
    else:
        raise RecordError(TRANS_ID_NOT_INTEGER, value=_shown(value))
    if number < 0:
        raise RecordError(TRANS_ID_NEGATIVE, value=_shown(value))
    return number


def _identifier(value: Any, what: str, *, required: bool = True) -> str:
    if value is None or value == "":
        if required:
            raise RecordError(MISSING, what=what)
        return ""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise RecordError(NOT_AN_ID, what=what, value=_shown(value))
    text = str(value).strip()
    if len(text) > 64:
        raise RecordError(ID_TOO_LONG, what=what)
    if not text and required:
        raise RecordError(MISSING, what=what)
    return text


def _text(value: Any, what: str, limit: int) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise RecordError(NOT_TEXT, what=what, value=_shown(value))
    return " ".join(value.split())[:limit]


# --- records -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ErpCustomer:
    erp_id: str
    trans_id: int
    name: str
    cpf_cnpj: str  # digits (CNPJ: alphanumeric), validated; "" when absent
    email: str  # "" when absent or invalid
    phone: str  # E.164; "" when absent or invalid
    registered_at: datetime | None
    # The ERP's marketing opt-in (aceita_marketing): True/False when the record carries it, None when
    # it does not (or it cannot be read) — then nothing is known and no consent is assumed.
    marketing_opt_in: bool | None = None


@dataclass(frozen=True, slots=True)
class ErpSaleItem:
    product: str
    quantity: Decimal
    price: Decimal


@dataclass(frozen=True, slots=True)
class ErpSale:
    erp_id: str
    trans_id: int
    customer_erp_id: str  # "" for a sale without an identified customer
    store_code: str
    sold_at: datetime
    total: Decimal
    items: tuple[ErpSaleItem, ...]


@dataclass(frozen=True, slots=True)
class MalformedRecord:
    """A record that could not be read; skipped, and reported so someone can fix it in the ERP."""

    kind: str  # "customer" | "sale"
    external_id: str  # the record's id when it had a readable one
    trans_id: int | None
    reason: str  # in English
    excerpt: str  # the record as JSON, cut to EXCERPT_CHARS
    # The reason as an untranslated message id and its values ("" when it has none: any other error).
    reason_code: str = ""
    reason_params: Mapping[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class Page(Generic[T]):
    """One answer of a list endpoint, read."""

    trans_id: int  # the cursor this page was asked with
    next_trans_id: int  # the largest trans_id on the page (malformed records included)
    records: list[T] = field(default_factory=list)
    malformed: list[MalformedRecord] = field(default_factory=list)

    @property
    def size(self) -> int:
        return len(self.records) + len(self.malformed)


def _excerpt(raw: Any) -> str:
    try:
        text = json.dumps(raw, ensure_ascii=False, default=str, sort_keys=True)
    except (TypeError, ValueError):
        text = repr(raw)
    return text[:EXCERPT_CHARS]


OPT_IN_FIELD = "aceita_marketing"
_YES = frozenset({"s", "sim", "y", "yes", "true", "t", "1"})
_NO = frozenset({"n", "nao", "não", "no", "false", "f", "0"})


def parse_opt_in(value: Any) -> bool | None:
    """The ERP's opt-in flag: True or False only for an unambiguous answer (a boolean, 1/0, "S"/"N",
    "sim"/"não", "true"/"false"); None for anything else, absent or unreadable — never a consent."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return value == 1
    if isinstance(value, str):
        text = value.strip().lower()
        if text in _YES:
            return True
        if text in _NO:
            return False
    return None


def parse_customer(raw: Mapping[str, Any]) -> ErpCustomer:
    """A customer record of clientes/lista; raises ValueError saying what is wrong."""
    registered = raw.get("data_cadastro")
    return ErpCustomer(
        erp_id=_identifier(raw.get("cliente"), "cliente"),
        trans_id=_trans_id(raw.get("trans_id")),
        name=_text(raw.get("nome"), "nome", 200),
        cpf_cnpj=normalize_cpf_cnpj(raw.get("cpf_cnpj")),
        email=normalize_email(raw.get("e_mail")),
        phone=mobile_e164(raw.get("ddd_celular"), raw.get("celular")),
        registered_at=parse_date(registered) if registered not in (None, "") else None,
        marketing_opt_in=parse_opt_in(raw.get(OPT_IN_FIELD)),
    )


def parse_sale(raw: Mapping[str, Any]) -> ErpSale:
    """A sale record of pedido_venda/lista; raises ValueError saying what is wrong."""
    items_raw = raw.get("itens")
    if items_raw is None:
        items_raw = []
    if not isinstance(items_raw, list):
        raise RecordError(ITEMS_NOT_A_LIST, value=_shown(items_raw))
    items = []
    for n, item in enumerate(items_raw):
        if not isinstance(item, dict):
            raise RecordError(ITEM_NOT_AN_OBJECT, n=n)
        items.append(
            ErpSaleItem(
                product=_identifier(item.get("produto"), f"itens[{n}].produto"),
                quantity=_decimal(item.get("quantidade"), f"itens[{n}].quantidade"),
                price=_decimal(item.get("preco"), f"itens[{n}].preco"),
            )
        )
    total = _decimal(raw.get("valor_final"), "valor_final")
    if abs(total) >= Decimal("1e10"):
        raise RecordError(TOTAL_OUT_OF_RANGE, value=total)
    return ErpSale(
        erp_id=_identifier(raw.get("pedidov"), "pedidov"),
        trans_id=_trans_id(raw.get("trans_id")),
        customer_erp_id=_identifier(raw.get("cliente"), "cliente", required=False),
        store_code=_identifier(raw.get("filial"), "filial"),
        sold_at=parse_date(raw.get("data_emissao")),
        total=total.quantize(Decimal("0.01")),
        items=tuple(items),
    )


def read_page(
    values: list[Any], *, kind: str, id_key: str, parse: Callable[[Mapping[str, Any]], T], trans_id: int
) -> Page[T]:
    """Split an answer's records into readable ones and MalformedRecords; find the next cursor."""
    page: Page[T] = Page(trans_id=trans_id, next_trans_id=trans_id)
    for raw in values:
        record_trans_id: int | None = None
        external_id = ""
        if isinstance(raw, dict):
            try:
                record_trans_id = _trans_id(raw.get("trans_id"))
            except ValueError:
                record_trans_id = None
            if record_trans_id is not None and record_trans_id > page.next_trans_id:
                page.next_trans_id = record_trans_id
            identifier = raw.get(id_key)
            external_id = str(identifier)[:64] if isinstance(identifier, int | str) else ""
        try:
            if not isinstance(raw, dict):
                raise RecordError(RECORD_NOT_AN_OBJECT)
            page.records.append(parse(raw))
        except ValueError as exc:
            page.malformed.append(
                MalformedRecord(
                    kind=kind,
                    external_id=external_id,
                    trans_id=record_trans_id,
                    reason=str(exc)[:300],
                    excerpt=_excerpt(raw),
                    reason_code=exc.message if isinstance(exc, RecordError) else "",
                    reason_params=exc.params if isinstance(exc, RecordError) else {},
                )
            )
    return page


# --- the client --------------------------------------------------------------------------------


class MillenniumClient:
    """One Millennium server with Basic auth; use it as a context manager."""

    def __init__(
        self,
        *,
        base_url: str,
        username: str,
        password: str,
        timeout: float = 30.0,
    ) -> None:
        token = base64.b64encode(f"{username}:{password}".encode()).decode()
        self._http = http.client(
            base_url=base_url.rstrip("/"),
            timeout=httpx.Timeout(connect=5.0, read=timeout, write=10.0, pool=timeout),
            headers={"Authorization": f"Basic {token}", "Accept": "application/json"},
            max_connections=2,
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def customer_pages(
        self, *, trans_id: int = 0, top: int = DEFAULT_PAGE_SIZE
    ) -> Iterator[Page[ErpCustomer]]:
        """Pages of customers with a trans_id greater than `trans_id`, ascending, until the end."""
        return self._pages(
            CUSTOMERS_PATH,
            {},
            kind="customer",
            id_key="cliente",
            parse=parse_customer,
            trans_id=trans_id,
            top=top,
        )

    def sale_pages(
        self,
        *,
        store_code: str,
        start: datetime,
        end: datetime,
        trans_id: int = 0,
        top: int = DEFAULT_PAGE_SIZE,
    ) -> Iterator[Page[ErpSale]]:
        """Pages of one store's sales issued in [start, end), after `trans_id`, ascending."""
        if start.tzinfo is None or end.tzinfo is None:
            raise ValueError("start and end must be aware datetimes")
        params = {
            "filial": store_code,
            "data_inicial": start.isoformat(timespec="seconds"),
            "data_final": end.isoformat(timespec="seconds"),
        }
        return self._pages(
            SALES_PATH, params, kind="sale", id_key="pedidov", parse=parse_sale, trans_id=trans_id, top=top
        )

    def _pages(
        self,
        path: str,
        params: dict[str, str],
        *,
        kind: str,
        id_key: str,
        parse: Callable[[Mapping[str, Any]], T],
        trans_id: int,
        top: int,
    ) -> Iterator[Page[T]]:
        if top < 1:
            raise ValueError("top must be at least 1")
        cursor = int(trans_id)
        while True:
            values = self.list_values(path, {**params, "trans_id": str(cursor)}, top=top)
            if not values:
                return
            page = read_page(values, kind=kind, id_key=id_key, parse=parse, trans_id=cursor)
            yield page
            if page.next_trans_id <= cursor:
                return  # the cursor did not advance: asking again would answer the same page
            cursor = page.next_trans_id

    def list_values(self, path: str, params: Mapping[str, str], *, top: int) -> list[Any]:
        """The ``value`` list of one GET; raises IntegrationError saying whether to retry."""
        what = f"Millennium GET {path}"
        query = {"$format": "json", "$top": str(top), **params}
        try:
            response = self._http.get(path, params=query)
        except httpx.TransportError as exc:
            raise http.no_answer_error(what, exc, idempotent=True) from exc
        status = response.status_code
        if status >= 400:
            raise http.status_error(what, response, details=response.text[:300])
        try:
            body = response.json()
        except ValueError as exc:
            raise IntegrationError(
                f"{what}: HTTP {status} with a body that is not JSON", retryable=False, status=status
            ) from exc
        values = body.get("value") if isinstance(body, dict) else None
        if not isinstance(values, list):
            raise IntegrationError(
                f'{what}: the answer has no "value" list',
                retryable=False,
                status=status,
                details=_excerpt(body),
            )
        return values
