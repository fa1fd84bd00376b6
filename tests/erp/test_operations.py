"""What operators touch: `erp_sync` with its summary line, `demo --erp-url`, the admin (a write-only
password, the issue list, checking the connection) and key rotation."""

from __future__ import annotations

import re
import subprocess
import sys
from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command

from crm import crypto
from crm.models import Customer, Organization, Sale
from erp import services
from erp.models import ErpConnection, ErpSyncIssue
from project.sandboxes.millennium_data import DEFAULT_PASSWORD, DEFAULT_STORES
from tests.conftest import ROOT, child_env
from tests.erp.conftest import make_world, recent_day


def _run(*args: str) -> str:
    out = StringIO()
    call_command("erp_sync", *args, stdout=out)
    return out.getvalue()


def test_erp_sync_customers_prints_a_summary_line(sandbox_factory, transactional_db, english):
    make_world(sandbox_factory(customers=2500, malformed_every=100))
    out = _run("customers", "--full")
    assert re.search(
        r"^customers \(full\): 2,500 read, 2,475 upserted \(2,475 new, 0 changed\), 25 skipped \(malformed\) "
        r"in \d+\.\ds — high-water trans_id 25000$",
        out.strip(),
    ), out
    out = _run("customers")
    assert out.startswith("customers: 0 read, 0 upserted (0 new, 0 changed), 0 skipped") and "25000" in out


def test_erp_sync_speaks_portuguese_and_keeps_library_logs_out(sandbox_factory, transactional_db):
    make_world(sandbox_factory(customers=2500, malformed_every=100))

    def manage(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, str(ROOT / "manage.py"), *args],
            cwd=ROOT,
            env=child_env(),
            capture_output=True,
            text=True,
            timeout=120,
        )

    done = manage("erp_sync", "customers", "--full")
    assert done.returncode == 0, done.stderr
    assert re.fullmatch(
        r"clientes \(sincronização completa\): 2\.500 lidos, 2\.475 gravados \(2\.475 novos, 0 alterados\), "
        r"25 ignorados \(malformados\) em \d+,\ds — .+ 25000\n",
        done.stdout,
    ), done.stdout
    # No "HTTP Request: GET …" per page, no INFO line repeating the summary in English; the
    # skipped records are warnings, and warnings stay.
    assert "HTTP Request" not in done.stderr and " INFO " not in done.stderr, done.stderr
    verbose = manage("erp_sync", "-v", "2", "customers")
    assert verbose.returncode == 0, verbose.stderr
    assert " INFO erp.services ERP sync: " in verbose.stderr and "HTTP Request" not in verbose.stderr


def test_erp_sync_sales_covers_the_days_and_hours_asked_for(erp, english):
    day = recent_day()
    out = _run("sales", "--store", "002", "--from", f"{day}T10", "--to", f"{day}T11")
    store = erp["stores"][1]
    two_hours = Sale.objects.filter(store=store)
    assert 0 < two_hours.count() < 24
    zone = services.organization_zone(store.organization)
    assert {s.sold_at.astimezone(zone).hour for s in two_hours} <= {10, 11}  # --to is inclusive
    assert f"sales 002: {two_hours.count()} read" in out
    out = _run("sales", "--store", "002", "--org", "teste", "--from", str(day))
    assert Sale.objects.filter(store=store).count() == 24
    assert "sales 002: 24 read, 24 upserted" in out and "surveys scheduled" in out
    with pytest.raises(CommandError, match=r"no store '999'.*001, 002, 003"):
        _run("sales", "--store", "999", "--from", str(day))
    with pytest.raises(CommandError, match="expected YYYY-MM-DD"):
        _run("sales", "--store", "001", "--from", "28/11/2026")
    with pytest.raises(CommandError, match="before"):
        _run("sales", "--store", "001", "--from", str(day), "--to", "2020-01-01")


def test_erp_sync_says_why_when_the_erp_refuses(erp, english):
    erp["connection"].set_password("wrong")
    erp["connection"].save()
    with pytest.raises(CommandError, match="HTTP 401"):
        _run("customers")
    erp["sandbox"].fail_next(1, 503)
    erp["connection"].set_password(DEFAULT_PASSWORD)
    erp["connection"].save()
    with pytest.raises(CommandError, match=r"HTTP 503.*retry later"):
        _run("customers")
    Organization.objects.create(name="Outra", slug="outra")
    ErpConnection.objects.create(
        organization=Organization.objects.get(slug="outra"), base_url="http://x", username="u"
    )
    with pytest.raises(CommandError, match="--org"):
        _run("customers")


