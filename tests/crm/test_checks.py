"""crm.W001: a PUBLIC_URL that is not https breaks RFC 8058's one-click unsubscribe; said by
`manage.py check` and on the email settings admin page."""

from __future__ import annotations

from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from crm.checks import public_url_warnings
from crm.models import Organization
from integrations.models import EmailSettings


@pytest.mark.parametrize(
    ("url", "debug", "warns"),
    [
        ("http://crm.lojateste.com.br", False, True),
        ("http://203.0.113.9:8000", False, True),
        ("http://10.0.0.5", False, True),  # private is not loopback: the recipients' devices cannot reach it
        ("https://crm.lojateste.com.br", False, False),
        ("HTTPS://crm.lojateste.com.br", False, False),
        ("http://crm.lojateste.com.br", True, False),  # DEBUG: a developer's machine
        # loopback: the embedded demo (`make run`) and the default (manage.py check in `make test`)
        ("http://127.0.0.1:8000", False, False),
        ("http://127.4.5.6:8000", False, False),
        ("http://[::1]:8000", False, False),
        ("http://localhost:8000", False, False),
        ("http://crm.localhost", False, False),
    ],
)
def test_public_url_warns_only_when_recipients_would_get_a_plain_http_unsubscribe(
    url: str, debug: bool, warns: bool
) -> None:
    warnings = public_url_warnings(public_url=url, debug=debug)
    assert [w.id for w in warnings] == (["crm.W001"] if warns else [])
    if warns:
        assert url in warnings[0].msg and warnings[0].hint


def test_manage_py_check_fails_at_warning_level_with_an_http_public_url(settings, english) -> None:
    settings.DEBUG = False
    settings.PUBLIC_URL = "http://crm.lojateste.com.br"
    with pytest.raises(SystemCheckError, match=r"crm\.W001.*RFC 8058"):
        call_command("check", fail_level="WARNING", stdout=StringIO(), stderr=StringIO())
    # without --fail-level it is a warning, printed, not an error
    err = StringIO()
    call_command("check", stdout=StringIO(), stderr=err)
    assert "crm.W001" in err.getvalue()
    # the default (and the embedded demo's) loopback address passes, as does https
    for url in ("http://127.0.0.1:8000", "https://crm.lojateste.com.br"):
        settings.PUBLIC_URL = url
        out = StringIO()
        call_command("check", fail_level="WARNING", stdout=out, stderr=StringIO())
        assert "no issues" in out.getvalue()


@pytest.fixture
def staff(client, db):
    user = get_user_model().objects.create_user("ops", password="x-pw-1234", is_staff=True, is_superuser=True)
    client.force_login(user)
    return client


def test_the_email_settings_page_shows_the_same_warning(staff, settings, english) -> None:
    org = Organization.objects.create(name="Loja", slug="loja")
    email = EmailSettings.objects.create(organization=org, sender_email="ofertas@loja.example.com.br")
    pages = ("/admin/integrations/emailsettings/", f"/admin/integrations/emailsettings/{email.pk}/change/")
    settings.DEBUG = False
    settings.PUBLIC_URL = "http://crm.lojateste.com.br"
    [warning] = public_url_warnings(public_url=settings.PUBLIC_URL, debug=False)
    for page in pages:
        html = staff.get(page).content.decode()
        assert 'class="warning"' in html and html.count("RFC 8058") == 1
        assert "http://crm.lojateste.com.br" in html and warning.hint in html
    settings.PUBLIC_URL = "https://crm.lojateste.com.br"
    for page in pages:
        assert "RFC 8058" not in staff.get(page).content.decode()
