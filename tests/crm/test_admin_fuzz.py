"""Whatever an organization's people (or an operator) put in a list's query string or a form's
fields, the admin answers below 500: generated from the admin registry (every list's search, filters,
ordering, date hierarchy and page; every add and change form's fields), bounded to run in a minute."""

from __future__ import annotations

from html.parser import HTMLParser
from typing import Any

import pytest
from django.contrib import admin
from django.contrib.admin.views.main import ChangeList
from django.db import models
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.crm.test_tenancy_matrix import World, world  # noqa: F401  (the two organizations' world)

pytestmark = [pytest.mark.django_db, pytest.mark.slow]

FUZZ = settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
ROLES = ("superuser", "operator", "manager", "viewer")
# The classics: not a number, not a date, out of every range, NUL, wildcards, markup, JSON.
CLASSICS = [
    "",
    "0",
    "-1",
    "abc",
    "2026-02-30",
    "0001-01-01",
    "9999-12-31",
    "1e400",
    "NaN",
    "99999999999999999999999",
    "99999",  # a year past datetime's range
    "2147483648",  # past a C int
    "999999999",
    "\x00",
    "a\x00b",
    "%",
    "_",
    "\\",
    "'",
    "<script>x</script>",
    "[]",
    "{}",
    '{"a": "\\u0000"}',
    "null",
    "a\r\nb",
    "1,2,x",
]
classics = st.sampled_from(CLASSICS)
texts = st.one_of(
    classics,
    st.tuples(st.text(max_size=8), classics).map("".join),  # a classic after ordinary text
    st.tuples(st.text(max_size=4), st.sampled_from(["\x00", "\\u0000"]), st.text(max_size=4)).map("".join),
    st.text(max_size=24),
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
)


def _changelists(world: World) -> list[tuple[str, list[str]]]:  # noqa: F811
    """(URL, the parameters it reads) of every registered admin's list."""
    client = world.clients["superuser"]
    found = []
    for model, model_admin in admin.site._registry.items():
        opts = model._meta
        url = f"/admin/{opts.app_label}/{opts.model_name}/"
        response = client.get(url)
        cl = response.context.get("cl") if response.status_code == 200 and response.context else None
        if not isinstance(cl, ChangeList):
            continue
        names = {"q", "o", "p", "e", "_facets"}
        for spec in cl.filter_specs:
            names.update(p for p in spec.expected_parameters() if p)
        if model_admin.date_hierarchy:
            names.update(f"{model_admin.date_hierarchy}__{part}" for part in ("year", "month", "day"))
        names.update(f"{f.name}__exact" for f in opts.fields[:6])
        found.append((url, sorted(names)))
    return found


class _FormValues(HTMLParser):
    """The values a browser would post from a page's form as rendered (inputs, selects, textareas)."""

    def __init__(self) -> None:
        super().__init__()
        self.values: dict[str, list[str]] = {}
        self._select: str | None = None
        self._textarea: str | None = None
        self._first_option: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        name = a.get("name", "")
        if tag == "input" and name and a.get("type", "text") not in ("submit", "button", "file", "image"):
            if a.get("type") not in ("checkbox", "radio") or "checked" in a:
                self.values.setdefault(name, []).append(a.get("value", ""))
        elif tag == "select" and name:
            self._select, self._first_option = name, None
        elif tag == "option" and self._select:
            if self._first_option is None:
                self._first_option = a.get("value", "")
            if "selected" in a:
                self.values.setdefault(self._select, []).append(a.get("value", ""))
        elif tag == "textarea" and name:
            self._textarea = name
            self.values[name] = [""]

    def handle_data(self, data: str) -> None:
        if self._textarea:
            self.values[self._textarea][0] += data

    def handle_endtag(self, tag: str) -> None:
        if tag == "select" and self._select:
            if self._select not in self.values and self._first_option is not None:
                self.values[self._select] = [self._first_option]
            self._select = None
        elif tag == "textarea":
            self._textarea = None


def _posted_as_rendered(html: str) -> dict[str, list[str]]:
    parser = _FormValues()
    parser.feed(html)
    parser.values.pop("csrfmiddlewaretoken", None)
    return parser.values