def test_demo_points_its_organization_at_the_erp_sandbox(erp_sandbox, transactional_db, english):
    out = StringIO()
    call_command("demo", customers=3, erp_url=erp_sandbox.url, stdout=out)
    call_command("demo", customers=3, erp_url=erp_sandbox.url, stdout=StringIO())
    connection = ErpConnection.objects.get(organization__slug="demo")
    assert connection.base_url == erp_sandbox.url and connection.get_password() == DEFAULT_PASSWORD
    assert set(connection.organization.stores.values_list("erp_code", flat=True)) == set(DEFAULT_STORES)
    assert f"demo ERP -> {erp_sandbox.url}" in out.getvalue()
    _run("customers", "--full")
    day = recent_day()
    for code in DEFAULT_STORES:
        _run("sales", "--store", code, "--from", str(day))
    assert Customer.objects.filter(organization__slug="demo").count() == 3 + 2500
    synced = Sale.objects.filter(organization__slug="demo").exclude(erp_id__startswith="DEMO-")
    assert synced.count() == 3 * 24  # besides the demo customers' own past sales (DEMO-S…)


@pytest.fixture
def staff(client, transactional_db):
    user = get_user_model().objects.create_user("ops", password="x-pw-1234", is_staff=True, is_superuser=True)
    client.force_login(user)
    return client


def test_the_erp_password_is_write_only_in_the_admin_and_encrypted_at_rest(staff, erp_sandbox, english):
    org = Organization.objects.create(name="Loja", slug="loja")
    form = {
        "organization": org.pk,
        "base_url": erp_sandbox.url,
        "username": "millennium",
        "page_size": 1000,
        "timeout_seconds": 30,
        "enabled": "on",
    }
    page = staff.post("/admin/erp/erpconnection/add/", {**form, "password": ""})
    assert page.status_code == 200 and not ErpConnection.objects.exists()  # a password is required
    staff.post("/admin/erp/erpconnection/add/", {**form, "password": DEFAULT_PASSWORD})
    connection = ErpConnection.objects.get()
    assert connection.get_password() == DEFAULT_PASSWORD
    assert DEFAULT_PASSWORD not in connection.password_encrypted
    change = f"/admin/erp/erpconnection/{connection.pk}/change/"
    assert DEFAULT_PASSWORD.encode() not in staff.get(change).content
    staff.post(change, {**form, "page_size": 500, "password": ""})
    connection.refresh_from_db()
    assert (connection.page_size, connection.get_password()) == (500, DEFAULT_PASSWORD)

    answer = staff.post(
        "/admin/erp/erpconnection/",
        {"action": "check_connection", "_selected_action": [connection.pk]},
        follow=True,
    )
    assert "the ERP answered" in answer.content.decode()
    assert len(erp_sandbox.requests()) == 1

    assert (
        "erp.ErpConnection",
        "password_encrypted",
        "erp.ErpConnection.password",
    ) in crypto.ENCRYPTED_FIELDS


def test_sync_issues_are_listed_in_the_admin(staff, sandbox_factory):
    make_world(sandbox_factory(customers=200, malformed_every=100))
    _run("customers", "--full")
    assert ErpSyncIssue.objects.count() == 2
    page = staff.get("/admin/erp/erpsyncissue/")
    assert page.status_code == 200 and "1099" in page.content.decode()
    issue = ErpSyncIssue.objects.get(external_id="1099")
    assert staff.get(f"/admin/erp/erpsyncissue/{issue.pk}/change/").status_code == 200


def test_synced_customers_and_sales_show_their_erp_fields_in_the_admin(staff, erp_sandbox):
    world = make_world(erp_sandbox)
    _run("customers", "--full")
    _run("sales", "--store", "001", "--from", str(recent_day()))
    ana = Customer.objects.get(organization=world["org"], erp_id="1000")
    found = staff.get("/admin/crm/customer/", {"q": ana.cpf_cnpj})
    assert found.status_code == 200 and "ANA SILVA" in found.content.decode()
    page = staff.get(f"/admin/crm/customer/{ana.pk}/change/").content.decode()
    assert ana.cpf_cnpj in page and str(ana.erp_trans_id) in page
    sale = Sale.objects.filter(store=world["store"]).first()
    page = staff.get(f"/admin/crm/sale/{sale.pk}/change/").content.decode()
    assert sale.items[0]["product"] in page
