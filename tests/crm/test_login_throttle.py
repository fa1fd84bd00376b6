"""The admin login, every retailer's door, resists guessing: failed logins lock the account and,
separately, the address they come from; an operator unlocks with a command."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.test import Client

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
