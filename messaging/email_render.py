"""Emails: an operator's subject and MJML/HTML body compiled once (per campaign), then rendered
for each recipient (variables, tracked links, open pixel and a plain-text alternative).

Pure: no database, no network, no filesystem. `compile_email` does all the slow work (MJML to HTML,
template checks, finding links, deriving the text part) and leaves the HTML and text split at their
holes; `render_email` evaluates each distinct variable once (Django's own variable and filter code,
autoescaped) and joins the pieces: some 50-100 µs for a 5 KB MJML email.

Operators write these templates, so the template language is locked down: `{{ variable }}` with one
of VARIABLES and the filters in FILTERS, nothing else (no tags, no attribute lookups, no `safe`). The
engine itself knows no tags or other filters either, so a missed check cannot open it up.

Markers: while compiling, each `{{ … }}`, each tracked link and the pixel's place are stood for by a
marker built from a random nonce drawn for that compilation, so nothing an operator or a recipient
could type is ever mistaken for one.
"""

from __future__ import annotations

import html
import re
import secrets
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from html.parser import HTMLParser
from typing import TypeAlias

import mrml
from django.template import Context, Engine, Library, Template, TemplateSyntaxError, defaultfilters
from django.template.base import (
    FilterExpression,
    Lexer,
    Node,
    Parser,
    TokenType,
    Variable,
    filter_re,
)

VARIABLES: tuple[str, ...] = ("first_name", "name", "email", "store_name", "unsubscribe_url")
FILTERS: tuple[str, ...] = ("default", "upper", "lower", "title", "capfirst")
BODY_FORMATS: tuple[str, ...] = ("mjml", "html")
_VARIABLES_HINT = "use " + ", ".join(VARIABLES)
_FILTERS_HINT = "use " + ", ".join(FILTERS)

_TRACKED_TAGS = frozenset({"a", "area"})  # not <link>/<base>: a stylesheet fetch is no click
_ABSOLUTE_URL = re.compile(r"https?://[^\s/?#]", re.IGNORECASE)
_TAG_NAME = re.compile(r"<[^\s/>]*")
# One attribute of a start tag, from the current position: name, then optionally = and a value.
_ATTRIBUTE = re.compile(r"""[\s/]*([^\s/>"'=][^\s/>=]*)(?:\s*=\s*("[^"]*"|'[^']*'|[^\s>]*))?""")
_BLANK_LINES = re.compile(r"\n{3,}")
_WHITESPACE = re.compile(r"\s+")


class TemplateError(ValueError):
    """The subject or body cannot be compiled; the message says what and where, for an operator."""


@dataclass(frozen=True)
class CompiledEmail:
    """A campaign's email ready to render: build it with `compile_email`, once per campaign."""

    subject: Template
    # The body; tracked links and the pixel's place are markers. render_email renders the same content
    # from `_html`, where each distinct variable is evaluated once and the markers are already slots.
    html: Template
    links: tuple[str, ...]  # the tracked link targets, index = position in this tuple
    _variables: tuple[Node, ...] = field(repr=False)  # each distinct {{ … }} of the body, compiled
    _html: _Layout = field(repr=False)
    _text: _Layout = field(repr=False)
    _escaped_links: tuple[str, ...] = field(repr=False)


@dataclass(frozen=True)
class RenderedEmail:
    subject: str
    html: str
    text: str  # plain-text alternative derived from the rendered HTML


def _library() -> Library:
    library = Library()
    for name in FILTERS:
        library.filter(name, getattr(defaultfilters, name))
    return library


_LIBRARY = _library()


class _LockedEngine(Engine):
    """Django's template engine knowing only FILTERS: no tags at all (not even {% load %}), no loaders."""

    def get_template_builtins(self, builtins: list[str]) -> list[Library]:
        return [_LIBRARY]

    def get_template_libraries(self, libraries: dict[str, str]) -> dict[str, Library]:
        return {}


_ENGINE = _LockedEngine(loaders=[], autoescape=True, string_if_invalid="")


# ---------------------------------------------------------------------------------------------------
# Checks on what the operator wrote


def _place(where: str, source: str, lineno: int) -> str:
    return f"{where} (line {lineno})" if "\n" in source else where


