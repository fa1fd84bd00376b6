from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import CommandError, CommandParser
from django.utils.translation import gettext as _

from crm import cli, services, tenancy
from crm.models import Membership


def user_or_error(username: str) -> Any:
    """The user with this username, or a CommandError that names it and lists some that exist."""
    users = get_user_model().objects
    user = users.filter(username=username).first()
    if user is None:
        names = users.order_by("username").values_list("username", flat=True)[:21]
        raise CommandError(
            _("no user %(username)r (users: %(names)s)") % {"username": username, "names": cli.listing(names)}
        )
    return user


class Command(cli.CrmCommand):
    help = (
        "Who belongs to which organization: `membership add USERNAME SLUG --role manager|viewer` "
        "(also changes a role; the user becomes staff), `membership remove USERNAME SLUG`, "
        "`membership list [SLUG]`."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(
            dest="action",
            required=True,
            metavar="{add,remove,list}",
            help="what to do (see each one's --help)",
        )
        add = sub.add_parser("add", help="add a user to an organization, or change their role there")
        add.add_argument(
            "username", help="the user's login name (create it first: createsuperuser or the admin)"
        )
        add.add_argument("slug", help="the organization's slug")
        add.add_argument(
            "--role",
            choices=[Membership.Role.MANAGER, Membership.Role.VIEWER],
            required=True,
            help="manager: works the organization's campaigns, customers, surveys, integrations; "
            "viewer: sees, changes nothing",
        )
        remove = sub.add_parser(
            "remove", help="take a user out of an organization (no longer staff if it was their last)"
        )
        remove.add_argument("username", help="the user's login name")
        remove.add_argument("slug", help="the organization's slug")
        listing = sub.add_parser("list", help="the memberships, of one organization or of all")
        listing.add_argument("slug", nargs="?", help="only this organization's members")

    def handle(self, *args: Any, **options: Any) -> None:
        action = options["action"]
        if action == "list":
            self._list(options.get("slug"))
            return
        user = user_or_error(options["username"])
        organization = cli.organization_or_error(options["slug"])
        if action == "add":
            _membership, created = services.membership_set(
                user=user, organization=organization, role=options["role"]
            )
            text = (
                _("%(user)s is now %(role)s of %(org)s")
                if created
                else _("%(user)s's role in %(org)s is now %(role)s")
            )
            self.stdout.write(
                text % {"user": user.username, "org": organization.slug, "role": options["role"]}
            )
            return
        if not services.membership_remove(user=user, organization=organization):
            raise CommandError(
                _("%(user)s is not a member of %(org)s") % {"user": user.username, "org": organization.slug}
            )
        user.refresh_from_db(fields=["is_staff"])
        self.stdout.write(
            _("%(user)s removed from %(org)s") % {"user": user.username, "org": organization.slug}
            + ("" if user.is_staff else " " + _("(no organization left: no longer staff)"))
        )

    def _list(self, slug: str | None) -> None:
        rows = Membership.objects.select_related("user", "organization").order_by(
            "organization__slug", "user__username"
        )
        if slug:
            rows = rows.filter(organization=cli.organization_or_error(slug))
        empty = True
        for m in rows.iterator(chunk_size=1000):
            empty = False
            operator = " " + _("(platform operator)") if tenancy.is_operator(m.user) else ""
            self.stdout.write(f"{m.organization.slug:<24} {m.user.username:<24} {m.role}{operator}")
        if empty:
            self.stdout.write(_("no memberships"))
