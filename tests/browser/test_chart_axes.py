"""The organization's 30-day chart stops at today: its time axis has no tick past the last day (the
organization's today), whatever the browser's time zone — a tick at tomorrow was seen on the
manager's home page. The page is rendered by Django and drawn by Chromium (uPlot inlined)."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from crm.models import Organization
from tests.browser.conftest import CHROMIUM_ARGS
from tests.conftest import ROOT

UPLOT = ROOT / "crm/static/crm/vendor/uplot/uPlot.iife.min.js"
PAGE = "http://crm.test/dashboard/"
# Every uPlot the page makes, kept where the test can read its axes.
CAPTURE = """
(() => {
  let real;
  window.__charts = [];
  Object.defineProperty(window, "uPlot", {
    configurable: true,
    get() { return real; },
    set(value) {
      real = function (...args) {
        const chart = new value(...args);
        window.__charts.push(chart);
        return chart;
      };
      Object.assign(real, value);
      real.paths = value.paths;
    },
  });
})();
"""


def _inline_uplot(html: str) -> str:
    tag = re.search(r'<script src="[^"]*uPlot\.iife\.min\.js"></script>', html)
    assert tag, "the dashboard loads uPlot"
    return html.replace(tag.group(0), f"<script>{UPLOT.read_text(encoding='utf-8')}</script>")


@pytest.mark.parametrize("browser_zone", ["UTC", "America/Sao_Paulo", "Asia/Tokyo"])
@pytest.mark.django_db
def test_the_thirty_day_chart_has_no_tick_past_today(client, chromium: Path, browser_zone: str) -> None:
    from playwright.sync_api import sync_playwright

    org = Organization.objects.create(name="Loja", slug="loja", timezone="America/Sao_Paulo")
    client.force_login(get_user_model().objects.create_superuser("op", password="pw-op-1234567"))
    html = _inline_uplot(client.get(f"/admin/crm/organization/{org.pk}/dashboard/").content.decode())
    today = timezone.now().astimezone(ZoneInfo(org.timezone)).date()
    chart = re.search(r'id="organization-chart-data"[^>]*>(.*?)</script>', html, re.S)
    assert chart, "the dashboard carries its chart's data"
    data = json.loads(chart.group(1))
    assert data["days"][-1] == today.isoformat()  # the chart data's last point is today

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(chromium), args=CHROMIUM_ARGS)
        try:
            for width in (1440, 800):
                context = browser.new_context(
                    locale="pt-BR", timezone_id=browser_zone, viewport={"width": width, "height": 900}
                )
                page = context.new_page()
                page.add_init_script(CAPTURE)
                page.route(  # the page as Django rendered it; its other assets are left out
                    "http://crm.test/**",
                    lambda route: (
                        route.fulfill(body=html, content_type="text/html")
                        if route.request.url == PAGE
                        else route.abort()
                    ),
                )
                page.goto(PAGE)
                page.wait_for_function("window.__charts.length === 1")
                ticks = page.evaluate("window.__charts[0].axes[0]._splits")
                context.close()
                days = sorted({datetime.fromtimestamp(t, UTC).date() for t in ticks})
                assert ticks and days[-1] <= today, (browser_zone, width, days)
                assert len(ticks) >= 3, ticks  # an axis a person reads, not one tick
        finally:
            browser.close()