def _check_template(source: str, where: str) -> None:
    """Raise TemplateError unless `source` uses only `{{ variable|filter }}` from the allowed sets."""
    parser = Parser([], builtins=[_LIBRARY])
    for token in Lexer(source).tokenize():
        place = _place(where, source, token.lineno or 1)
        if token.token_type is TokenType.BLOCK:
            raise TemplateError(
                f"template tags are not allowed in {place}: '{{% {token.contents} %}}'; use only variables"
                f" like {{{{ first_name }}}}, optionally with the filters {', '.join(FILTERS)}"
            )
        if token.token_type is TokenType.VAR:
            _check_variable(token.contents, parser, place)
        elif token.token_type is TokenType.TEXT:
            _check_unclosed(token.contents, where, source, token.lineno or 1)


def _check_unclosed(text: str, where: str, source: str, lineno: int) -> None:
    found = [index for index in (text.find("{{"), text.find("{%")) if index >= 0]
    if found:
        place = _place(where, source, lineno + text.count("\n", 0, min(found)))
        raise TemplateError(
            f"unclosed '{{{{' or '{{%' in {place}: a variable opens and closes on one line,"
            " like {{ first_name }}"
        )


def _check_variable(contents: str, parser: Parser, place: str) -> None:
    if not contents:
        raise TemplateError(f"empty variable '{{{{ }}}}' in {place}; {_VARIABLES_HINT}")
    for match in filter_re.finditer(contents):
        name = match["filter_name"]
        if name and name not in FILTERS:
            raise TemplateError(
                f"filter '{name}' is not allowed in {place} ('{{{{ {contents} }}}}'); {_FILTERS_HINT}"
            )
    try:
        expression = FilterExpression(contents, parser)
    except TemplateSyntaxError as exc:
        raise TemplateError(f"invalid variable '{{{{ {contents} }}}}' in {place}: {exc}") from None
    _check_name(expression.var, contents, place)
    for _filter, arguments in expression.filters:
        for is_variable, argument in arguments:
            if is_variable:
                _check_name(argument, contents, place)


def _check_name(variable: object, contents: str, place: str) -> None:
    if not isinstance(variable, Variable) or variable.lookups is None or variable.translate:
        raise TemplateError(f"'{{{{ {contents} }}}}' in {place} is not a variable; {_VARIABLES_HINT}")
    name = ".".join(variable.lookups)
    if name not in VARIABLES:
        raise TemplateError(f"unknown variable '{name}' in {place}; {_VARIABLES_HINT}")


def _compile(source: str, where: str) -> Template:
    try:
        return _ENGINE.from_string(source)
    except TemplateSyntaxError as exc:  # the checks above should have said it better
        raise TemplateError(f"{where}: {exc}") from None


def _compile_subject(subject: str) -> Template:
    if not subject.strip():
        raise TemplateError("the subject is empty")
    if "\r" in subject or "\n" in subject:
        raise TemplateError("the subject has a line break; it must be a single line")
    _check_template(subject, "the subject")
    return _compile(subject, "the subject")


def _body_html(body: str, body_format: str) -> str:
    """The body as checked HTML: MJML compiled with mrml (includes refused), HTML as is."""
    if body_format not in BODY_FORMATS:
        raise TemplateError(f"unknown body format {body_format!r}; use {' or '.join(BODY_FORMATS)}")
    if not body.strip():
        raise TemplateError("the body is empty")
    _check_template(body, "the body")  # first on the source: its line numbers are the operator's
    if body_format == "html":
        return body
    options = mrml.ParserOptions(include_loader=mrml.noop_loader())
    try:
        compiled = mrml.to_html(body, parser_options=options).content
    except Exception as exc:  # mrml raises OSError, but any failure there is the MJML's
        raise TemplateError(f"the MJML body does not compile: {exc}") from None
    _check_template(compiled, "the body compiled from MJML")
    return compiled


# ---------------------------------------------------------------------------------------------------
# Markers and slots


@dataclass(frozen=True)
class _Markers:
    """Markers for one compilation: variable k, tracked link i, a link's URL in the text part, the pixel."""

    nonce: str

    @classmethod
    def for_source(cls, source: str) -> _Markers:
        nonce = "crm" + secrets.token_hex(8)
        while nonce in source:  # never in practice; guarantees a marker only comes from us
            nonce = "crm" + secrets.token_hex(8)
        return cls(nonce)

    def variable(self, index: int) -> str:
        return f"{self.nonce}v{index}_"

    def link(self, index: int) -> str:
        return f"{self.nonce}l{index}_"

    def shown_url(self, index: int) -> str:
        return f"{self.nonce}u{index}_"

    @property
    def pixel(self) -> str:
        return f"{self.nonce}p_"

    def pattern(self, kinds: str) -> re.Pattern[str]:
        """Markers of these kinds (letters): group 1 the kind, group 2 the index (None for the pixel)."""
        return re.compile(re.escape(self.nonce) + f"([{kinds}])" + r"(\d+)?_")