def _forms(world: World) -> list[tuple[str, dict[str, list[str]], list[str]]]:  # noqa: F811
    """(URL, its form's values as rendered, ids worth trying) of every add form and of A's object's
    change form: each example changes a few of a valid form's values, so forms also get saved."""
    client = world.clients["superuser"]
    ids = sorted({str(o.pk) for side in (world.a, world.b) for o in side.values()})
    found = []
    for model, _model_admin in admin.site._registry.items():
        opts = model._meta
        base = f"/admin/{opts.app_label}/{opts.model_name}/"
        urls = [f"{base}add/"]
        if model in world.a:
            urls.append(f"{base}{world.a[model].pk}/change/")
        for url in urls:
            response = client.get(url)
            adminform = (
                response.context.get("adminform")
                if response.status_code == 200 and response.context
                else None
            )
            if adminform is None or not adminform.form.fields:
                continue  # refused, or every field read-only
            found.append((url, _posted_as_rendered(response.content.decode()), ids))
    return found


@FUZZ
@given(data=st.data())
def test_no_list_answers_500_to_any_query_string(world: World, data: Any) -> None:  # noqa: F811
    lists = _changelists_cached(world)
    url, names = data.draw(st.sampled_from(lists), label="list")
    # The search and the filters most often: they are what reaches the database.
    keys = st.one_of(st.just("q"), st.sampled_from(names))
    params = data.draw(st.dictionaries(keys, texts, max_size=4), label="params")
    role = data.draw(st.sampled_from(ROLES), label="role")
    response = world.clients[role].get(url, params)
    assert response.status_code < 500, (role, url, params, response.status_code)


@FUZZ
@given(data=st.data())
def test_no_form_answers_500_to_any_field_values(world: World, data: Any) -> None:  # noqa: F811
    forms = _forms_cached(world)
    url, rendered, ids = data.draw(st.sampled_from(forms), label="form")
    values = st.one_of(texts, st.sampled_from(ids))
    changed = data.draw(
        st.dictionaries(st.sampled_from(sorted(rendered)), values, min_size=1, max_size=3), label="changed"
    )
    posted: dict[str, Any] = {**rendered, **changed}
    role = data.draw(st.sampled_from(ROLES), label="role")
    response = world.clients[role].post(url, posted)
    assert response.status_code < 500, (role, url, posted, response.status_code)


def test_no_list_answers_500_to_a_year_or_an_address_out_of_range(world: World) -> None:  # noqa: F811
    """Each list's date fields (and its date hierarchy) asked for years past Python's and PostgreSQL's
    range, its IP address fields for what is no address: the list reloads with ?e=1, never a 500
    (Django's own checks let "?date_joined__year=99999" and "?ip_address=0" through)."""
    client = world.clients["superuser"]
    asked = 0
    for model in admin.site._registry:
        url = f"/admin/{model._meta.app_label}/{model._meta.model_name}/"
        for field in model._meta.fields:
            if isinstance(field, models.DateField):  # DateTimeField too
                cases = [
                    (f"{field.name}__{part}", v)
                    for part in ("year", "month", "day")
                    for v in ("9999", "99999", "2147483648")
                ]
            elif isinstance(field, models.GenericIPAddressField):
                cases = [(f"{field.name}{lookup}", "0") for lookup in ("", "__exact", "__in", "__gt")]
            else:
                continue
            for key, value in cases:
                response = client.get(url, {key: value})
                assert response.status_code < 500, (url, key, value, response.status_code)
                asked += 1
    assert asked > 100  # every list with a date was asked


_cache: dict[tuple[int, str], Any] = {}


def _changelists_cached(world: World) -> list[tuple[str, list[str]]]:  # noqa: F811
    key = (id(world), "lists")
    if key not in _cache:
        _cache.clear()
        _cache[key] = _changelists(world)
    return _cache[key]


def _forms_cached(world: World) -> list[tuple[str, dict[str, list[str]], list[str]]]:  # noqa: F811
    key = (id(world), "forms")
    if key not in _cache:
        _cache.clear()
        _cache[key] = _forms(world)
    return _cache[key]
