"""The integration runner's rows: integration types, handlers, executions (runs) and their items."""

from __future__ import annotations

from django.core.validators import MinValueValidator
from django.db import models
from django.db.models import Q
from django.utils.translation import gettext_lazy as _

from crm import crypto
from crm.models import Organization
from integrations.outbound import validate_outbound_url

MAX_ATTEMPTS = 3  # every attempt counted, the first included (seed 000)
# A longer event id is recorded as its SHA-256 (runner.events.event_key), never cut.
EVENT_ID_MAX = 200


class Direction(models.TextChoices):
    INBOUND = "inbound", _("inbound")
    OUTBOUND = "outbound", _("outbound")


class Trigger(models.TextChoices):
    WEBHOOK = "webhook", _("webhook")
    MANUAL = "manual", _("manual")
    QUEUE = "queue", _("queue")
    SCHEDULE = "schedule", _("schedule")


class IntegrationType(models.Model):
    integration_key = models.SlugField(_("integration key"), max_length=64, unique=True)
    name = models.CharField(_("name"), max_length=200)
    enabled = models.BooleanField(_("enabled"), default=True)

    class Meta:
        verbose_name = _("integration type")
        verbose_name_plural = _("integration types")
        ordering = ["integration_key"]

    def __str__(self) -> str:
        return self.integration_key


class Handler(models.Model):
    class Kind(models.TextChoices):
        PYTHON = "python", _("in-process Python callable")
        HTTP = "http", _("HTTP endpoint")

    class WebhookAuth(models.TextChoices):
        HMAC = "hmac", _("HMAC-SHA256 signature")
        TOKEN = "token", _("bearer token")

    integration = models.ForeignKey(
        IntegrationType, on_delete=models.CASCADE, related_name="handlers", verbose_name=_("integration")
    )
    handler_key = models.SlugField(_("handler key"), max_length=64)
    direction = models.CharField(_("direction"), max_length=10, choices=Direction.choices)
    kind = models.CharField(_("kind"), max_length=10, choices=Kind.choices, default=Kind.PYTHON)
    callable_path = models.CharField(
        _("Python object"),
        max_length=200,
        blank=True,
        default="",
        help_text=_("Dotted path to a module or object with process(item) and optionally produce(run)."),
    )
    endpoint_url = models.URLField(
        _("endpoint URL"), blank=True, default="", validators=[validate_outbound_url]
    )
    auth_header = models.CharField(_("auth header name"), max_length=64, blank=True, default="Authorization")
    auth_value_encrypted = models.TextField(_("auth header value (encrypted)"), blank=True, default="")
    organization = models.ForeignKey(
        Organization,
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="runner_handlers",
        verbose_name=_("organization"),
        help_text=_(
            "The tenant of its webhooks and schedules. Empty: every organization (webhooks name it)."
        ),
    )
    concurrency = models.PositiveIntegerField(_("concurrency"), default=10, validators=[MinValueValidator(1)])
    rate_limit_per_minute = models.PositiveIntegerField(
        _("rate limit per minute"), default=0, help_text=_("0: no limit.")
    )
    batch_size = models.PositiveIntegerField(_("batch size"), default=1, validators=[MinValueValidator(1)])
    paused = models.BooleanField(_("paused"), default=False)
    schedule_cron = models.CharField(
        _("schedule (cron)"),
        max_length=100,
        blank=True,
        default="",
        help_text=_("Five cron fields in the organization's time zone. Empty: not scheduled."),
    )
    webhook_auth = models.CharField(
        _("webhook authentication"), max_length=10, choices=WebhookAuth.choices, default=WebhookAuth.HMAC
    )
    webhook_secret_encrypted = models.TextField(_("webhook secret (encrypted)"), blank=True, default="")

    class Meta:
        verbose_name = _("handler")
        verbose_name_plural = _("handlers")
        ordering = ["integration__integration_key", "handler_key"]
        constraints = [
            models.UniqueConstraint(fields=["integration", "handler_key"], name="runner_handler_unique_key")
        ]

    def __str__(self) -> str:
        return f"{self.integration.integration_key}/{self.handler_key}"

    def set_auth_value(self, value: str) -> None:
        self.auth_value_encrypted = crypto.encrypt(value, context="runner:auth") if value else ""

    def auth_value(self) -> str:
        return (
            crypto.decrypt(self.auth_value_encrypted, context="runner:auth")
            if self.auth_value_encrypted
            else ""
        )

    def set_webhook_secret(self, value: str) -> None:
        self.webhook_secret_encrypted = crypto.encrypt(value, context="runner:webhook") if value else ""

    def webhook_secret(self) -> str:
        if not self.webhook_secret_encrypted:
            return ""
        return crypto.decrypt(self.webhook_secret_encrypted, context="runner:webhook")


