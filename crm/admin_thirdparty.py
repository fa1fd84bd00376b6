"""The admins other packages register — Django's users and groups, django-axes' login-lockout pages —
registered again with their query strings checked (crm/admin_lists.py): "?ip_address=0" and
"?date_joined__year=99999" were 500s."""

from __future__ import annotations

from axes.admin import AccessAttemptAdmin, AccessFailureLogAdmin, AccessLogAdmin
from axes.models import AccessAttempt, AccessFailureLog, AccessLog
from django.contrib import admin
from django.contrib.auth.admin import GroupAdmin, UserAdmin
from django.contrib.auth.models import Group, User

from crm.admin_lists import CheckedLists


class LockoutAttemptAdmin(CheckedLists, AccessAttemptAdmin):
    pass


class LockoutLogAdmin(CheckedLists, AccessLogAdmin):
    pass


class LockoutFailureLogAdmin(CheckedLists, AccessFailureLogAdmin):
    pass


class CheckedUserAdmin(CheckedLists, UserAdmin):
    pass


class CheckedGroupAdmin(CheckedLists, GroupAdmin):
    pass


def register() -> None:
    """Replace their own registrations (called from CrmConfig.ready, after the admin's autodiscovery)."""
    for model, model_admin in (
        (AccessAttempt, LockoutAttemptAdmin),
        (AccessLog, LockoutLogAdmin),
        (AccessFailureLog, LockoutFailureLogAdmin),
        (User, CheckedUserAdmin),
        (Group, CheckedGroupAdmin),
    ):
        if admin.site.is_registered(model):
            admin.site.unregister(model)
        admin.site.register(model, model_admin)
