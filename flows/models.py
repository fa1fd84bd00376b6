"""Flows: an organization's event-triggered journeys, who is in them, and each step done once."""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.utils import timezone as dj_timezone
from django.utils.translation import gettext_lazy as _

from campaigns.models import CONTROL_MAX_PERCENT, Campaign
from crm.models import Customer, Organization
from flows.schema import STEP_TYPES, TRIGGER_TYPES

# What a manager reads for the flow language's words (flows.schema): every type has its label.
_TRIGGER_LABELS = {
    "sale": _("a sale"),
    "customer_created": _("customer created"),
    "date": _("a date"),
    "no_purchase": _("no purchase"),
    "segment_entered": _("entered a segment"),
    "whatsapp_reply": _("WhatsApp reply"),
    "link_clicked": _("link clicked"),
    "survey_answered": _("survey answered"),
}
_STEP_LABELS = {
    "wait": _("wait"),
    "send_whatsapp": _("send a WhatsApp message"),
    "send_email": _("send an email"),
    "condition": _("condition"),
    "split": _("split"),
    "handoff": _("hand off to an agent"),
    "runner": _("integration runner"),
}
TRIGGER_CHOICES = [(kind, _TRIGGER_LABELS[kind]) for kind in TRIGGER_TYPES]
STEP_CHOICES = [(kind, _STEP_LABELS[kind]) for kind in STEP_TYPES]


def step_label(kind: str) -> str:
    """A step type as a manager reads it (the type itself when unknown)."""
    return str(_STEP_LABELS.get(kind, kind))


def _once() -> str:
    return "once"


class Flow(models.Model):
    """A trigger, ordered steps and guards, defined as JSON (flows.schema validates every key)."""

    organization = models.ForeignKey(
        Organization, on_delete=models.CASCADE, related_name="flows", verbose_name=_("organization")
    )
    key = models.SlugField(_("key"), max_length=100)
    name = models.CharField(_("name"), max_length=200)
    trigger = models.JSONField(_("trigger"), default=dict)
    reentry = models.JSONField(_("reentry"), default=_once)
    exit_on = models.JSONField(_("exit on"), default=list, blank=True)
    steps = models.JSONField(_("steps"), default=list)
    paused = models.BooleanField(_("paused"), default=False)
    transactional = models.BooleanField(
        _("transactional"),
        default=False,
        help_text=_("Exempt from the contact caps (never from opt-outs or consent)."),
    )
    # Bumped whenever the steps change: a step's messages belong to the campaign of its version.
    version = models.PositiveIntegerField(_("version"), default=1, editable=False)
    # The trigger's type, copied from `trigger` for the indexed lookups of the event consumers.
    trigger_type = models.CharField(
        _("trigger type"), max_length=32, editable=False, default="", choices=TRIGGER_CHOICES
    )
    created_at = models.DateTimeField(_("created at"), default=dj_timezone.now, editable=False)
    updated_at = models.DateTimeField(_("updated at"), auto_now=True)

    class Meta:
        verbose_name = _("flow")
        verbose_name_plural = _("flows")
        ordering = ["organization_id", "key"]
        constraints = [models.UniqueConstraint(fields=["organization", "key"], name="flow_unique_key")]
        indexes = [models.Index(fields=["trigger_type", "organization"], name="flow_trigger_type_org")]

    def __str__(self) -> str:
        return f"{self.key}: {self.name}"

    def save(self, *args: object, **kwargs: object) -> None:
        self.trigger_type = str((self.trigger or {}).get("type", ""))
        super().save(*args, **kwargs)  # type: ignore[arg-type]

    @property
    def control_percent(self) -> int:
        """The control share its step campaigns carry: the percent of its split steps' holdout
        branches (the largest split's, within the campaigns' 1-50), 0 without one. It marks the
        step campaigns whose sales the lift rollup follows (campaigns.lift); the draw is the split's."""
        shares = [
            sum(b["percent"] for b in step["branches"] if b.get("holdout"))
            for step in self.steps or []
            if step.get("type") == "split"
        ]
        share = max(shares, default=0)
        return min(CONTROL_MAX_PERCENT, max(1, share)) if share else 0


