"""Writes on the core domain."""

from __future__ import annotations

import logging
import os
import secrets
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

import redis
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection, transaction
from django.utils import timezone

from crm import fairshare, jobs, tenancy
from crm.models import ConsentChange, ConsentSource, Customer, Membership, OptOutSource, Organization

logger = logging.getLogger(__name__)


def customer_signup(
    *, organization_id: int, email: str, name: str = "", phone: str = "", marketing_consent: bool = False
) -> tuple[int, str]:
    """Record a sign-up (a shop's registration form): create the organization's customer with this
    email, or fill in the one that has it. Returns (customer id, "created" | "updated" |
    "unchanged"). Consent is only ever given here, never withdrawn (an unticked box is not an
    opt-out). Safe to run twice and concurrently for the same email."""
    with transaction.atomic(), connection.cursor() as cursor:
        # Two deliveries of one sign-up must not create two customers: the email has no unique
        # constraint (customers may share one), so its writers take turns.
        cursor.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", [organization_id, email])
        customer = (
            Customer.objects.filter(organization_id=organization_id, email=email).order_by("id").first()
        )
        if customer is None:
            customer = Customer.objects.create(
                organization_id=organization_id,
                email=email,
                name=name,
                phone=phone,
            )
            if marketing_consent:
                customers_consent_set(customer_ids=[customer.pk], given=True, source=ConsentSource.FORM)
            return customer.pk, "created"
        changes: dict[str, Any] = {}
        if name and name != customer.name:
            changes["name"] = name
        if phone and phone != customer.phone:
            changes["phone"] = phone
        consented = marketing_consent and not customer.marketing_consent
        if consented:
            customers_consent_set(customer_ids=[customer.pk], given=True, source=ConsentSource.FORM)
        if not changes:
            return customer.pk, ("updated" if consented else "unchanged")
        for field, value in changes.items():
            setattr(customer, field, value)
        customer.save(update_fields=[*changes, "updated_at"])
        return customer.pk, "updated"


# --- consent ---------------------------------------------------------------------------------------


def customers_consent_set(
    *,
    customer_ids: Iterable[int],
    given: bool,
    source: ConsentSource,
    by_id: int | None = None,
    at: datetime | None = None,
    only_from: Iterable[ConsentSource] | None = None,
) -> int:
    """Give (or withdraw) the customers' marketing consent as of `at` (now), keeping its source, time
    and who recorded it, plus one ConsentChange row each. Customers whose consent already is `given`
    are left alone (their source and time stay); with `only_from`, only a consent recorded from those
    sources is changed (an ERP flag going false withdraws what the ERP gave, not a form's). Returns how
    many changed; one UPDATE … RETURNING and one bulk insert. Safe to run twice."""
    when = at or timezone.now()
    customers = Customer.objects.filter(pk__in=list(customer_ids)).exclude(marketing_consent=given)
    if only_from is not None:
        customers = customers.filter(marketing_consent_source__in=list(only_from))
    with transaction.atomic():
        # QuerySet.update returns no rows: lock and read the ids first, then update exactly those.
        changed = list(customers.select_for_update().values_list("pk", "organization_id"))
        if not changed:
            return 0
        Customer.objects.filter(pk__in=[pk for pk, _org in changed]).update(
            marketing_consent=given,
            consent_at=when if given else None,
            marketing_consent_source=source,
            marketing_consent_by_id=by_id,
            updated_at=timezone.now(),
        )
        ConsentChange.objects.bulk_create(
            [
                ConsentChange(
                    organization_id=org, customer_id=pk, given=given, source=source, at=when, by_id=by_id
                )
                for pk, org in changed
            ]
        )
    return len(changed)


# --- memberships ------------------------------------------------------------------------------------


def membership_set(*, user: Any, organization: Organization, role: str) -> tuple[Any, bool]:
    """Add the user to the organization with `role`, or change their role there: (membership, created).
    The user becomes staff (the admin is the product's UI) through `membership_saved`."""
    membership, created = Membership.objects.update_or_create(
        user=user, organization=organization, defaults={"role": role}
    )
    return membership, created


def membership_remove(*, user: Any, organization: Organization) -> bool:
    """Take the user out of the organization (True if they were in it); `membership_deleted` then
    drops their staff flag when it was their last membership and they are not an operator."""
    deleted, _rows = Membership.objects.filter(user=user, organization=organization).delete()
    return bool(deleted)


def membership_saved(sender: Any, instance: Any, **kwargs: Any) -> None:
    """post_save of Membership (the command, the admin, the ORM): a member is staff."""
    user = instance.user
    if not user.is_staff:
        user.is_staff = True
        user.save(update_fields=["is_staff"])


def organization_saved(sender: Any, instance: Organization, **kwargs: Any) -> None:
    """post_save of Organization (the admin, the ORM): its `queue_weight` goes to the fair queues'
    weights in Redis once committed. Redis down: logged, and `recover` (every minute) rebuilds them."""

    def send() -> None:
        try:
            fairshare.set_weight(jobs.get_connection(), instance.pk, instance.queue_weight)
        except redis.RedisError:
            logger.warning("organization %s: queue weight not sent to Redis", instance.pk, exc_info=True)

    transaction.on_commit(send)


def queue_weights_rebuild() -> int:
    """Rebuild the fair queues' weights in Redis from PostgreSQL (after a flush: `recover`);
    returns how many organizations have a weight other than 1."""
    weights = dict(Organization.objects.exclude(queue_weight=1).values_list("pk", "queue_weight"))
    fairshare.weights_replace(jobs.get_connection(), weights)
    return len(weights)


