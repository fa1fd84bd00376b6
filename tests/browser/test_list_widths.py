"""Every admin list page the demo manager reaches fits a 1366-px screen: no horizontal scroll of the
page at 1366 x 768, each list screenshotted (var/screenshots/list-<app>-<model>.png)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from playwright.sync_api import Page

from tests.browser.conftest import MANAGER_PASSWORD, MANAGER_USERNAME, Stack, log_in, screenshot

pytestmark = pytest.mark.slow

WIDTH = 1366


def test_every_list_page_fits_1366_px_for_the_demo_manager(
    stack: Stack, new_page: Callable[..., Page]
) -> None:
    page = new_page(width=WIDTH, height=768)
    log_in(page, MANAGER_USERNAME, MANAGER_PASSWORD)
    page.goto("/admin/")
    screenshot(page, "list-home-manager")
    lists = sorted(
        set(
            page.eval_on_selector_all(
                "#content-main .module tr[class^=model-] th a",
                "links => links.map(a => new URL(a.href).pathname)",
            )
        )
    )
    assert len(lists) >= 10, lists
    wide = []
    for path in lists:
        page.goto(path)
        # The page's own width, and the widest list inside it (the admin scrolls a wide table in
        # its box instead of the page).
        width = page.evaluate(
            "Math.max(document.documentElement.scrollWidth, ...Array.from("
            "document.querySelectorAll('#changelist .results, #result_list'), e => "
            "e.getBoundingClientRect().left + e.scrollWidth))"
        )
        name = "list-" + "-".join(part for part in path.split("/")[2:4] if part)
        screenshot(page, name)
        if width > WIDTH:
            wide.append(f"{path}: {width} px")
    assert not wide, "lists wider than 1366 px:\n" + "\n".join(wide)
