"""Who may see and do what in the admin, over every admin URL and action.

The pages come from the URL conf and the registered admins (a new admin, custom view or platform
page is covered without being listed here); each is asked by six people: the anonymous, a
non-staff user, a viewer and a manager of organization A, a platform operator (not a superuser)
and a superuser. Organization B's objects are named "bravo": A's people never see the word.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date
from decimal import Decimal
from typing import Any

import pytest
from django.contrib import admin
from django.contrib.admin.views.main import ChangeList
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.test import Client, RequestFactory
from django.urls import URLPattern, URLResolver, get_resolver
from django.utils import timezone
from django.views.generic import RedirectView
from rq import Worker
from rq.job import Job

from campaigns.models import (
    Campaign,
    CampaignMetric,
    CustomerSegment,
    EmailMessage,
    WhatsappMessage,
)
from crm import jobs, queues, tenancy
from crm.models import Customer, InboxEvent, JobRun, Membership, Organization, Sale, Store
from erp.models import ErpConnection, ErpSyncIssue
from integrations.models import (
    ChatwootAccount,
    EmailSettings,
    WhatsappNumber,
    WhatsappPrice,
    WhatsappTemplate,
)
from messaging.models import ConversationMessage, ConversationSettings, EmailSuppression
from runner.models import Execution, ExecutionItem, Handler, IntegrationType, RunnerSettings
from surveys.models import Survey

pytestmark = [pytest.mark.django_db, pytest.mark.slow]  # every admin page, six times over

User = get_user_model()
ROLES = ("anonymous", "nonstaff", "viewer", "manager", "operator", "superuser")
SECRET = b"bravo"  # in every name of B's objects

# What only a platform operator may do even on a tenant's model (the admins say so too).
OPERATOR_ONLY = {("add", Organization), ("delete", Organization), ("add", Handler)}
# The world's campaign has messages: history, archived by a manager, its delete page refused (the
# list's delete action stays offered, for campaigns without messages, and deletes none of those).
HISTORY = {("delete", Campaign)}
# Custom views whose <pk> is another model's than their admin's.
PK_MODEL = {
    "runner_dashboard_pause": Handler,
    "runner_dashboard_resume": Handler,
    "messaging_conversation": Customer,
}
# Sample values for the platform pages' path parameters (an operator may get a 404 for some).
SAMPLE_ARGS = {
    "queue": "maintenance",
    "state": "failed",
    "job_id": "matrix-job",
    "action": "retry",
    "key": "rq:worker:gone",
}
SAMPLE_ARGS_BY_PAGE = {"admin-queue-bulk": {"action": "retry-all"}}


def _objects(org: Organization, tag: str) -> dict[type, Any]:
    """One object of every organization-bound model for `org`, named with `tag`."""
    now = timezone.now()
    store = Store.objects.create(organization=org, erp_code=f"{tag}-1", name=f"{tag} store")
    customer = Customer.objects.create(
        organization=org, name=f"{tag} customer", email=f"{tag}@example.com", phone="+5511987650000"
    )
    sale = Sale.objects.create(
        organization=org, store=store, customer=customer, erp_id=f"{tag}-sale", total=10, sold_at=now
    )
    campaign = Campaign.objects.create(organization=org, name=f"{tag} campaign")
    # Integration types are the platform's, shared by every organization (their names are no secret).
    integration = IntegrationType.objects.create(integration_key=f"it-{org.pk}", name=f"type {org.pk}")
    handler = Handler.objects.create(
        integration=integration, handler_key=f"{tag}-h", direction="inbound", organization=org
    )
    execution = Execution.objects.create(
        organization=org, integration=integration, handler=handler, direction="inbound", trigger="manual"
    )
    other = User.objects.create_user(f"{tag}-member", password="pw-member-1234")
    return {
        Organization: org,
        Store: store,
        Customer: customer,
        Sale: sale,
        Campaign: campaign,
        CampaignMetric: CampaignMetric.objects.get_or_create(campaign=campaign)[0],
        JobRun: JobRun.objects.create(kind=f"{tag}-kind", key=f"{tag}-key", organization=org),
        # Every organization's accepted webhooks: a platform page (a Meta event names no organization).
        InboxEvent: InboxEvent.objects.create(kind=f"{tag}-kind", organization=org, payload="{}"),
        Membership: Membership.objects.create(user=other, organization=org, role="viewer"),
        WhatsappMessage: WhatsappMessage.objects.create(
            campaign=campaign, organization=org, customer=customer, phone="+5511987650000"
        ),
        EmailMessage: EmailMessage.objects.create(
            campaign=campaign, organization=org, customer=customer, email=f"{tag}@example.com"
        ),
        EmailSuppression: EmailSuppression.objects.create(
            organization=org, email=f"{tag}-gone@example.com", reason="manual"
        ),
        CustomerSegment: CustomerSegment.objects.create(
            organization=org,
            day=date(2026, 11, 1),
            customer=customer,
            segment="new",
            recency_days=1,
            frequency=1,
            monetary=Decimal("10"),
        ),
        WhatsappNumber: WhatsappNumber.objects.create(
            organization=org, display_phone_number=f"{tag} number", phone_number_id=f"{tag}-pnid"
        ),
        WhatsappPrice: WhatsappPrice.objects.create(category=f"{tag}"[:20], country=tag[:2].upper()),
        WhatsappTemplate: WhatsappTemplate.objects.create(
            organization=org,
            business_account_id="1",
            name=f"{tag}_template",
            language="pt_BR",
            status="APPROVED",
        ),
        EmailSettings: EmailSettings.objects.create(
            organization=org, sender_name=f"{tag} sender", sender_email=f"{tag}@example.com"
        ),
        ChatwootAccount: ChatwootAccount.objects.create(
            organization=org, base_url=f"https://{tag}.example.com", account_id=1, inbox_id=1
        ),
        ErpConnection: ErpConnection.objects.create(
            organization=org, base_url=f"https://{tag}.example.com", username=f"{tag}-user"
        ),
        ErpSyncIssue: ErpSyncIssue.objects.create(
            organization=org, kind="sale", reason=f"{tag} reason", fingerprint=f"{tag}-fp"
        ),
        Survey: Survey.objects.get_or_create(
            sale=sale,
            defaults={
                "organization": org,
                "customer": customer,
                "store": store,
                "channel": "email",
                "due_at": now,
            },
        )[0],
        IntegrationType: integration,
        Handler: handler,
        Execution: execution,
        ExecutionItem: ExecutionItem.objects.create(execution=execution, external_id=f"{tag}-item"),
        RunnerSettings: RunnerSettings.objects.create(organization=org),
        **_flow_objects(org, tag, customer),
        ConversationMessage: ConversationMessage.objects.create(
            organization=org, customer=customer, direction="in", text=f"{tag} reply", wamid=f"{tag}-wamid"
        ),
        ConversationSettings: ConversationSettings.objects.create(organization=org),
    }


def _flow_objects(org: Organization, tag: str, customer: Customer) -> dict[type, Any]:
    from flows.models import Enrollment, EnrollmentStep, Flow

    flow = Flow.objects.create(
        organization=org,
        key=f"{tag}-flow",
        name=f"{tag} flow",
        trigger={"type": "sale"},
        steps=[{"type": "wait", "days": 1}],
    )
    enrollment = Enrollment.objects.create(
        flow=flow, organization=org, customer=customer, entry_key=f"{tag}-entry", due_at=None
    )
    step = EnrollmentStep.objects.create(enrollment=enrollment, flow=flow, index=0, type="wait")
    return {Flow: flow, Enrollment: enrollment, EnrollmentStep: step}


def _sample_job() -> None:
    """The job the platform pages' job views are asked about (django-rq's fail on a missing one)."""
    if not Job.exists("matrix-job", connection=jobs.get_connection()):
        jobs.get_queue(queues.QUEUE_NAMES[0]).enqueue("os.getpid", job_id="matrix-job")


@dataclass
class World:
    a: dict[type, Any]
    b: dict[type, Any]
    clients: dict[str, Client]
    users: dict[str, Any]


@pytest.fixture
def world() -> World:
    org_a = Organization.objects.create(name="Alfa Org", slug="alfa")
    org_b = Organization.objects.create(name="bravo Org", slug="bravo")
    a, b = _objects(org_a, "alfa"), _objects(org_b, "bravo")
    users = {
        "nonstaff": User.objects.create_user("nina", password="pw-nina-1234"),
        "viewer": User.objects.create_user("vera", password="pw-vera-1234"),
        "manager": User.objects.create_user("manu", password="pw-manu-1234"),
        "operator": User.objects.create_user("opal", password="pw-opal-1234", is_staff=True),
        "superuser": User.objects.create_superuser("root", password="pw-root-1234"),
    }
    Membership.objects.create(user=users["viewer"], organization=org_a, role="viewer")
    Membership.objects.create(user=users["manager"], organization=org_a, role="manager")
    users["operator"].user_permissions.add(Permission.objects.get(codename="operate_platform"))
    _sample_job()
    queue = jobs.get_queue(queues.QUEUE_NAMES[0])
    Worker([queue], connection=jobs.get_connection(), name="gone").register_birth()  # a worker to show
    clients = {"anonymous": Client()}
    for role, user in users.items():
        clients[role] = Client()
        clients[role].force_login(User.objects.get(pk=user.pk))  # axes: force_login, no authenticate
    return World(a=a, b=b, clients=clients, users=users)


# --- the pages ------------------------------------------------------------------------------------


@dataclass
class Page:
    label: str
    url: str
    admin: admin.ModelAdmin | None  # None: a platform page outside the admin site
    kind: str  # changelist, add, change, history, delete, custom, platform
    side: str = ""  # "a", "b" or "" (no object)
    model: type | None = None
    post_only: bool = False


def _flatten(patterns: list, prefix: str = "") -> Iterator[tuple[str, URLPattern]]:
    """(route, pattern) of every view, but the admin site's own (its models' pages: admin_pages)."""
    for p in patterns:
        route = prefix + str(p.pattern)
        if isinstance(p, URLResolver):
            if p.namespace != "admin":
                yield from _flatten(p.url_patterns, route)
        else:
            yield route, p


def _fill(route: str, values: dict[str, Any]) -> str:
    """A URL of the route (a path or a regex): its parameters from `values`, else 0 for an int,
    else "x"."""

    def value(m: re.Match) -> str:
        converter, name = m.group(1), m.group(2)
        return str(values.get(name, 0 if converter == "int" else "x"))

    route = re.sub(r"\(\?P<(\w+)>[^)]*\)\??", lambda m: str(values.get(m.group(1), "x")), route)
    route = re.sub(r"<(?:(\w+):)?(\w+)>", value, route)
    return "/" + route.replace("^", "").replace("$", "").replace("/?", "/")


def admin_pages(world: World) -> list[Page]:
    """Every URL of every registered admin (objects of A and of B) and every platform page."""
    pages: list[Page] = []
    for model, model_admin in admin.site._registry.items():
        for route, pattern in _flatten(
            model_admin.get_urls(), f"admin/{model._meta.app_label}/{model._meta.model_name}/"
        ):
            name = pattern.name or ""
            if not name or str(pattern.pattern).rstrip("/") == "<path:object_id>":
                continue
            kind = next(
                (k for k in ("changelist", "add", "change", "history", "delete") if name.endswith(f"_{k}")),
                "custom",
            )
            has_object = "<" in route
            if not has_object:
                pages.append(Page(name, _fill(route, {}), model_admin, kind, model=model))
                continue
            target = PK_MODEL.get(name, model)
            for side, objects in (("a", world.a), ("b", world.b)):
                obj = objects.get(target)
                if obj is None:
                    assert not isinstance(model_admin, tenancy.TenantAdmin), f"no {target.__name__} object"
                    break
                url = _fill(route, {"object_id": obj.pk, "pk": obj.pk})
                post_only = name in PK_MODEL or name.endswith("_reset")
                pages.append(Page(f"{name} ({side})", url, model_admin, kind, side, target, post_only))
    for route, pattern in _flatten(get_resolver().url_patterns):
        if not route.startswith("admin/") or getattr(pattern.callback, "view_class", None) is RedirectView:
            continue
        url = _fill(route, {**SAMPLE_ARGS, **SAMPLE_ARGS_BY_PAGE.get(pattern.name or "", {})})
        pages.append(Page(pattern.name or route, url, None, "platform"))
    return pages


def _superuser_may(model_admin: admin.ModelAdmin, kind: str, obj: Any, su: Any) -> bool:
    request = RequestFactory().get("/")
    request.user = su
    if kind == "add":
        return model_admin.has_add_permission(request)
    if kind == "delete":
        return model_admin.has_delete_permission(request, obj)
    return True


def expected(role: str, page: Page, world: World) -> str:
    """login | refused (403/404) | hidden (404) | ok."""
    if role in ("anonymous", "nonstaff"):
        return "login"
    if page.admin is None:  # a platform page
        return "ok" if role in ("operator", "superuser") else "refused"
    obj = (world.a if page.side != "b" else world.b).get(page.model or page.admin.model)
    if page.kind in ("add", "delete") and not _superuser_may(
        page.admin, page.kind, obj, world.users["superuser"]
    ):
        return "refused"
    tenant = isinstance(page.admin, tenancy.TenantAdmin)
    if role == "superuser":
        return "ok"
    if role == "operator":  # the project's admins; Django's users and groups, axes' logs: superusers
        return "ok" if tenant or getattr(page.admin, "platform_admin", False) else "refused"
    # an organization's member (of A)
    model = page.model or page.admin.model
    if not isinstance(page.admin, tenancy.TenantAdmin) or (
        page.admin.tenant_path is None and model is page.admin.model
    ):
        return "refused"
    if page.side == "b":
        return "hidden"
    changes = page.kind in ("add", "delete") or page.post_only
    if changes and (role == "viewer" or (page.kind, model) in OPERATOR_ONLY | HISTORY):
        return "refused"
    return "ok"


def _ask(client: Client, page: Page):
    if page.admin is None:
        _sample_job()  # a platform page before may have deleted or moved it
    if page.post_only:
        return client.post(page.url)
    response = client.get(page.url)
    return response


def _outcome(response) -> str:
    if response.status_code == 302 and "/admin/login/" in response["Location"]:
        return "login"
    if response.status_code == 404:
        return "hidden"
    if response.status_code == 403:
        return "refused"
    if response.status_code in (200, 302, 405):
        return "ok"
    return f"status {response.status_code}"


@pytest.mark.parametrize("role", ROLES)
def test_every_admin_page(world: World, role: str) -> None:
    client = world.clients[role]
    pages = admin_pages(world)
    assert len({p.admin for p in pages if p.admin}) == len(admin.site._registry)
    assert any(p.kind == "platform" and "/admin/rq/" in p.url for p in pages)
    assert any(p.kind == "platform" and "/admin/queues/" in p.url for p in pages)
    wrong = []
    for page in pages:
        response = _ask(client, page)
        got, want = _outcome(response), expected(role, page, world)
        # Refused may be a 404; a platform page may not find the sample job or worker it is asked for.
        platform_miss = page.admin is None and want == "ok" and got == "hidden"
        # B's object: a 404, or the 403 a nonexistent object gets too (delete is checked first).
        unseen = want == "hidden" and got == "refused"
        if not (got == want or (want == "refused" and got == "hidden") or platform_miss or unseen):
            wrong.append(f"{page.label} {page.url}: {got}, expected {want}")
        if role in ("viewer", "manager") and response.status_code == 200:
            body = response.content.lower()
            if SECRET in body:
                wrong.append(f"{page.label} {page.url}: shows B's object to A's {role}")
            cl = response.context and response.context.get("cl")
            if isinstance(cl, ChangeList) and isinstance(page.admin, tenancy.TenantAdmin):
                orgs = {tenancy.organization_of(o, page.admin.tenant_path) for o in cl.result_list}
                if orgs - {world.a[Organization].pk}:
                    wrong.append(f"{page.label}: lists organizations {orgs}")
    assert not wrong, "\n".join(wrong)


def test_the_admin_index_and_related_choices_show_only_the_members_organizations(world: World) -> None:
    manager = world.clients["manager"]
    index = manager.get("/admin/").content.decode()
    assert (
        "/admin/queues/" not in index and "/admin/schedules/" not in index and "/admin/metrics" not in index
    )
    assert "/admin/runner/integrationtype/" not in index and "/admin/crm/membership/" not in index
    assert "/admin/campaigns/campaign/" in index
    operator = world.clients["operator"].get("/admin/").content.decode()
    assert "/admin/queues/" in operator and "/admin/crm/membership/" in operator

    form = manager.get("/admin/campaigns/campaign/add/")
    choices = {str(o.pk) for o in form.context["adminform"].form.fields["organization"].queryset}
    assert choices == {str(world.a[Organization].pk)}
    # A campaign for B cannot be created by A's manager, even by posting B's id.
    created = manager.post(
        "/admin/campaigns/campaign/add/",
        {"organization": world.b[Organization].pk, "name": "intruso", "channel": "whatsapp"},
    )
    assert created.status_code == 200 and not Campaign.objects.filter(name="intruso").exists()
    filters = manager.get("/admin/crm/customer/").content.lower()
    assert SECRET not in filters


def test_a_viewer_changes_nothing_through_forms_and_a_manager_nothing_of_b(world: World) -> None:
    viewer, manager = world.clients["viewer"], world.clients["manager"]
    campaign_a, campaign_b = world.a[Campaign], world.b[Campaign]
    change = "/admin/campaigns/campaign/{}/change/"
    posted = {"organization": campaign_a.organization_id, "name": "renamed", "channel": "whatsapp"}
    assert viewer.post(change.format(campaign_a.pk), posted).status_code == 403
    assert viewer.post("/admin/campaigns/campaign/add/", posted).status_code == 403
    assert (
        viewer.post(f"/admin/campaigns/campaign/{campaign_a.pk}/delete/", {"post": "yes"}).status_code == 403
    )
    assert manager.post(change.format(campaign_b.pk), posted).status_code == 404
    assert (
        manager.post(f"/admin/campaigns/campaign/{campaign_b.pk}/delete/", {"post": "yes"}).status_code == 404
    )
    names = set(Campaign.objects.values_list("name", flat=True))
    assert names == {"alfa campaign", "bravo campaign"}
    # The manager's own organization: the form is theirs to save (a viewer's has no save button).
    assert 'name="_save"' in manager.get(change.format(campaign_a.pk)).content.decode()
    assert 'name="_save"' not in viewer.get(change.format(campaign_a.pk)).content.decode()


# --- the actions ----------------------------------------------------------------------------------


@pytest.fixture
def calls(monkeypatch) -> list[tuple[str, str, list[int]]]:
    """Every admin action recorded (with the rows it was given) instead of run."""
    seen: list[tuple[str, str, list[int]]] = []
    original = admin.ModelAdmin.get_action

    def recorder(func: Any, name: str) -> Any:
        @functools.wraps(func)
        def record(modeladmin: admin.ModelAdmin, request: Any, queryset: Any) -> None:
            seen.append((type(modeladmin).__name__, name, sorted(queryset.values_list("pk", flat=True))))

        return record

    def spying(self: admin.ModelAdmin, action: Any) -> Any:
        got = original(self, action)
        if got is None:
            return None
        func, name, description = got
        return recorder(func, name), name, description

    monkeypatch.setattr(admin.ModelAdmin, "get_action", spying)
    for name, func in list(admin.site.actions):  # the site's own (delete_selected)
        monkeypatch.setitem(admin.site._actions, name, recorder(func, name))
    return seen


def admin_actions(world: World) -> list[tuple[admin.ModelAdmin, str, tuple[str, ...]]]:
    request = RequestFactory().get("/")
    request.user = world.users["superuser"]
    found = []
    for model_admin in admin.site._registry.values():
        actions: dict[str, Any] = model_admin.get_actions(request)
        for name, action in actions.items():
            found.append((model_admin, name, tuple(getattr(action[0], "allowed_permissions", ()))))
    return found


@pytest.mark.parametrize("role", ROLES)
def test_every_admin_action(world: World, role: str, calls) -> None:
    client = world.clients[role]
    actions = admin_actions(world)
    assert {name for _admin, name, _perms in actions} >= {
        "start",
        "run_now",
        "send_test_email",
        "check_connection",
    }
    wrong = []
    for model_admin, name, permissions in actions:
        model = model_admin.model
        tenant = isinstance(model_admin, tenancy.TenantAdmin)
        a, b = world.a.get(model), world.b.get(model)
        if a is None or b is None:
            continue  # a third-party admin without objects here (users, groups, login attempts)
        opts = model._meta
        calls.clear()
        client.post(
            f"/admin/{opts.app_label}/{opts.model_name}/",
            {"action": name, "_selected_action": [a.pk, b.pk], "index": 0},
        )
        ran = [pks for admin_name, action, pks in calls if action == name]
        if role in ("anonymous", "nonstaff", "viewer"):
            want: list[int] | None = None
        elif role == "superuser" or (role == "operator" and tenant):
            want = sorted({a.pk, b.pk})
        elif (
            role == "manager"
            and isinstance(model_admin, tenancy.TenantAdmin)
            and model_admin.tenant_path is not None
        ):
            operator_only = "operate" in permissions or (
                "delete" in permissions and ("delete", model) in OPERATOR_ONLY
            )
            want = None if operator_only else [a.pk]
        else:
            want = None
        if (ran[0] if ran else None) != want:
            wrong.append(f"{type(model_admin).__name__}.{name} as {role}: ran on {ran}, expected {want}")
    assert not wrong, "\n".join(wrong)


# --- prefilled forms, raw-id labels, filter choices, error messages ----------------------------------


def _relation_fields(model: Any) -> Iterator[Any]:
    """Every foreign key, one-to-one and many-to-many field of `model` that a form may carry."""
    for field in model._meta.get_fields():
        if (
            field.is_relation
            and field.concrete
            and (field.many_to_one or field.one_to_one or field.many_to_many)
        ):
            yield field


def _tenant_admins() -> Iterator[tuple[Any, tenancy.TenantAdmin]]:
    for model, model_admin in admin.site._registry.items():
        if isinstance(model_admin, tenancy.TenantAdmin) and model_admin.tenant_path is not None:
            yield model, model_admin


def _url(model: Any, page: str, pk: Any = None) -> str:
    opts = model._meta
    return f"/admin/{opts.app_label}/{opts.model_name}/" + (f"{pk}/{page}/" if pk is not None else f"{page}/")


def test_get_parameters_that_prefill_a_form_name_nothing_of_another_organization(world: World) -> None:
    """Every relation field of every admin's add form, prefilled with B's object through the URL
    (?customer=<id>, ?store=, the campaign's ?audience_store=…): no name, email or phone of B's."""
    manager = world.clients["manager"]
    wrong, asked = [], 0
    for model, _model_admin in _tenant_admins():
        for field in _relation_fields(model):
            target = world.b.get(field.related_model)
            if target is None or tenancy.tenant_path_of(admin.site, field.related_model) in (False, None):
                continue
            for page, pk in (("add", None), ("change", world.a[model].pk if model in world.a else None)):
                if page == "change" and pk is None:
                    continue
                response = manager.get(_url(model, page, pk), {field.name: target.pk})
                asked += 1
                if response.status_code >= 500 or SECRET in response.content.lower():
                    wrong.append(f"{_url(model, page, pk)}?{field.name}={target.pk}: {response.status_code}")
    assert asked > 20
    assert {"customer", "store", "audience_store"} <= {
        f.name for m, _a in _tenant_admins() for f in _relation_fields(m)
    }
    assert not wrong, "\n".join(wrong)


def test_raw_id_widgets_label_only_the_users_organizations_rows(world: World) -> None:
    """Every raw-id field of every admin, posted with B's id: the form comes back with an error and
    the widget names nothing of B (its label is looked up like the choices)."""
    manager = world.clients["manager"]
    wrong, asked = [], 0
    for model, model_admin in _tenant_admins():
        for name in model_admin.raw_id_fields:
            field = model._meta.get_field(name)
            target = world.b.get(field.related_model)
            if target is None:
                continue
            data = {"organization": world.a[Organization].pk, name: target.pk}
            for url in (_url(model, "add"), _url(model, "change", world.a[model].pk)):
                response = manager.post(url, data)
                asked += 1
                if response.status_code >= 500 or SECRET in response.content.lower():
                    wrong.append(f"POST {url} {name}={target.pk}: {response.status_code}")
    assert asked >= 6
    assert not wrong, "\n".join(wrong)


def test_list_filters_offer_only_the_users_organizations_choices(world: World) -> None:
    """Every changelist's filters (the segment day filter too): no choice of B's."""
    from campaigns.models import SegmentMovement

    SegmentMovement.objects.create(
        organization=world.b[Organization],
        day=date(2026, 10, 9),
        from_segment="",
        to_segment="new",
        customers=1,
    )
    SegmentMovement.objects.create(
        organization=world.a[Organization],
        day=date(2026, 10, 20),
        from_segment="",
        to_segment="new",
        customers=1,
    )
    manager = world.clients["manager"]
    wrong = []
    for model, _model_admin in _tenant_admins():
        response = manager.get(_url(model, "").rstrip("/") + "/")
        cl = response.context and response.context.get("cl")
        if not isinstance(cl, ChangeList):
            continue
        for spec in cl.filter_specs:
            for choice in spec.choices(cl):
                display = str(choice.get("display", "")).lower()
                if "bravo" in display or "2026-10-09" in str(choice.get("query_string", "")):
                    wrong.append(f"{model.__name__} filter {spec.title}: {display}")
    segments = manager.get("/admin/campaigns/customersegment/").content.decode()
    assert "day=2026-10-20" in segments
    assert not wrong, "\n".join(wrong)


def _unique_checks_across_organizations(model: Any, tenant_field: str | None) -> list[tuple[str, ...]]:
    checks, _dates = model()._get_unique_checks()
    for constraint in model._meta.constraints:
        fields = getattr(constraint, "fields", ())
        if fields and getattr(constraint, "condition", None) is None:
            checks.append((model, tuple(fields)))
    return [
        tuple(fields)
        for _model, fields in checks
        if "id" not in fields and (tenant_field is None or tenant_field not in fields)
    ]


def test_uniqueness_errors_never_say_what_another_organization_holds(world: World) -> None:
    """B's value of every field that is unique across organizations (a Meta phone number id, a slug,
    a handler's key), posted by A's manager: one generic message, not which model or field has it."""
    manager = world.clients["manager"]
    wrong, generic = [], set()
    for model, model_admin in _tenant_admins():
        path = model_admin.tenant_path or ""
        tenant_field = None if path == "pk" else path.split("__")[0]
        a, b = world.a.get(model), world.b.get(model)
        if a is None or b is None:
            continue
        for fields in _unique_checks_across_organizations(model, tenant_field):
            data: dict[str, Any] = {"organization": world.a[Organization].pk}
            for name in fields:
                data[name] = getattr(b, model._meta.get_field(name).attname)
            if None in data.values():
                continue  # Django checks no uniqueness over a NULL
            response = manager.post(_url(model, "change", a.pk), data)
            if response.status_code in (403, 404):
                continue  # the manager may not change this model's rows (read-only, platform)
            body = response.content.decode()
            leaked = b.unique_error_message(model, fields).messages[0]
            # A 302: the form has none of these fields to post (all read-only), nothing was said.
            if response.status_code >= 400 or leaked in body:
                wrong.append(f"{model.__name__} {fields}: {response.status_code}, {leaked!r}")
            if str(tenancy.TAKEN) in body:
                generic.add(model)
    assert not wrong, "\n".join(wrong)
    assert {Organization, WhatsappNumber} <= generic


def test_posting_another_organizations_id_to_the_campaign_form_shows_nothing_of_it(world: World) -> None:
    Organization.objects.filter(pk=world.b[Organization].pk).update(timezone="America/Manaus")
    response = world.clients["manager"].post(
        "/admin/campaigns/campaign/add/",
        {"organization": world.b[Organization].pk, "name": "intruso", "channel": "whatsapp"},
    )
    assert response.status_code == 200
    assert b"Manaus" not in response.content and b"campaign-time-zone" not in response.content
    assert not Campaign.objects.filter(name="intruso").exists()


TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "/srv/crm/app/erp/sync.py", line 42, in sync_sales\n'
    "    rows = fetch(token=settings.ERP_TOKEN)\n"
    "ValueError: the ERP answered 500\n"
)


def test_job_run_tracebacks_are_for_platform_operators_members_see_the_reason(world: World) -> None:
    run = world.a[JobRun]
    JobRun.objects.filter(pk=run.pk).update(status="failed", error=TRACEBACK)
    url = f"/admin/crm/jobrun/{run.pk}/change/"
    for role in ("viewer", "manager"):
        body = world.clients[role].get(url).content.decode()
        assert "ValueError: the ERP answered 500" in body, role
        assert "/srv/crm/app" not in body and "ERP_TOKEN" not in body and "Traceback" not in body, role
    body = world.clients["operator"].get(url).content.decode()
    assert "/srv/crm/app/erp/sync.py" in body


def test_runner_run_refuses_to_run_one_organizations_handler_for_another(world: World, english: None) -> None:
    from django.core.management import call_command
    from django.core.management.base import CommandError

    handler = world.a[Handler]
    with pytest.raises(CommandError, match="another organization"):
        call_command("runner_run", handler.integration.integration_key, handler.handler_key, "--org", "bravo")
    assert not Execution.objects.filter(handler=handler, organization=world.b[Organization]).exists()
