"""What the runner commands share: finding the handler and the organization named on the command line."""

from __future__ import annotations

from django.core.management.base import CommandError
from django.utils.translation import gettext as _

from crm import cli
from runner import executions
from runner.models import Handler


def handler_or_error(integration_key: str, handler_key: str) -> Handler:
    """The handler, or a CommandError that names it and lists the handlers that exist."""
    try:
        return executions.handler_get(integration_key=integration_key, handler_key=handler_key)
    except Handler.DoesNotExist:
        known = Handler.objects.order_by("integration__integration_key", "handler_key").values_list(
            "integration__integration_key", "handler_key"
        )[:21]
        raise CommandError(
            _("no handler %(key)s (handlers: %(keys)s)")
            % {"key": f"{integration_key}/{handler_key}", "keys": cli.listing(f"{i}/{h}" for i, h in known)}
        ) from None


def organization_id_for(handler: Handler, slug: str | None) -> int:
    """The organization a run is for: --org SLUG, else the handler's own. A handler of one
    organization runs for that one only (as its webhook intake does): --org naming another is refused."""
    if slug:
        org_id = cli.organization_or_error(slug).pk
        if handler.organization_id and handler.organization_id != org_id:
            raise CommandError(
                _("handler %(key)s belongs to another organization: it runs for its own (leave out --org)")
                % {"key": f"{handler.integration.integration_key}/{handler.handler_key}"}
            )
        return org_id
    if handler.organization_id:
        return handler.organization_id
    raise CommandError(
        _("handler %(key)s serves every organization: name one with --org SLUG")
        % {"key": f"{handler.integration.integration_key}/{handler.handler_key}"}
    )