class Enrollment(models.Model):
    """One customer's journey through a flow, from one trigger: its next step and when it is due."""

    class Status(models.TextChoices):
        ACTIVE = "active", _("active")
        COMPLETED = "completed", _("completed")
        EXITED = "exited", _("exited")

    flow = models.ForeignKey(
        Flow, on_delete=models.CASCADE, related_name="enrollments", verbose_name=_("flow")
    )
    organization = models.ForeignKey(
        Organization,
        on_delete=models.CASCADE,
        related_name="+",
        db_index=False,
        verbose_name=_("organization"),
    )
    customer = models.ForeignKey(
        Customer, on_delete=models.CASCADE, related_name="flow_enrollments", verbose_name=_("customer")
    )
    # The customer's n-th entry into this flow: unique, so two concurrent entries cannot both win.
    round = models.PositiveIntegerField(_("round"), default=1)
    # What made it enter (a sale id, a local day, a reply's id): the same fact never enrolls twice.
    entry_key = models.CharField(_("entry key"), max_length=120)
    status = models.CharField(_("status"), max_length=10, choices=Status.choices, default=Status.ACTIVE)
    step_index = models.PositiveIntegerField(_("next step"), default=0)
    due_at = models.DateTimeField(_("next step due at"), null=True, blank=True)
    branch = models.CharField(_("split branch"), max_length=40, blank=True, default="")
    holdout = models.BooleanField(_("holdout"), default=False)
    replied_at = models.DateTimeField(_("replied at"), null=True, blank=True)
    entered_at = models.DateTimeField(_("entered at"), default=dj_timezone.now)
    finished_at = models.DateTimeField(_("finished at"), null=True, blank=True)
    exit_reason = models.CharField(_("exit reason"), max_length=200, blank=True, default="")

    class Meta:
        verbose_name = _("enrollment")
        verbose_name_plural = _("enrollments")
        constraints = [
            models.UniqueConstraint(fields=["flow", "customer", "round"], name="enrollment_round_once"),
            models.UniqueConstraint(fields=["flow", "customer", "entry_key"], name="enrollment_entry_once"),
        ]
        indexes = [
            # The tick: what is due, and only that (never a scan of every enrollment).
            models.Index(fields=["due_at"], name="enrollment_due", condition=Q(status="active")),
            # exit_on and replies: a customer's active enrollments.
            models.Index(
                fields=["customer"], name="enrollment_customer_active", condition=Q(status="active")
            ),
            models.Index(fields=["flow", "status"], name="enrollment_flow_status"),
        ]

    def __str__(self) -> str:
        return f"{self.flow_id}/{self.customer_id}#{self.round} {self.status}"


class EnrollmentStep(models.Model):
    """A step of an enrollment that ran: unique, so each runs exactly once whatever retries."""

    class Outcome(models.TextChoices):
        DONE = "done", _("done")
        QUEUED = "queued", _("message queued")
        SKIPPED = "skipped", _("skipped")
        HOLDOUT = "holdout", _("holdout (nothing sent)")
        EXITED = "exited", _("exited here")
        PENDING = "pending", _("pending")

    enrollment = models.ForeignKey(
        Enrollment, on_delete=models.CASCADE, related_name="done_steps", verbose_name=_("enrollment")
    )
    flow = models.ForeignKey(
        Flow, on_delete=models.CASCADE, related_name="+", db_index=False, verbose_name=_("flow")
    )
    index = models.PositiveIntegerField(_("step"))
    type = models.CharField(_("type"), max_length=20, choices=STEP_CHOICES)
    outcome = models.CharField(_("outcome"), max_length=10, choices=Outcome.choices, default=Outcome.DONE)
    detail = models.CharField(_("detail"), max_length=300, blank=True, default="")
    campaign = models.ForeignKey(
        Campaign,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        verbose_name=_("campaign"),
    )
    at = models.DateTimeField(_("at"), default=dj_timezone.now)

    class Meta:
        verbose_name = _("enrollment step")
        verbose_name_plural = _("enrollment steps")
        constraints = [models.UniqueConstraint(fields=["enrollment", "index"], name="enrollment_step_once")]
        indexes = [models.Index(fields=["flow", "index", "outcome"], name="enrollstep_flow_index")]

    def __str__(self) -> str:
        return f"{self.enrollment_id}:{self.index} {self.outcome}"


class StepCampaign(models.Model):
    """The campaign that carries a send step's messages: one per (flow, version, step, round), so
    the campaign's one-message-per-customer constraint is the step's exactly-once send, and its
    attribution, pacing, caps and error policy are the campaigns'."""

    flow = models.ForeignKey(
        Flow, on_delete=models.CASCADE, related_name="step_campaigns", verbose_name=_("flow")
    )
    version = models.PositiveIntegerField(_("version"))
    index = models.PositiveIntegerField(_("step"))
    round = models.PositiveIntegerField(_("round"))
    campaign = models.OneToOneField(
        Campaign, on_delete=models.CASCADE, related_name="flow_step", verbose_name=_("campaign")
    )

    class Meta:
        verbose_name = _("step campaign")
        verbose_name_plural = _("step campaigns")
        constraints = [
            models.UniqueConstraint(fields=["flow", "version", "index", "round"], name="step_campaign_once")
        ]

    def __str__(self) -> str:
        return f"{self.flow_id} v{self.version} step {self.index} round {self.round}"


class DailyPass(models.Model):
    """A time-based trigger's pass over one local day: done once, even if the scheduler runs twice."""

    flow = models.ForeignKey(Flow, on_delete=models.CASCADE, related_name="+", verbose_name=_("flow"))
    day = models.DateField(_("local day"))
    entered = models.PositiveIntegerField(_("entered"), default=0)
    at = models.DateTimeField(_("at"), default=dj_timezone.now)

    class Meta:
        verbose_name = _("daily pass")
        verbose_name_plural = _("daily passes")
        constraints = [models.UniqueConstraint(fields=["flow", "day"], name="daily_pass_once")]

    def __str__(self) -> str:
        return f"{self.flow_id} {self.day}"
