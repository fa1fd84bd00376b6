"""The Millennium client: values (dates, CPF/CNPJ, phones) as pure logic, paging and errors against
the sandbox over loopback."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from integrations.errors import IntegrationError
from integrations.millennium.client import (
    MillenniumClient,
    cnpj_check_digits,
    format_date,
    mobile_e164,
    normalize_cpf_cnpj,
    parse_date,
)
from project.sandboxes.millennium import MillenniumSandbox
from project.sandboxes.millennium_data import DEFAULT_PASSWORD, DEFAULT_USERNAME, OFFSET


def client_for(server: MillenniumSandbox, **kwargs) -> MillenniumClient:
    return MillenniumClient(
        base_url=server.url,
        username=kwargs.pop("username", DEFAULT_USERNAME),
        password=kwargs.pop("password", DEFAULT_PASSWORD),
        **kwargs,
    )


# --- values (pure logic) -------------------------------------------------------------------------


def test_dates_are_read_as_utc_milliseconds_in_the_writers_offset():
    when = parse_date("/Date(1700000000000-0300)/")
    assert when == datetime(2023, 11, 14, 22, 13, 20, tzinfo=UTC)
    assert when.utcoffset() == timedelta(hours=-3)
    assert parse_date("/Date(1700000000000+0530)/").utcoffset() == timedelta(hours=5, minutes=30)
    assert parse_date("/Date(1700000000000)/").tzinfo is UTC
    assert parse_date("/Date(-86400000-0300)/") == datetime(1969, 12, 31, tzinfo=UTC)
    assert format_date(when) == "/Date(1700000000000-0300)/"
    assert parse_date("2026-11-28T10:00:00-03:00") == datetime(2026, 11, 28, 13, tzinfo=UTC)
    for bad in ("/Date(abc)/", "/Date(1700000000000-03)/", "2026-11-28T10:00:00", "", None, 1700000000000):
        with pytest.raises(ValueError):
            parse_date(bad)


def test_cpf_and_cnpj_lose_their_punctuation_and_must_have_valid_check_digits():
    assert normalize_cpf_cnpj("529.982.247-25") == "52998224725"
    assert normalize_cpf_cnpj("52998224725") == "52998224725"
    assert normalize_cpf_cnpj(1234567890) == "01234567890"  # a numeric column lost the leading zero
    assert normalize_cpf_cnpj("11.222.333/0001-81") == "11222333000181"
    assert normalize_cpf_cnpj("12.abc.345/01de-35") == "12ABC34501DE35"  # alphanumeric CNPJ (2026)
    assert cnpj_check_digits("12ABC34501DE") == "35"
    assert normalize_cpf_cnpj("") == normalize_cpf_cnpj(None) == ""
    for bad in (
        "529.982.247-26",
        "111.111.111-11",
        "00000000000",
        "11.222.333/0001-82",
        "12ABC34501DE36",
        "123",
    ):
        with pytest.raises(ValueError, match=r"invalid|not a CPF"):
            normalize_cpf_cnpj(bad)
    with pytest.raises(ValueError, match="not text"):
        normalize_cpf_cnpj(["52998224725"])


def test_mobiles_are_built_into_e164_from_area_code_and_number():
    assert mobile_e164("11", "98765-4321") == "+5511987654321"
    assert mobile_e164("(011)", "8765-4321") == "+5511987654321"  # old 8-digit mobile: the 9 is added
    assert mobile_e164("", "(21) 99876-5432") == "+5521998765432"  # the number carries its area code
    assert mobile_e164("47", "+55 21 99876-5432") == "+5521998765432"
    assert mobile_e164("11", "") == mobile_e164(None, None) == ""
    assert mobile_e164("11", "123") == ""
    assert mobile_e164("00", "987654321") == ""  # no such area code


# --- paging and errors (the sandbox over loopback) -----------------------------------------------


def test_pages_follow_the_trans_id_cursor_and_stop_when_it_does_not_advance(sandbox_factory):
    server = sandbox_factory(customers=2500)
    with client_for(server) as erp:
        pages = list(erp.customer_pages(trans_id=0, top=1000))
    assert [len(p.records) for p in pages] == [1000, 1000, 500]
    assert [(p.trans_id, p.next_trans_id) for p in pages] == [(0, 10_000), (10_000, 20_000), (20_000, 25_000)]
    asked = [r["params"] for r in server.requests()]
    # The fourth request finds nothing after the last trans_id, and the walk ends.
    assert [a["trans_id"] for a in asked] == ["0", "10000", "20000", "25000"]
    assert all(a["$top"] == "1000" and a["$format"] == "json" for a in asked)
    first = pages[0].records[0]
    assert (first.erp_id, first.trans_id, first.name) == ("1000", 10, "ANA SILVA")
    assert first.phone.startswith("+5511") and len(first.cpf_cnpj) == 11
    assert first.registered_at == datetime(2015, 1, 1, 9, 0, tzinfo=OFFSET)
    assert len({c.erp_id for p in pages for c in p.records}) == 2500

    # Resuming after a given trans_id starts there.
    server.clear_requests()
    with client_for(server) as erp:
        rest = list(erp.customer_pages(trans_id=24_000, top=1000))
    assert [c.trans_id for c in rest[0].records][:2] == [24_010, 24_020]
    assert sum(len(p.records) for p in rest) == 100


def test_a_malformed_record_is_reported_and_the_rest_of_the_page_goes_on(sandbox_factory):
    server = sandbox_factory(customers=300, malformed_every=100)
    with client_for(server) as erp:
        (page,) = list(erp.customer_pages(top=1000))
    assert len(page.records) == 297
    reasons = sorted(m.reason for m in page.malformed)
    assert len(reasons) == 3
    assert any("invalid CPF" in r for r in reasons)
    assert any("/Date" in r for r in reasons)
    assert any(r == "no cliente" for r in reasons)
    broken = {m.trans_id: m for m in page.malformed}
    assert set(broken) == {1000, 2000, 3000}
    assert broken[1000].external_id == "1099" and '"cliente": 1099' in broken[1000].excerpt
    # The malformed records still count for the cursor: paging never stalls on them.
    assert page.next_trans_id == 3000


def test_sales_are_asked_per_store_and_window(sandbox_factory):
    server = sandbox_factory(customers=100, sales_per_day=24)
    day = datetime(2026, 11, 28, tzinfo=OFFSET)
    with client_for(server) as erp:
        whole_day = [
            s
            for p in erp.sale_pages(store_code="002", start=day, end=day + timedelta(days=1), top=10)
            for s in p.records
        ]
        hour = [
            s
            for p in erp.sale_pages(
                store_code="002", start=day + timedelta(hours=10), end=day + timedelta(hours=11)
            )
            for s in p.records
        ]
        unknown = list(erp.sale_pages(store_code="999", start=day, end=day + timedelta(days=1)))
    assert len(whole_day) == 24
    assert [s.trans_id for s in whole_day] == sorted(s.trans_id for s in whole_day)
    assert {s.store_code for s in whole_day} == {"002"}
    assert all(day <= s.sold_at < day + timedelta(days=1) for s in whole_day)
    assert sum(1 for s in whole_day if not s.customer_erp_id) == 2  # every tenth sale is anonymous
    assert hour and all(day + timedelta(hours=10) <= s.sold_at < day + timedelta(hours=11) for s in hour)
    assert unknown == []
    sale = whole_day[0]
    assert sale.total == sum(i.quantity * i.price for i in sale.items)
    asked = server.requests()[0]["params"]
    assert asked["filial"] == "002"
    assert asked["data_inicial"] == "2026-11-28T00:00:00-03:00"
    assert asked["data_final"] == "2026-11-29T00:00:00-03:00"


def test_5xx_and_timeouts_are_retryable_4xx_and_broken_answers_are_not(sandbox_factory):
    server = sandbox_factory(customers=10)
    server.fail_next(1, 503)
    with client_for(server) as erp, pytest.raises(IntegrationError) as failure:
        list(erp.customer_pages())
    assert failure.value.retryable and failure.value.status == 503

    with client_for(server, password="wrong") as erp, pytest.raises(IntegrationError) as failure:
        list(erp.customer_pages())
    assert not failure.value.retryable and failure.value.status == 401

    with client_for(server) as erp, pytest.raises(IntegrationError) as failure:
        list(erp.customer_pages(top=100_000))  # the server refuses the page size
    assert not failure.value.retryable and failure.value.status == 400

    server.set_latency(5000)
    with client_for(server, timeout=0.3) as erp, pytest.raises(IntegrationError) as failure:
        list(erp.customer_pages())
    assert failure.value.retryable and "timed out" in str(failure.value)  # it gave up, not the answer
    server.set_latency(0)

    with client_for(server) as erp, pytest.raises(IntegrationError) as failure:
        erp.list_values("/api/millenium/nao_existe", {}, top=1)
    assert not failure.value.retryable and failure.value.status == 404

    # Nothing listens here any more: a network error, retryable.
    url = server.url
    server.stop()
    with (
        MillenniumClient(base_url=url, username="u", password="p", timeout=1) as erp,
        pytest.raises(IntegrationError) as failure,
    ):
        list(erp.customer_pages())
    assert failure.value.retryable


def test_the_sandbox_is_deterministic_for_any_number_of_customers(sandbox_factory):
    big = sandbox_factory(customers=5_000_000)
    other = sandbox_factory(customers=5_000_000)
    with client_for(big) as a, client_for(other) as b:
        near_end_a = next(a.customer_pages(trans_id=49_999_000, top=1000))
        near_end_b = next(b.customer_pages(trans_id=49_999_000, top=1000))
    assert near_end_a.records == near_end_b.records
    assert len(near_end_a.records) == 100 and near_end_a.next_trans_id == 50_000_000
    assert big.sales_of_day("001", datetime(2026, 11, 28).date()) == other.sales_of_day(
        "001", datetime(2026, 11, 28).date()
    )


def test_later_changes_come_after_every_earlier_trans_id(sandbox_factory):
    server = sandbox_factory(customers=50)
    server.touch_customers([3])
    added = server.add_customers(2)
    assert added == [1050, 1051]
    with client_for(server) as erp:
        (page,) = list(erp.customer_pages(trans_id=500, top=100))
    assert [c.erp_id for c in page.records] == ["1003", "1050", "1051"]
    assert page.records[0].email.endswith(".v1@example.com.br")
    assert [c.trans_id for c in page.records] == [501, 502, 503]
    assert server.last_trans_id() == 503


def test_dates_in_another_offset_keep_their_instant():
    ms = parse_date("/Date(1764330000000+0000)/")
    local = ms.astimezone(timezone(timedelta(hours=-3)))
    assert format_date(local) == "/Date(1764330000000-0300)/"


def test_the_mobile_fast_path_agrees_with_phonenumbers_for_every_area_code():
    import random

    import phonenumbers

    rng = random.Random(7)
    for area in range(10, 100):
        for _ in range(20):
            number = "9" + "".join(rng.choice("0123456789") for _ in range(8))
            parsed = phonenumbers.parse(f"+55{area}{number}")
            expected = (
                phonenumbers.format_number(parsed, phonenumbers.PhoneNumberFormat.E164)
                if phonenumbers.is_valid_number(parsed)
                else ""
            )
            assert mobile_e164(str(area), number) == expected, (area, number)
