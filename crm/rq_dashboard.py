"""django-rq's dashboard as the platform serves it (under /admin/rq/, operators only: crm.tenancy).

Its views assume what they are asked for exists: a queue index past the configured queues raised
IndexError, and the page of a worker that has just stopped (its key expired) failed an `assert` —
500s for a link followed a moment too late. Here both are 404s, before the view runs."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import django_rq.urls
from django.http import Http404, HttpRequest, HttpResponse
from django.urls import URLPattern, URLResolver
from django_rq.queues import get_queue_by_index, get_queues_list
from rq.worker import Worker


def _checked(view: Callable[..., HttpResponse], *, worker: bool) -> Callable[..., HttpResponse]:
    @functools.wraps(view)
    def checked(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        index = kwargs.get("queue_index")
        if index is not None and not 0 <= int(index) < len(get_queues_list()):
            raise Http404("no such queue")
        if worker:
            connection = get_queue_by_index(int(index or 0)).connection
            if Worker.find_by_key(kwargs.get("key", ""), connection=connection) is None:
                raise Http404("no such worker: it has stopped")
        return view(request, *args, **kwargs)

    return checked


def urlpatterns() -> list[URLPattern | URLResolver]:
    """django-rq's patterns, each view checking its queue index, the worker page its worker."""
    patterns: list[URLPattern | URLResolver] = []
    for pattern in django_rq.urls.urlpatterns:
        if isinstance(pattern, URLPattern):
            view = _checked(pattern.callback, worker=pattern.name == "worker_details")
            pattern = URLPattern(pattern.pattern, view, pattern.default_args, pattern.name)
        patterns.append(pattern)
    return patterns
