"""`manage.py membership add|remove|list` and what a membership does to the user's staff flag."""

from __future__ import annotations

from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.core.management import CommandError, call_command
from django.db import IntegrityError, transaction

from crm.models import Membership, Organization

pytestmark = pytest.mark.django_db

User = get_user_model()


def run(*args: str) -> str:
    out = StringIO()
    call_command("membership", *args, stdout=out)
    return out.getvalue()


@pytest.fixture
def orgs() -> tuple[Organization, Organization]:
    return (
        Organization.objects.create(name="Loja A", slug="loja-a"),
        Organization.objects.create(name="Loja B", slug="loja-b"),
    )


def test_add_makes_staff_changes_a_role_and_a_user_belongs_to_several(orgs, english):
    user = User.objects.create_user("marta", password="pw-marta-123")
    assert not user.is_staff
    assert "marta is now manager of loja-a" in run("add", "marta", "loja-a", "--role", "manager")
    user.refresh_from_db()
    assert user.is_staff and not user.is_superuser
    assert "now viewer" in run("add", "marta", "loja-a", "--role", "viewer")
    run("add", "marta", "loja-b", "--role", "manager")
    assert dict(Membership.objects.filter(user=user).values_list("organization__slug", "role")) == {
        "loja-a": "viewer",
        "loja-b": "manager",
    }
    listed = run("list")
    assert "loja-a" in listed and "loja-b" in listed and "marta" in listed
    assert "loja-a" not in run("list", "loja-b")
    with transaction.atomic(), pytest.raises(IntegrityError):  # one role per organization
        Membership.objects.create(user=user, organization=orgs[0], role="manager")


def test_removing_the_last_membership_takes_staff_away_but_not_from_an_operator(orgs, english):
    user = User.objects.create_user("marta", password="pw-marta-123")
    run("add", "marta", "loja-a", "--role", "manager")
    run("add", "marta", "loja-b", "--role", "viewer")
    assert "no longer staff" not in run("remove", "marta", "loja-a")
    user.refresh_from_db()
    assert user.is_staff
    assert "no longer staff" in run("remove", "marta", "loja-b")
    user.refresh_from_db()
    assert not user.is_staff

    operator = User.objects.create_user("ops", password="pw-ops-1234", is_staff=True)
    operator.user_permissions.add(Permission.objects.get(codename="operate_platform"))
    run("add", "ops", "loja-a", "--role", "viewer")
    run("remove", "ops", "loja-a")
    operator.refresh_from_db()
    assert operator.is_staff  # an operator's staff flag is theirs


def test_errors_are_one_line_naming_what_was_not_found(orgs, english):
    User.objects.create_user("marta", password="pw-marta-123")
    with pytest.raises(CommandError, match=r"no user 'joana' \(users: marta\)"):
        run("add", "joana", "loja-a", "--role", "viewer")
    with pytest.raises(CommandError, match=r"no organization 'loja-z' \(organizations: loja-a, loja-b\)"):
        run("add", "marta", "loja-z", "--role", "viewer")
    with pytest.raises(CommandError, match="marta is not a member of loja-a"):
        run("remove", "marta", "loja-a")
    with pytest.raises(CommandError, match="no organization 'loja-z'"):
        run("list", "loja-z")
    with pytest.raises(CommandError):
        run("add", "marta", "loja-a", "--role", "owner")
    assert "no memberships" in run("list")


def test_the_demo_creates_a_manager_login_of_the_demo_organization(settings, tmp_path, english, monkeypatch):
    settings.VAR_DIR = tmp_path
    monkeypatch.delenv("DEMO_MANAGER_PASSWORD", raising=False)
    out = StringIO()
    call_command("demo", customers=2, stdout=out)
    line = next(line for line in out.getvalue().splitlines() if line.startswith("manager login of 'demo'"))
    password = line.rsplit(" / ", 1)[1]
    assert (tmp_path / "demo-manager-password").read_text().strip() == password
    assert oct((tmp_path / "demo-manager-password").stat().st_mode & 0o777) == "0o600"
    manager = User.objects.get(username="demo-manager")
    assert manager.check_password(password) and manager.is_staff and not manager.is_superuser
    assert list(Membership.objects.filter(user=manager).values_list("organization__slug", "role")) == [
        ("demo", "manager")
    ]
    again = StringIO()
    call_command("demo", customers=2, stdout=again)  # idempotent: the same login, the same password
    assert f"demo-manager / {password}" in again.getvalue()
    assert Membership.objects.filter(user=manager).count() == 1