DEFAULT_TENANT_LIMIT = 1000  # items per minute of an organization without RunnerSettings


class RunnerSettings(models.Model):
    """Runner settings of one organization (kept here so crm's migrations stay untouched)."""

    organization = models.OneToOneField(
        Organization, on_delete=models.CASCADE, related_name="runner_settings", verbose_name=_("organization")
    )
    rate_limit_per_minute = models.PositiveIntegerField(
        _("items per minute"), default=DEFAULT_TENANT_LIMIT, validators=[MinValueValidator(1)]
    )

    class Meta:
        verbose_name = _("runner settings of an organization")
        verbose_name_plural = _("runner settings of organizations")

    def __str__(self) -> str:
        return str(self.organization)


class Execution(models.Model):
    class Status(models.TextChoices):
        PENDING = "pending", _("pending")
        RUNNING = "running", _("running")
        COMPLETED = "completed", _("completed")
        FAILED = "failed", _("failed")
        CANCELLED = "cancelled", _("cancelled")

    organization = models.ForeignKey(
        Organization,
        on_delete=models.CASCADE,
        related_name="runner_executions",
        verbose_name=_("organization"),
    )
    integration = models.ForeignKey(
        IntegrationType, on_delete=models.CASCADE, related_name="executions", verbose_name=_("integration")
    )
    handler = models.ForeignKey(
        Handler, on_delete=models.CASCADE, related_name="executions", verbose_name=_("handler")
    )
    direction = models.CharField(_("direction"), max_length=10, choices=Direction.choices)
    trigger = models.CharField(_("trigger"), max_length=10, choices=Trigger.choices)
    status = models.CharField(_("status"), max_length=10, choices=Status.choices, default=Status.PENDING)
    items_total = models.PositiveIntegerField(_("items"), default=0)
    items_succeeded = models.PositiveIntegerField(_("succeeded"), default=0)
    items_failed = models.PositiveIntegerField(_("failed (DLQ)"), default=0)
    items_cancelled = models.PositiveIntegerField(_("cancelled"), default=0)
    # The fan-in counter: items not yet final, plus one while the run is still producing.
    items_remaining = models.IntegerField(_("remaining"), default=1)
    error = models.TextField(_("error"), blank=True, default="")
    created_at = models.DateTimeField(_("created at"), auto_now_add=True)
    started_at = models.DateTimeField(_("started at"), null=True, blank=True)
    # Set once every item exists: the run's own +1 on items_remaining is released then.
    fanned_out_at = models.DateTimeField(_("fanned out at"), null=True, blank=True)
    finished_at = models.DateTimeField(_("finished at"), null=True, blank=True)
    # A run larger than a minute of its tenant's limit is fed to the queue a slice at a time: its
    # items up to this id have jobs; the feeder job enqueues the next slice (None: all at once).
    fed_through = models.BigIntegerField(_("fed through item"), null=True, blank=True, editable=False)

    class Meta:
        verbose_name = _("execution")
        verbose_name_plural = _("executions")
        ordering = ["-id"]
        indexes = [
            models.Index(fields=["handler", "-created_at"], name="runner_exec_handler_idx"),
            models.Index(fields=["organization", "-created_at"], name="runner_exec_org_idx"),
            models.Index(
                fields=["status"],
                name="runner_exec_unfinished_idx",
                condition=Q(status__in=["pending", "running"]),
            ),
        ]

    def __str__(self) -> str:
        return f"#{self.pk} {self.handler_id} ({self.trigger})"


