"""Every admin list page the demo manager reaches fits a 1366-px screen: no horizontal scroll of the
page at 1366 x 768, each list screenshotted (var/screenshots/list-<app>-<model>.png) — with the
demo's rows, then with a crowded desk (`crowd`: long names and links, provider errors, amounts in the
millions, every status, more than a page)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from playwright.sync_api import Page

from tests.browser.conftest import MANAGER_PASSWORD, MANAGER_USERNAME, Stack, log_in, screenshot
from tests.browser.crowd import crowd

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
    wide = _wide(page, lists, "list-")
    assert not wide, "lists wider than 1366 px with the demo's rows:\n" + "\n".join(wide)

    held = stack.orm.run(crowd, [tuple(path.split("/")[2:4]) for path in lists], stack.ids["organization"])
    crowded = [label for label, n in held.items() if n > 100]
    assert len(crowded) >= 10, held  # most lists hold more than a page of copies
    wide = _wide(page, lists, "list-crowded-")
    assert not wide, "lists wider than 1366 px with a crowded desk:\n" + "\n".join(wide)


def _wide(page: Page, lists: list[str], prefix: str) -> list[str]:
    """The lists wider than the screen, each screenshotted as `<prefix><app>-<model>`."""
    wide = []
    for path in lists:
        response = page.goto(path)
        assert response is not None and response.ok, f"{path}: {response and response.status}"
        # The page's own width, and the widest list inside it (the admin scrolls a wide table in
        # its box instead of the page).
        width = page.evaluate(
            "Math.max(document.documentElement.scrollWidth, ...Array.from("
            "document.querySelectorAll('#changelist .results, #result_list'), e => "
            "e.getBoundingClientRect().left + e.scrollWidth))"
        )
        screenshot(page, prefix + "-".join(part for part in path.split("/")[2:4] if part))
        if width > WIDTH:
            # Which columns take the room: the header cells of the list, widest first.
            columns = page.eval_on_selector_all(
                "#result_list thead th",
                "cells => cells.map(c => [Array.from(c.classList).find(n => n.startsWith('column-')),"
                " Math.round(c.getBoundingClientRect().width)]).sort((a, b) => b[1] - a[1]).slice(0, 4)",
            )
            wide.append(f"{path}: {width} px ({', '.join(f'{name} {px}' for name, px in columns)})")
    return wide
