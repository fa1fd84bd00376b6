"""The Millennium sandbox's data: its state and the customers, sales and responses it makes from an
index, deterministically (MillenniumSandbox serves them)."""

from __future__ import annotations

import bisect
import zlib
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

from aiohttp import web

from integrations.millennium.client import (
    OPT_IN_FIELD,
    format_date,
)
from project.sandboxes.millennium_records import (
    _DDD,
    _FIRST,
    _LAST,
    _PHONE_DIGITS,
    _PHONE_INVERSE,
    _ascii,
    _cnpj,
    _cpf,
    _sale_record,
)
from project.sandboxes.server import ThreadedAppServer

DEFAULT_USERNAME = "millennium"
DEFAULT_PASSWORD = "sandbox-password"  # noqa: S105 - the sandbox's own login, not a real credential
# The demo organization's stores carry these codes (project.demo.crm.DEMO_STORES).
DEFAULT_STORES: tuple[str, ...] = ("001", "002", "003")
OFFSET = timezone(timedelta(hours=-3))  # the stores' clocks: Brasília time
FIRST_CUSTOMER_ID = 1000
TRANS_STEP = 10
EPOCH = date(2020, 1, 1)  # no sales before this day
MAX_SALES_PER_DAY = 999
MAX_STORES = 99
# Response sales are numbered apart from a day's regular ones: RESPONSE_BASE + (day, store, customer).
RESPONSE_BASE = 10**13
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class _State:
    """Everything that changes; only touched on the server's event loop."""

    requests: list[dict[str, Any]] = field(default_factory=list)
    fail_after: int = 0
    fail_count: int = 0
    fail_status: int = 500
    # Customers changed or added after start: index -> (trans_id, version), and (trans_id, index)
    # in trans_id order (entries whose trans_id is no longer current are skipped).
    changed: dict[int, tuple[int, int]] = field(default_factory=dict)
    changed_order: list[tuple[int, int]] = field(default_factory=list)
    added: int = 0
    next_trans_id: int = 0
    # Response sales by store: (record, sold_at); the (cliente, day) pairs that have one; how many
    # of the `responds_to` sandbox's messages have been read.
    responses: dict[str, list[tuple[dict[str, Any], datetime]]] = field(default_factory=dict)
    responded: set[tuple[int, date]] = field(default_factory=set)
    messages_read: int = 0


