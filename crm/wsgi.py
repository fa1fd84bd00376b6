"""The WSGI application: every request through Django's full middleware, except the webhook intakes'.

An intake request (`crm.intake.INTAKE_PATHS`: Meta's, the runner's and the ESPs' webhooks) is
authenticated by its own signature or token, answers JSON and uses no session, user, CSRF token,
message, language negotiation or login lockout: it goes through `INTAKE_MIDDLEWARE` only
(security headers and the 503-when-the-database-is-down guard). The full stack costs several times
what an intake does before its answer (measured with benchmarks/webhook_intake.py); a burst of
webhooks should not pay for the admin's middleware.
"""

import os
from collections.abc import Callable, Iterable
from typing import Any

from django.core.handlers.exception import convert_exception_to_response
from django.core.handlers.wsgi import WSGIHandler
from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "crm.settings")

full = get_wsgi_application()  # django.setup() first: the settings below are then configured

from django.conf import settings  # noqa: E402
from django.utils.module_loading import import_string  # noqa: E402

from crm.intake import INTAKE_PATHS  # noqa: E402


class IntakeHandler(WSGIHandler):
    """Django's handler with `settings.INTAKE_MIDDLEWARE` instead of MIDDLEWARE (synchronous
    middleware only, their process_view/exception/template_response hooks as Django wires them)."""

    def load_middleware(self, is_async: bool = False) -> None:
        self._view_middleware: list[Any] = []
        self._template_response_middleware: list[Any] = []
        self._exception_middleware: list[Any] = []
        handler = convert_exception_to_response(self._get_response)  # type: ignore[attr-defined]  # not in the stubs
        for path in reversed(settings.INTAKE_MIDDLEWARE):
            middleware = import_string(path)(handler)
            if hasattr(middleware, "process_view"):
                self._view_middleware.insert(0, middleware.process_view)
            if hasattr(middleware, "process_template_response"):
                self._template_response_middleware.append(middleware.process_template_response)
            if hasattr(middleware, "process_exception"):
                self._exception_middleware.append(middleware.process_exception)
            handler = convert_exception_to_response(middleware)
        self._middleware_chain = handler


intake = IntakeHandler()


def application(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    handler = intake if environ.get("PATH_INFO", "").startswith(INTAKE_PATHS) else full
    return handler(environ, start_response)