def membership_deleted(sender: Any, instance: Any, **kwargs: Any) -> None:
    """post_delete of Membership: a user left without any organization is no longer staff, unless
    a platform operator (superuser or crm.operate_platform), whose staff flag is theirs to keep."""
    user_model = type(instance).user.field.related_model
    user = user_model.objects.filter(pk=instance.user_id).first()
    if user is None or not user.is_staff or tenancy.is_operator(user):
        return
    if not Membership.objects.filter(user_id=user.pk).exists():
        user.is_staff = False
        user.save(update_fields=["is_staff"])


def login_ensure(*, username: str, password: str | None, saved: Any, superuser: bool) -> str | None:
    """A login for the embedded mode and the demo: `password` when given (set again), else a generated
    one kept in the file `saved` (0600) for the next start. Returns the password when it was (re)set
    or is kept in `saved`; None when the user exists with a password this function never knew."""
    user_model = get_user_model()
    user = user_model.objects.filter(username=username).first()
    if user is not None and not password:
        return saved.read_text().strip() if saved.exists() else None
    if not password:
        password = secrets.token_urlsafe(12)
        saved.parent.mkdir(parents=True, exist_ok=True)
        saved.write_text(password + "\n")
        saved.chmod(0o600)
    if user is None:
        user = user_model(username=username)
    user.set_password(password)
    user.is_staff = True
    user.is_superuser = superuser
    user.save()
    return password


def login_from_environment(*, prefix: str, default_username: str, superuser: bool) -> tuple[str, str | None]:
    """`login_ensure` for <prefix>_USERNAME / <prefix>_PASSWORD, else `default_username` with a
    generated password kept in var/<default_username>-password: (username, password when known)."""
    username = os.environ.get(f"{prefix}_USERNAME", default_username)
    password = login_ensure(
        username=username,
        password=os.environ.get(f"{prefix}_PASSWORD"),
        saved=Path(settings.VAR_DIR) / f"{default_username}-password",
        superuser=superuser,
    )
    return username, password


# --- Sending state: an organization's paused channels, a customer's opt-outs ---------------------

SendingChannel = Literal["whatsapp", "email"]
REASON_MAX = 2000  # a pause reason is cut to this many characters (a provider may echo a page)
# Each channel's columns: (when, why) of an organization's pause, (when, source) of a customer's opt-out.
_PAUSE_FIELDS = {
    "whatsapp": ("whatsapp_paused_at", "whatsapp_paused_reason"),
    "email": ("email_paused_at", "email_paused_reason"),
}
_OPT_OUT_FIELDS = {
    "whatsapp": ("whatsapp_opted_out_at", "whatsapp_opt_out_source"),
    "email": ("email_opted_out_at", "email_opt_out_source"),
}
_CHANNEL_LABEL = {"whatsapp": "WhatsApp", "email": "email"}


def organizations_pause(*, organization_ids: Iterable[int], channel: SendingChannel, reason: str) -> int:
    """Stop the organizations' sending on `channel` until an operator clears it: the provider refused
    the account itself (WhatsApp: locked, unpaid; email: login, TLS, relay). An existing pause, its
    time and reason, is kept. Returns how many this call paused, each logged as an error."""
    at, why = _PAUSE_FIELDS[channel]
    paused = 0
    for organization_id in sorted(set(organization_ids)):  # one, seldom more: a statement and a log each
        rows = Organization.objects.filter(pk=organization_id, **{f"{at}__isnull": True})
        if rows.update(**{at: timezone.now(), why: reason[:REASON_MAX]}):
            paused += 1
            logger.error(
                "organization %s: %s sending paused: %s",
                organization_id,
                _CHANNEL_LABEL[channel],
                reason,
                extra={"organization_id": organization_id},
            )
    return paused


def organizations_resume(*, organization_ids: Iterable[int], channel: SendingChannel) -> int:
    """Clear the organizations' pause on `channel` (its cause was fixed); returns how many were paused."""
    at, why = _PAUSE_FIELDS[channel]
    paused = Organization.objects.filter(pk__in=organization_ids, **{f"{at}__isnull": False})
    return paused.update(**{at: None, why: ""})


def customers_opt_out(
    *, customer_ids: Iterable[int], channel: SendingChannel, source: OptOutSource, at: datetime | None = None
) -> int:
    """Opt the customers out of `channel`'s marketing as of `at` (now by default), recording where the
    choice came from. An existing opt-out, its time and source, is kept. Returns how many this call
    opted out; one statement (`customer_ids` may be a values_list query: it becomes a subquery)."""
    when, where = _OPT_OUT_FIELDS[channel]
    now = timezone.now()
    customers = Customer.objects.filter(pk__in=customer_ids, **{f"{when}__isnull": True})
    # QuerySet.update skips auto_now: updated_at is set by hand so whoever syncs on it sees the change.
    return customers.update(**{when: at or now, where: source, "updated_at": now})


def customers_opt_out_undo(
    *, customer_ids: Iterable[int], channel: SendingChannel, sources: Iterable[OptOutSource]
) -> int:
    """Undo the customers' opt-out of `channel`, but only one recorded from `sources` (a choice that
    came from elsewhere stays). Returns how many this call opted back in; one statement."""
    when, where = _OPT_OUT_FIELDS[channel]
    customers = Customer.objects.filter(
        pk__in=customer_ids, **{f"{when}__isnull": False, f"{where}__in": list(sources)}
    )
    return customers.update(**{when: None, where: "", "updated_at": timezone.now()})
