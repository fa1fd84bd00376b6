"""A crawl of the admin from its home page, one page per URL shape, for tests that read every page a
user reaches: what machines read on each page (attributes, scripts), the lists' result cells, and
the words a person reads."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from urllib.parse import urljoin, urlsplit

# Attributes that are words for a person.
HUMAN = {"title", "alt", "aria-label", "placeholder", "data-filter-title"}
# Links a crawl must not follow: they end the session or change state on GET (none should).
SKIP = re.compile(r"/(logout|password_change|delete|password)/|/admin/r/|^/admin/jsi18n")
PAGES = 400
# Elements whose text is data or code, not the product's words: a form's current value, a record
# as the provider sent it.
VERBATIM = {"script", "style", "textarea", "pre", "code"}


class Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.links: list[str] = []
        self.machine: list[str] = []  # what a URL, a form or a script reads
        self.cells: list[str] = []  # the text of the lists' result cells
        self.words: list[str] = []  # text a person reads (not data shown verbatim)
        self._open: list[str] = []
        self._script = False
        self._cell = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if value and name not in HUMAN:
                self.machine.append(f"<{tag} {name}={value!r}>")
            elif value and name in HUMAN:
                self.words.append(value)
            if name == "href" and value:
                self.links.append(value)
        self._script = tag == "script"
        if tag in VERBATIM:
            self._open.append(tag)
        if tag == "td":
            self._cell += 1
            self.cells.append("")

    def handle_endtag(self, tag: str) -> None:
        self._script = False
        if tag in VERBATIM and tag in self._open:
            self._open.remove(tag)
        if tag == "td" and self._cell:
            self._cell -= 1

    def handle_data(self, data: str) -> None:
        if self._script:
            self.machine.append(f"<script>{data}")
        elif self._cell:
            self.cells[-1] += data
        if not self._open and data.strip():
            self.words.append(" ".join(data.split()))


def shape(path: str) -> str:
    return re.sub(r"\d+", "N", path)


def crawl(
    client, start: str = "/admin/", *, refused: list[str] | None = None, **headers: str
) -> dict[str, Page]:
    """Every admin page reachable from `start` (one per URL shape), parsed, by URL. A link that
    answers 403 fails, unless `refused` is given: then it is listed there."""
    seen: set[str] = set()
    queue = [start]
    pages: dict[str, Page] = {}
    while queue and len(seen) < PAGES:
        url = queue.pop(0)
        path_shape = shape(urlsplit(url).path)
        if path_shape in seen:
            continue
        seen.add(path_shape)
        response = client.get(url, **headers)
        if response.status_code == 403 and refused is not None:
            refused.append(url)
            continue
        assert response.status_code in (200, 302), f"{url}: {response.status_code}"
        if response.status_code != 200 or "html" not in response.get("Content-Type", ""):
            continue
        page = Page()
        page.feed(response.content.decode())
        pages[url] = page
        for href in page.links:
            target = urljoin(url, href)
            parts = urlsplit(target)
            if parts.netloc or not parts.path.startswith("/admin/") or SKIP.search(parts.path):
                continue
            if shape(parts.path) not in seen:
                queue.append(target)
    return pages
