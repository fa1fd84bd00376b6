"""The admin login, every retailer's door, resists guessing: failed logins lock the account and,
separately, the address they come from; an operator unlocks with a command."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.test import Client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.django_db

LOGIN = "/admin/login/?next=/admin/"


@pytest.fixture(autouse=True)
def _limit(settings) -> None:
    settings.AXES_FAILURE_LIMIT = 3


def _login(username: str, password: str, address: str) -> int:
    """The status of the admin's login POST from `address`: 302 in, 200 refused, 429 locked."""
    client = Client(REMOTE_ADDR=address)
    response = client.post(LOGIN, {"username": username, "password": password, "next": "/admin/"})
    return response.status_code


def _operator(username: str = "operadora") -> str:
    get_user_model().objects.create_user(username, password="Senha-Certa-123", is_staff=True)
    return username


def test_guessing_one_accounts_password_locks_that_account_from_every_address():
    name = _operator()
    assert [_login(name, f"guess-{i}", f"203.0.113.{i}") for i in range(3)] == [200, 200, 429]
    assert _login(name, "Senha-Certa-123", "198.51.100.7") == 429  # the right password, locked
    call_command("axes_reset_username", name)
    assert _login(name, "Senha-Certa-123", "198.51.100.7") == 302


def test_guessing_many_accounts_from_one_address_locks_the_address():
    names = [_operator(f"pessoa{i}") for i in range(4)]
    assert [_login(n, "wrong", "203.0.113.50") for n in names[:3]] == [200, 200, 429]
    assert _login(names[3], "Senha-Certa-123", "203.0.113.50") == 429
    assert _login(names[3], "Senha-Certa-123", "198.51.100.8") == 302  # from elsewhere she gets in
    call_command("axes_reset_ip", "203.0.113.50")
    assert _login(names[3], "Senha-Certa-123", "203.0.113.50") == 302


def test_a_success_clears_the_count():
    name = _operator()
    assert [_login(name, "wrong", "203.0.113.9") for _ in range(2)] == [200, 200]
    assert _login(name, "Senha-Certa-123", "203.0.113.9") == 302
    assert [_login(name, "wrong", "203.0.113.9") for _ in range(2)] == [200, 200]  # not locked


LOCKOUT_LISTS = ["/admin/axes/accessattempt/", "/admin/axes/accesslog/", "/admin/axes/accessfailurelog/"]


def _superuser_client() -> Client:
    user = get_user_model().objects.create_superuser("raiz", password="Senha-Certa-123")
    client = Client()
    client.force_login(user)  # axes: force_login, no authenticate
    return client


def test_the_lockout_lists_filter_by_a_real_address_and_refuse_one_that_is_not():
    name = _operator()
    assert [_login(name, "wrong", address) for address in ("203.0.113.70", "2001:db8::7")] == [200, 200]
    client = _superuser_client()
    for address in ("203.0.113.70", "2001:db8::7"):
        page = client.get("/admin/axes/accessattempt/", {"ip_address": address})
        assert page.status_code == 200 and page.context["cl"].result_count == 1
    both = client.get("/admin/axes/accessattempt/", {"ip_address__in": "203.0.113.70,2001:db8::7"})
    assert both.status_code == 200, (both.status_code, both.get("Location"))
    assert both.context["cl"].result_count == 2
    refused = client.get("/admin/axes/accessattempt/", {"ip_address": "0"})
    assert refused.status_code == 302 and refused["Location"].endswith("?e=1")  # was a 500
    assert client.get("/admin/axes/accessattempt/", {"ip_address__contains": "0"}).status_code == 200


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    url=st.sampled_from(LOCKOUT_LISTS),
    lookup=st.sampled_from(
        ["ip_address", "ip_address__exact", "ip_address__in", "ip_address__gt", "ip_address__range"]
    ),
    value=st.one_of(
        st.text(max_size=40), st.sampled_from(["0", "abc", "1.2.3", "::g", "1.2.3.4,x", "999.1.1.1"])
    ),
)
def test_no_address_in_a_query_string_makes_a_lockout_list_fail(url: str, lookup: str, value: str):
    client = _lockout_client()
    assert client.get(url, {lookup: value}).status_code < 500


def _lockout_client() -> Client:
    user = get_user_model().objects.filter(username="raiz").first()
    if user is None:
        return _superuser_client()
    client = Client()
    client.force_login(user)
    return client