class ExecutionItem(models.Model):
    class Status(models.TextChoices):
        PENDING = "pending", _("pending")
        RUNNING = "running", _("running")
        SUCCEEDED = "succeeded", _("succeeded")
        FAILED = "failed", _("failed")
        CANCELLED = "cancelled", _("cancelled")

    execution = models.ForeignKey(
        Execution, on_delete=models.CASCADE, related_name="items", verbose_name=_("execution"), db_index=False
    )
    external_id = models.CharField(_("external id"), max_length=200, blank=True, default="")
    payload = models.JSONField(_("payload"), default=dict, blank=True)
    status = models.CharField(_("status"), max_length=10, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveSmallIntegerField(_("attempts"), default=0)
    last_error = models.TextField(_("last error"), blank=True, default="")
    result = models.JSONField(_("result"), null=True, blank=True)
    created_at = models.DateTimeField(_("created at"), auto_now_add=True)
    started_at = models.DateTimeField(_("started at"), null=True, blank=True)
    finished_at = models.DateTimeField(_("finished at"), null=True, blank=True)
    dlq_at = models.DateTimeField(_("in DLQ since"), null=True, blank=True)

    class Meta:
        verbose_name = _("execution item")
        verbose_name_plural = _("execution items")
        ordering = ["id"]
        indexes = [
            models.Index(fields=["execution", "status", "id"], name="runner_item_exec_status_idx"),
            models.Index(fields=["dlq_at"], name="runner_item_dlq_idx", condition=Q(dlq_at__isnull=False)),
            models.Index(
                fields=["status", "id"],
                name="runner_item_unfinished_idx",
                condition=Q(status__in=["pending", "running"]),
            ),
        ]

    def __str__(self) -> str:
        return f"item #{self.pk} {self.external_id}"


class WebhookEvent(models.Model):
    """An event id seen by a handler for an organization (a webhook's event id, an AMQP message's
    id — SHA-256 of it past EVENT_ID_MAX —, or the SHA-256 of an id-less AMQP message's body): a
    provider's retry or a broker's redelivery of the same event is not stored again (see
    runner.events.events_store). Kept WEBHOOK_EVENT_KEEP (runner.events), pruned by the runner-event-ids-prune
    cron."""

    # No index of their own (a row is written per event with an id): the unique constraint leads
    # with the handler, and an organization's events are looked up only when it is deleted.
    # No database foreign keys: the webhook request writes this row alone, with the id its
    # execution will have once a worker drains the inbox (runner.events.webhook_receive), and the
    # deferred checks would lock the same handler and organization rows for every concurrent
    # request. Deleting through Django still cascades (and sets execution to NULL).
    handler = models.ForeignKey(
        Handler,
        on_delete=models.CASCADE,
        related_name="+",
        verbose_name=_("handler"),
        db_index=False,
        db_constraint=False,
    )
    organization = models.ForeignKey(
        Organization,
        on_delete=models.CASCADE,
        related_name="+",
        verbose_name=_("organization"),
        db_index=False,
        db_constraint=False,
    )
    event_id = models.CharField(_("event id"), max_length=EVENT_ID_MAX)
    execution = models.ForeignKey(
        Execution,
        on_delete=models.SET_NULL,
        null=True,
        related_name="+",
        verbose_name=_("execution"),
        db_constraint=False,
    )
    received_at = models.DateTimeField(_("received at"), auto_now_add=True, db_index=True)

    class Meta:
        verbose_name = _("webhook event")
        verbose_name_plural = _("webhook events")
        constraints = [
            models.UniqueConstraint(
                fields=["handler", "organization", "event_id"], name="runner_webhook_event_unique"
            )
        ]

    def __str__(self) -> str:
        return self.event_id
