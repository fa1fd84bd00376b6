"""The queue pages (BullBoard's replacement) under /admin/queues/, staff only."""

from __future__ import annotations

from django.urls import URLPattern

urlpatterns: list[URLPattern] = []
