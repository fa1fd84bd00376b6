"""Django system checks of the deployment's settings (`manage.py check`, start-up, the admin).

crm.W001, PUBLIC_URL not https: every campaign email carries a one-click unsubscribe URL built on
PUBLIC_URL (List-Unsubscribe with List-Unsubscribe-Post), and RFC 8058 requires it to be https, so
mail providers ignore an http one (and Gmail and Yahoo require one-click unsubscribe of bulk
senders); tracked links, the open pixel and survey pages would go over plain http too. Not raised
when DEBUG is on (a developer's machine) nor for a loopback PUBLIC_URL (127.0.0.0/8, ::1,
localhost: the embedded demo and the test suite's default http://127.0.0.1:8000), whose links
nobody outside the machine follows anyway.
"""

from __future__ import annotations

import ipaddress
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core import checks
from django.utils.translation import gettext as _


def is_loopback(url: str) -> bool:
    """True when `url`'s host is this machine only (127.0.0.0/8, ::1, localhost, *.localhost)."""
    host = (urlsplit(url).hostname or "").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def public_url_warnings(*, public_url: str, debug: bool) -> list[checks.CheckMessage]:
    """crm.W001 when `public_url` is not https (see the module), else nothing."""
    if debug or public_url.lower().startswith("https://") or is_loopback(public_url):
        return []
    return [
        checks.Warning(
            _(
                "PUBLIC_URL (%(url)s) is not https: the one-click unsubscribe link of every email "
                "must be https (RFC 8058), so mail providers will ignore it; tracked links and survey "
                "pages go over plain http too."
            )
            % {"url": public_url},
            hint=_("Set PUBLIC_URL to the https:// address recipients reach this deployment at."),
            id="crm.W001",
        )
    ]


def check_public_url(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    return public_url_warnings(public_url=settings.PUBLIC_URL, debug=settings.DEBUG)