class MillenniumData(ThreadedAppServer):
    """The sandbox's state and the records it serves; MillenniumSandbox adds the app and its controls."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        customers: int = 1000,
        stores: Iterable[str] = DEFAULT_STORES,
        sales_per_day: int = 24,
        username: str = DEFAULT_USERNAME,
        password: str = DEFAULT_PASSWORD,
        latency_ms: float = 0.0,
        malformed_every: int = 0,
        max_top: int = 5000,
        future_sales: bool = False,
        response_rate: float = 0.0,
        response_days: int = 6,
        response_seed: int = 0,
        responds_to: str | None = None,
    ) -> None:
        super().__init__(host, port)
        self._stores = tuple(stores)
        if customers < 0 or not 0 <= sales_per_day <= MAX_SALES_PER_DAY or len(self._stores) > MAX_STORES:
            raise ValueError(
                f"customers must be >= 0, sales_per_day 0-{MAX_SALES_PER_DAY}, at most {MAX_STORES} stores"
            )
        if malformed_every < 0:
            raise ValueError("malformed_every must be 0 (none) or more")
        if not 0 <= response_rate <= 1 or response_days < 1:
            raise ValueError("response_rate must be 0-1 and response_days at least 1")
        self._response_rate = float(response_rate)
        self._response_days = int(response_days)
        self._response_seed = int(response_seed)
        self._responds_to = responds_to.rstrip("/") if responds_to else None
        self._base_customers = int(customers)
        self._sales_per_day = int(sales_per_day)
        self._username = username
        self._password = password
        self._latency_ms = float(latency_ms)
        self._malformed_every = int(malformed_every)
        self._max_top = int(max_top)
        self._future_sales = bool(future_sales)
        self._state = self._fresh_state()

    def _fresh_state(self) -> _State:
        return _State(next_trans_id=TRANS_STEP * self._base_customers + 1)

    def _add(self, n: int) -> list[int]:
        state = self._state
        ids = []
        for _ in range(n):
            i = self._base_customers + state.added
            state.added += 1
            self._assign(i, version=0)
            ids.append(FIRST_CUSTOMER_ID + i)
        return ids

    def _touch(self, indexes: list[int]) -> None:
        total = self._base_customers + self._state.added
        for i in indexes:
            if not 0 <= i < total:
                raise ValueError(f"no customer {i}")
            self._assign(i, version=self._state.changed.get(i, (0, 0))[1] + 1)

    def _assign(self, i: int, *, version: int) -> None:
        state = self._state
        trans_id = state.next_trans_id
        state.next_trans_id += 1
        state.changed[i] = (trans_id, version)
        state.changed_order.append((trans_id, i))

    def _customer(self, i: int) -> dict[str, Any]:
        trans_id, version = self._state.changed.get(i, (TRANS_STEP * (i + 1), 0))
        first, last = _FIRST[i % len(_FIRST)], _LAST[(i // len(_FIRST)) % len(_LAST)]
        company = i % 20 == 19
        record: dict[str, Any] = {
            "cliente": FIRST_CUSTOMER_ID + i,
            "trans_id": trans_id,
            "nome": f"{last} COMERCIO LTDA" if company else f"{first} {last}",
            "cpf_cnpj": "",
            "e_mail": None,
            "ddd_celular": _DDD[i % len(_DDD)],
            "celular": None,
            "data_cadastro": format_date(
                datetime(2015, 1, 1, 9, 0, tzinfo=OFFSET) + timedelta(minutes=37 * i)
            ),
        }
        if company:
            doc = _cnpj(i)
            record["cpf_cnpj"] = f"{doc[:2]}.{doc[2:5]}.{doc[5:8]}/{doc[8:12]}-{doc[12:]}"
        else:
            doc = _cpf(i)
            record["cpf_cnpj"] = f"{doc[:3]}.{doc[3:6]}.{doc[6:9]}-{doc[9:]}" if i % 2 == 0 else doc
        if i % 9 != 8:
            mark = f".v{version}" if version else ""
            record["e_mail"] = f"{_ascii(first)}.{_ascii(last)}{i}{mark}@example.com.br"
        if i % 7 != 6:
            digits = f"{(i * 7919) % 10**7:07d}"
            # Every eleventh number in the old 8-digit form, without the mobile's ninth digit.
            record["celular"] = f"9{digits}" if i % 11 == 10 else f"99{digits}"
        if i % 13 != 12:  # the opt-in field, as ERPs write it: a boolean or "S"/"N"; some never asked
            opted_in = i % 5 != 4
            record[OPT_IN_FIELD] = opted_in if i % 2 == 0 else ("S" if opted_in else "N")
        if version:
            record["nome"] += f" (v{version})"
        if self.is_malformed_customer(i):
            kind = ((i + 1) // self._malformed_every) % 3
            if kind == 0:
                valid = _cpf(i)
                record["cpf_cnpj"] = valid[:10] + str((int(valid[10]) + 1) % 10)
            elif kind == 1:
                record["data_cadastro"] = "/Date(não-é-data)/"
            else:
                del record["cliente"]
        return record

    def _customers_after(self, trans_id: int, top: int) -> list[dict[str, Any]]:
        state = self._state
        found: list[dict[str, Any]] = []
        i = trans_id // TRANS_STEP  # the first base customer with 10 (i + 1) > trans_id
        while len(found) < top and i < self._base_customers:
            if i not in state.changed:
                found.append(self._customer(i))
            i += 1
        position = bisect.bisect_right(state.changed_order, (trans_id, float("inf")))
        while len(found) < top and position < len(state.changed_order):
            changed_trans_id, i = state.changed_order[position]
            if state.changed[i][0] == changed_trans_id:
                found.append(self._customer(i))
            position += 1
        return found

    def _day_sales(self, store_code: str, day: date) -> list[tuple[dict[str, Any], datetime]]:
        if store_code not in self._stores or day < EPOCH:
            return []
        store = self._stores.index(store_code)
        day_index = (day - EPOCH).days
        per_day = self._sales_per_day
        customers = self._base_customers
        seed = zlib.crc32(store_code.encode())
        midnight = datetime(day.year, day.month, day.day, tzinfo=OFFSET)
        sales = []
        for k in range(per_day):
            sold_at = midnight + timedelta(
                minutes=9 * 60 + (k * 720) // per_day, seconds=(k * 37 + store * 11) % 60
            )
            number = (day_index * 100 + store) * 1000 + k
            items = []
            total = Decimal(0)
            for j in range(1 + k % 3):
                quantity = 1 + (k + j) % 2
                price = Decimal(1990 + (k * 97 + j * 53 + store * 7) % 30000) / 100
                total += price * quantity
                items.append(
                    {
                        "produto": f"SKU-{(k * 31 + store * 7 + j * 13) % 500:05d}",
                        "quantidade": quantity,
                        "preco": float(price),
                    }
                )
            customer: int | None = None
            if k % 10 != 9 and customers:
                customer = FIRST_CUSTOMER_ID + (seed + day_index * 7919 + k * 104_729) % customers
            record = _sale_record(number, customer, store_code, sold_at, total, items)
            if self.is_malformed_sale(k):
                kind = ((k + 1) // self._malformed_every) % 3
                if kind == 0:
                    record["valor_final"] = "cento e vinte"
                elif kind == 1:
                    record["data_emissao"] = "/Date(ontem)/"
                else:
                    record["itens"] = "sem itens"
            sales.append((record, sold_at))
        return sales

    def _messaged(self, phone: str, at: datetime) -> dict[str, Any] | None:
        i = self.customer_of_phone(phone)
        if i is None or not self._response_rate or not self._stores:
            return None
        cliente = FIRST_CUSTOMER_ID + i
        key = f"{self._response_seed}:{cliente}:{at.astimezone(UTC):%Y-%m-%dT%H:%M}"
        if zlib.crc32(f"buys:{key}".encode()) % 10_000 >= round(self._response_rate * 10_000):
            return None
        spread = zlib.crc32(f"when:{key}".encode())
        minutes = 60 + spread % (self._response_days * 24 * 60 - 60)
        sold_at = (at + timedelta(minutes=minutes)).astimezone(OFFSET).replace(microsecond=0)
        day = sold_at.date()
        if (cliente, day) in self._state.responded or day < EPOCH:
            return None
        self._state.responded.add((cliente, day))
        store = spread % len(self._stores)
        code = self._stores[store]
        number = RESPONSE_BASE + (((day - EPOCH).days * 100 + store) * 10**7 + i % 10**7)
        price = Decimal(4990 + spread % 25000) / 100
        item = {"produto": f"SKU-{spread % 500:05d}", "quantidade": 1, "preco": float(price)}
        record = _sale_record(number, cliente, code, sold_at, price, [item])
        self._state.responses.setdefault(code, []).append((record, sold_at))
        return dict(record)

    def is_malformed_customer(self, i: int) -> bool:
        k = self._malformed_every
        return bool(k) and (i + 1) % k == 0

    def is_malformed_sale(self, k_of_day: int) -> bool:
        k = self._malformed_every
        return bool(k) and (k_of_day + 1) % k == 0

    def customer_of_phone(self, phone: str) -> int | None:
        """The index of the customer whose mobile `phone` is (any form: E.164, with or without the
        ninth digit), or None."""
        digits = "".join(c for c in phone if c.isdigit())
        if digits.startswith("55") and len(digits) in (12, 13):
            digits = digits[2:]
        if len(digits) not in (10, 11):
            return None
        ddd, last8 = digits[:2], digits[-8:]
        if last8[0] != "9":
            return None
        total = self._base_customers + self._state.added
        first = (int(last8[1:]) * _PHONE_INVERSE) % _PHONE_DIGITS
        for i in range(first, total, _PHONE_DIGITS):
            if i % 7 != 6 and _DDD[i % len(_DDD)] == ddd:
                return i
        return None