@dataclass(frozen=True)
class _Layout:
    """A part ready to fill per recipient: literal text with holes, each hole a slot (a variable's value,
    a link's URL, the pixel) or a templated link's URL in the text part."""

    parts: tuple[str, ...]  # "" at each hole
    slots: tuple[tuple[int, int], ...]  # (hole, slot)
    shown_urls: tuple[tuple[int, _ShownUrl], ...]  # (hole, URL)

    def fill(self, values: Sequence[str]) -> str:
        parts = list(self.parts)
        for hole, slot in self.slots:
            parts[hole] = values[slot]
        for hole, url in self.shown_urls:
            parts[hole] = url.render(values)
        return "".join(parts)


@dataclass(frozen=True)
class _ShownUrl:
    """' (url)' after a templated link's text in the text part, when the rendered href is absolute;
    nothing when it comes out empty, relative, mailto: …"""

    url: _Layout

    def render(self, values: Sequence[str]) -> str:
        url = self.url.fill(values).strip()
        return f" ({url})" if _ABSOLUTE_URL.match(url) else ""


# What marked text becomes: literal text, a slot (int) or a templated link's URL.
_Piece: TypeAlias = str | int | _ShownUrl


def _layout(pieces: Sequence[_Piece]) -> _Layout:
    parts: list[str] = []
    slots: list[tuple[int, int]] = []
    shown_urls: list[tuple[int, _ShownUrl]] = []
    literal = False  # whether parts[-1] is literal text, to extend
    for piece in pieces:
        if isinstance(piece, str) and literal:
            parts[-1] += piece
        elif isinstance(piece, str):
            parts.append(piece)
        elif isinstance(piece, int):
            slots.append((len(parts), piece))
            parts.append("")
        else:
            shown_urls.append((len(parts), piece))
            parts.append("")
        literal = isinstance(piece, str)
    return _Layout(tuple(parts), tuple(slots), tuple(shown_urls))


@dataclass(frozen=True)
class _Slots:
    """Turns marked text into a layout; a render's slots: the variables' values, links' URLs, the pixel."""

    markers: _Markers
    variables: int
    links: int
    shown_urls: tuple[str, ...] = ()  # the text part's link hrefs, by shown_url marker

    def layout(self, text: str) -> _Layout:
        return _layout(self._pieces(text))

    def _pieces(self, text: str) -> list[_Piece]:
        split = self.markers.pattern("vlpu").split(text)  # literal, then (kind, index, literal) per marker
        pieces: list[_Piece] = [split[0]]
        for kind, index, literal in zip(split[1::3], split[2::3], split[3::3], strict=True):
            pieces += [*self._marker(kind, int(index or 0)), literal]
        return pieces

    def _marker(self, kind: str, index: int) -> list[_Piece]:
        if kind == "v":
            return [index]
        if kind == "l":
            return [self.variables + index]
        if kind == "p":
            return [self.variables + self.links]
        return self._shown_url(self.shown_urls[index].strip())

    def _shown_url(self, href: str) -> list[_Piece]:
        """A link's URL after its text: decided now, unless the href holds variables."""
        if self.markers.pattern("v").search(href):
            return [_ShownUrl(self.layout(href))]
        if self.markers.pattern("l").search(href) or _ABSOLUTE_URL.match(href):
            return [" (", *self._pieces(href), ")"]
        return []  # mailto:, tel:, anchors, relative


def _mark_variables(source: str, markers: _Markers) -> tuple[str, list[str]]:
    """`source` with each `{{ … }}` replaced by a marker (so an HTML parser reads plain HTML) and the
    distinct variables' contents, by marker index; `{# comments #}` are dropped."""
    parts: list[str] = []
    expressions: dict[str, int] = {}
    for token in Lexer(source).tokenize():
        if token.token_type is TokenType.TEXT:
            parts.append(token.contents)
        elif token.token_type is TokenType.VAR:
            parts.append(markers.variable(expressions.setdefault(token.contents, len(expressions))))
    return "".join(parts), list(expressions)


def _variable_node(expression: str) -> Node:
    return _compile("{{ " + expression + " }}", "the body").nodelist[0]


# ---------------------------------------------------------------------------------------------------
# Links and the pixel's place


class _TagScanner(HTMLParser):
    """Where the start tags that may carry a tracked href are, and where the last </body> is.
    Comments (MSO conditionals included), <style> and <script> contents are not tags, so never seen."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[tuple[int, int], str]] = []  # ((line, column), the tag's source)
        self.body_end: tuple[int, int] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        source = self.get_starttag_text()
        if tag in _TRACKED_TAGS and source is not None:
            self.tags.append((self.getpos(), source))

    def handle_endtag(self, tag: str) -> None:
        if tag == "body":
            self.body_end = self.getpos()


def _href_values(tag: str) -> Iterator[tuple[int, int, str]]:
    """(start, end, value as written) of each href attribute's value in a start tag's source."""
    name = _TAG_NAME.match(tag)
    position = name.end() if name else 0
    while position < len(tag):
        match = _ATTRIBUTE.match(tag, position)
        if match is None or match.end() == position:
            position += 1
            continue
        if match[1].lower() == "href" and match[2] is not None:
            yield match.start(2), match.end(2), match[2]
        position = match.end()


def _link_target(value: str, markers: _Markers) -> str | None:
    """The target of an href value as written, when it is tracked: absolute http(s), no variable."""
    target = html.unescape(value[1:-1] if value[:1] in ("'", '"') else value).strip()
    if markers.nonce in target or "{{" in target or "{%" in target:
        return None
    return target if _ABSOLUTE_URL.match(target) else None


def _offsets(text: str) -> Callable[[tuple[int, int]], int]:
    line_starts = [0] + [match.end() for match in re.finditer("\n", text)]
    return lambda position: line_starts[position[0] - 1] + position[1]


def _track_links(marked: str, markers: _Markers) -> tuple[str, tuple[str, ...]]:
    """`marked` with tracked href values replaced by link markers and the pixel's marker inserted
    before </body> (or appended), and the tracked targets (identical targets share one index)."""
    scanner = _TagScanner()
    scanner.feed(marked)
    scanner.close()
    offset = _offsets(marked)
    indexes: dict[str, int] = {}
    edits: list[tuple[int, int, str]] = []
    for position, tag in scanner.tags:
        start = offset(position)
        if not marked.startswith(tag, start):  # cannot happen: the parser reports where the tag is
            continue
        for value_start, value_end, value in _href_values(tag):
            target = _link_target(value, markers)
            if target is not None:
                index = indexes.setdefault(target, len(indexes))
                edits.append((start + value_start, start + value_end, f'"{markers.link(index)}"'))
    pixel_at = offset(scanner.body_end) if scanner.body_end else len(marked)
    edits.append((pixel_at, pixel_at, markers.pixel))
    return _apply(marked, edits), tuple(indexes)


def _apply(text: str, edits: Sequence[tuple[int, int, str]]) -> str:
    parts: list[str] = []
    done = 0
    for start, end, replacement in sorted(edits):
        parts += [text[done:start], replacement]
        done = end
    parts.append(text[done:])
    return "".join(parts)


# ---------------------------------------------------------------------------------------------------
# Plain-text alternative: derived once from the marked HTML, as if from each rendered HTML

_SKIPPED = frozenset({"head", "style", "script", "title"})
_BLOCKS = frozenset({"p", "div", "tr", "h1", "h2", "h3", "h4", "h5", "h6", "li", "ul", "ol", "table"})
_BREAKS = _BLOCKS | {"br", "hr"}  # a line break at the start tag (br and hr have no end tag)
_CELLS = frozenset({"td", "th"})  # a space between cells


class _TextExtractor(HTMLParser):
    """Visible text, a line break around each block, and after each link's text a marker for its URL.
    Comments (the MSO conditionals), <head>, <style>, <script> and images are dropped; entities come
    out unescaped (HTMLParser's convert_charrefs)."""

    def __init__(self, markers: _Markers) -> None:
        super().__init__(convert_charrefs=True)
        self.markers = markers
        self.parts: list[str] = []
        self.urls: list[str] = []  # each link's href, by shown_url marker
        self.skipping = 0
        self.open_links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "body":
            self.skipping = 0  # a <head> left open ends here
        if tag in _SKIPPED:
            self.skipping += 1
        elif self.skipping:
            return
        elif tag in _BREAKS:
            self.parts.append("\n")
        elif tag in _CELLS:
            self.parts.append(" ")
        elif tag == "a":
            self.urls.append(dict(attrs).get("href") or "")
            self.open_links.append(self.markers.shown_url(len(self.urls) - 1))

    def handle_endtag(self, tag: str) -> None:
        if tag in _SKIPPED:
            self.skipping = max(0, self.skipping - 1)
        elif self.skipping:
            return
        elif tag in _BLOCKS:
            self.parts.append("\n")
        elif tag == "a" and self.open_links:
            self.parts.append(self.open_links.pop())

    def handle_data(self, data: str) -> None:
        if not self.skipping:
            self.parts.append(_WHITESPACE.sub(" ", data))


def _extract_text(marked_html: str, markers: _Markers) -> tuple[str, tuple[str, ...]]:
    """The text part with its markers (variables, links' shown URLs), and the links' hrefs."""
    extractor = _TextExtractor(markers)
    extractor.feed(marked_html)
    extractor.close()
    return _tidy_text("".join(extractor.parts).replace(markers.pixel, "")), tuple(extractor.urls)


def _tidy_text(text: str) -> str:
    lines = (" ".join(line.split()) for line in text.split("\n"))
    return _BLANK_LINES.sub("\n\n", "\n".join(lines)).strip()


# ---------------------------------------------------------------------------------------------------
# The interface


def compile_email(*, subject: str, body: str, body_format: str) -> CompiledEmail:
    """Check and compile a campaign's email, once per campaign; TemplateError says what is wrong.

    `body_format` is "mjml" (compiled with mrml) or "html" (used as is). Every href of an <a> or
    <area> holding an absolute http(s) URL without variables becomes a tracked link (`links`); mailto:,
    tel:, anchors, relative URLs, templated ones such as {{ unsubscribe_url }}, other tags' hrefs
    (<link> stylesheets) and anything inside comments (MSO conditionals), <style> or <script> are left
    alone.
    """
    subject_template = _compile_subject(subject)
    source = _body_html(body, body_format)
    markers = _Markers.for_source(source)
    marked, expressions = _mark_variables(source, markers)
    tracked, links = _track_links(marked, markers)
    slots = _Slots(markers, variables=len(expressions), links=len(links))
    text, shown_urls = _extract_text(tracked, markers)

    def template_variable(match: re.Match[str]) -> str:
        return "{{ " + expressions[int(match[2])] + " }}"

    return CompiledEmail(
        subject=subject_template,
        html=_compile(markers.pattern("v").sub(template_variable, tracked), "the body"),
        links=links,
        _variables=tuple(_variable_node(expression) for expression in expressions),
        _html=slots.layout(tracked),
        _text=replace(slots, shown_urls=shown_urls).layout(text),
        _escaped_links=tuple(html.escape(target) for target in links),
    )


def render_email(
    compiled: CompiledEmail, *, variables: dict[str, str], click_url: str, open_pixel_url: str | None
) -> RenderedEmail:
    """The email for one recipient.

    `variables` holds values for VARIABLES (missing ones render as ""): HTML-escaped in the body, as
    they are in the subject (a header, so line breaks in a value become spaces). Tracked link i points
    at f"{click_url}/{i}"; with `open_pixel_url` a 1x1 image is added before </body>.

    For a preview pass click_url="" (links keep their real targets) and open_pixel_url=None.
    """
    values = {name: str(variables.get(name) or "") for name in VARIABLES}
    context = Context(values)  # autoescaped
    with context.bind_template(compiled.html):  # as Template.render does (string_if_invalid)
        escaped = [node.render(context) for node in compiled._variables]
    if click_url:
        urls = [f"{click_url}/{index}" for index in range(len(compiled.links))]
        html_urls = [html.escape(url) for url in urls]
    else:
        urls, html_urls = list(compiled.links), list(compiled._escaped_links)
    pixel = _pixel(open_pixel_url) if open_pixel_url else ""
    text_values = [" ".join(html.unescape(value).split()) for value in escaped]
    return RenderedEmail(
        subject=_render_subject(compiled.subject, values),
        html=compiled._html.fill([*escaped, *html_urls, pixel]),
        text=_tidy_text(compiled._text.fill([*text_values, *urls, ""])),
    )


def _render_subject(subject: Template, values: dict[str, str]) -> str:
    header_values = {name: " ".join(value.splitlines()) for name, value in values.items()}
    rendered = subject.render(Context(header_values, autoescape=False))
    return " ".join(rendered.splitlines()).strip()


def _pixel(url: str) -> str:
    return f'<img src="{html.escape(url)}" width="1" height="1" alt="" style="display:none" border="0">'
