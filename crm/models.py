"""The core domain every app shares: the tenant, its stores, customers and sales; JobRun checkpoints."""

from __future__ import annotations

import secrets

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models
from django.db.models.functions import Now
from django.utils import timezone as dj_timezone
from django.utils.translation import gettext_lazy as _

from crm.money import format_money

# Revenue attribution (campaigns.attribution): a sale counts for the last campaign message the
# customer was sent at most this many days before it.
ATTRIBUTION_WINDOW_MAX_DAYS = 90
HOLDOUT_MAX_PERCENT = 15


def _holdout_salt() -> str:
    return secrets.token_hex(8)


E164 = RegexValidator(r"^\+[1-9]\d{7,14}$", _("Phone numbers are stored in E.164 form, e.g. +5511987654321."))
# A value that goes into a mail header or a one-line field (a sender's name, a subject): no line
# break or other control character, which would make every message built from it invalid.
SINGLE_LINE = RegexValidator(
    r"[\x00-\x1f\x7f]", _("Use a single line, without line breaks or control characters."), inverse_match=True
)


def _timezone_choices() -> list[tuple[str, str]]:
    return [
        (tz, tz)
        for tz in (
            "America/Sao_Paulo",
            "America/Manaus",
            "America/Recife",
            "America/Belem",
            "America/Fortaleza",
            "America/Cuiaba",
            "America/Porto_Velho",
            "America/Rio_Branco",
            "America/Noronha",
            "UTC",
        )
    ]


class Organization(models.Model):
    """A tenant: a retailer. Carries the seed's campaignSettings."""

    class ContactCapsScope(models.TextChoices):
        SHARED = "shared", _("WhatsApp and email together")
        PER_CHANNEL = "per_channel", _("each channel on its own")

    name = models.CharField(_("name"), max_length=200)
    slug = models.SlugField(_("slug"), unique=True)
    timezone = models.CharField(
        _("time zone"), max_length=64, choices=_timezone_choices(), default="America/Sao_Paulo"
    )
    message_limit_days = models.PositiveSmallIntegerField(
        _("message limit window (days)"),
        default=7,
        validators=[MinValueValidator(1)],
        help_text=_(
            "A customer receives at most 'message limit count' campaign messages in this many days: "
            "WhatsApp and email messages count together unless the caps are set per channel."
        ),
    )
    message_limit_count = models.PositiveSmallIntegerField(
        _("message limit count"),
        default=2,
        validators=[MinValueValidator(1)],
        help_text=_(
            "Campaign messages a customer may receive within the window (WhatsApp and email together "
            "unless the caps are set per channel); one more is skipped."
        ),
    )
    block_multiple_campaigns = models.BooleanField(
        _("block multiple campaigns"),
        default=True,
        help_text=_(
            "Skip a customer who was sent another campaign in the last 24 hours, or whom another "
            "campaign is sending to: on either channel, unless the caps are set per channel."
        ),
    )
    contact_caps_scope = models.CharField(
        _("contact caps count"),
        max_length=12,
        choices=ContactCapsScope.choices,
        default=ContactCapsScope.SHARED,
        help_text=_(
            "Whether the message limit and the multiple-campaign block count WhatsApp and email "
            "messages together (a WhatsApp message and an email are two contacts) or each channel "
            "on its own."
        ),
    )
    attribution_window_days = models.PositiveSmallIntegerField(
        _("attribution window (days)"),
        default=7,
        validators=[MinValueValidator(1), MaxValueValidator(ATTRIBUTION_WINDOW_MAX_DAYS)],
        help_text=_(
            "A sale is attributed to the last campaign message its customer was sent at most this many "
            "days before it. A change applies to sales written from then on; `manage.py attribute` "
            "recomputes the older ones."
        ),
    )
    # Costs are recorded in the provider's currency (WhatsApp: the rate card's, usually USD). With a
    # rate, pages also show them in the organization's currency (reais), labelled as an estimate.
    cost_conversion_rate = models.DecimalField(
        _("cost conversion rate"),
        max_digits=12,
        decimal_places=6,
        null=True,
        blank=True,
        validators=[MinValueValidator(0)],
        help_text=_("How many reais one unit of the currency below is worth, e.g. 5.40 for USD."),
    )
    cost_conversion_currency = models.CharField(
        _("cost conversion currency"), max_length=3, default="USD", help_text=_("ISO 4217, e.g. USD.")
    )
    # Set when a provider says the account itself is unusable (expired token, locked, unpaid):
    # every send of the organization on that channel waits until an operator clears it.
    whatsapp_paused_at = models.DateTimeField(_("WhatsApp sending paused at"), null=True, blank=True)
    whatsapp_paused_reason = models.TextField(_("WhatsApp pause reason"), blank=True, default="")
    # Set when the organization's mail server refuses us (login, TLS, relay): no email goes out
    # until an operator fixes the settings and clears it; recipients are left untouched meanwhile.
    email_paused_at = models.DateTimeField(_("email sending paused at"), null=True, blank=True)
    email_paused_reason = models.TextField(_("email pause reason"), blank=True, default="")
    # Post-sale surveys
    survey_channel = models.CharField(
        _("post-sale survey channel"),
        max_length=10,
        choices=[("off", _("off")), ("email", _("email")), ("whatsapp", _("WhatsApp"))],
        default="off",
    )
    survey_delay_days = models.PositiveSmallIntegerField(
        _("survey delay (days after the sale)"), default=3, validators=[MinValueValidator(0)]
    )
    survey_cooldown_days = models.PositiveSmallIntegerField(
        _("survey cool-down (days)"),
        default=90,
        help_text=_("A customer surveyed within this many days is not surveyed again."),
    )
    survey_whatsapp_template = models.CharField(
        _("survey WhatsApp template"),
        max_length=512,
        blank=True,
        default="",
        help_text=_("An approved template whose URL button 0 ends in {{1}}: it receives the survey link."),
    )
    created_at = models.DateTimeField(_("created at"), default=dj_timezone.now, editable=False)
    queue_weight = models.PositiveSmallIntegerField(
        _("queue weight"),
        default=1,
        validators=[MinValueValidator(1), MaxValueValidator(100)],
        help_text=_(
            "Share of the workers' turns when several organizations have work waiting on a queue: "
            "weight 2 is served twice as often as weight 1."
        ),
    )
    # Incrementality (docs/analytics.md): a global holdout and the attribution's options per channel.
    holdout_percent = models.PositiveSmallIntegerField(
        _("global holdout (%)"),
        default=0,
        validators=[MaxValueValidator(HOLDOUT_MAX_PERCENT)],
        help_text=_(
            "This share of the customers (0-15%) never receives marketing campaigns or flows, so that "
            "what marketing as a whole causes can be measured. Who is in it is sticky: a hash of the "
            "organization, the customer and the salt below."
        ),
    )
    holdout_salt = models.CharField(_("holdout salt"), max_length=32, default=_holdout_salt, editable=False)
    attribution_window_whatsapp_days = models.PositiveSmallIntegerField(
        _("WhatsApp attribution window (days)"),
        null=True,
        blank=True,
        validators=[MinValueValidator(1), MaxValueValidator(ATTRIBUTION_WINDOW_MAX_DAYS)],
        help_text=_("Empty: the attribution window above."),
    )
    attribution_window_email_days = models.PositiveSmallIntegerField(
        _("email attribution window (days)"),
        null=True,
        blank=True,
        validators=[MinValueValidator(1), MaxValueValidator(ATTRIBUTION_WINDOW_MAX_DAYS)],
        help_text=_("Empty: the attribution window above."),
    )
    attribution_engaged_only = models.BooleanField(
        _("attribute only engaged messages"),
        default=False,
        help_text=_(
            "Credit a sale only to a message the customer engaged with before buying: a WhatsApp "
            "message read or clicked, an email clicked (not only sent)."
        ),
    )

    class Meta:
        verbose_name = _("organization")
        verbose_name_plural = _("organizations")
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(attribution_window_days__gte=1)
                & models.Q(attribution_window_days__lte=ATTRIBUTION_WINDOW_MAX_DAYS),
                name="organization_attribution_window_sane",
            ),
            models.CheckConstraint(
                condition=models.Q(holdout_percent__lte=HOLDOUT_MAX_PERCENT),
                name="organization_holdout_percent_range",
            ),
        ]
        permissions = [
            (
                "operate_platform",
                _("Can operate the platform: every organization, the queues, schedules, metrics, circuits"),
            )
        ]

    def __str__(self) -> str:
        return self.name


class HoldoutPeriod(models.Model):
    """One assignment of an organization's global holdout (crm.holdout): its salt and share, from
    when to when. Reshuffling ends the current period and starts one with a new salt, so who was
    held out before can always be computed again."""

    organization = models.ForeignKey(
        Organization, on_delete=models.CASCADE, related_name="holdout_periods", verbose_name=_("organization")
    )
    salt = models.CharField(_("salt"), max_length=32)
    percent = models.PositiveSmallIntegerField(_("share (%)"))
    started_at = models.DateTimeField(_("from"), default=dj_timezone.now)
    ended_at = models.DateTimeField(_("until"), null=True, blank=True)

    class Meta:
        verbose_name = _("holdout period")
        verbose_name_plural = _("holdout periods")
        ordering = ["organization", "-started_at"]

    def __str__(self) -> str:
        return f"{self.organization_id} {self.percent}% {self.started_at:%Y-%m-%d}"


class Membership(models.Model):
    """A user's role in one organization: what the admin shows and lets them do (crm.tenancy).
    A user may belong to several organizations; a member is staff (set when a membership is added)."""

    class Role(models.TextChoices):
        MANAGER = (
            "manager",
            _("manager"),
        )  # works the organization's campaigns, customers, surveys, integrations
        VIEWER = "viewer", _("viewer")  # sees, changes nothing

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships", verbose_name=_("user")
    )
    organization = models.ForeignKey(
        Organization, on_delete=models.CASCADE, related_name="memberships", verbose_name=_("organization")
    )
    role = models.CharField(_("role"), max_length=10, choices=Role.choices, default=Role.VIEWER)
    created_at = models.DateTimeField(_("created at"), default=dj_timezone.now, editable=False)

    class Meta:
        verbose_name = _("membership")
        verbose_name_plural = _("memberships")
        ordering = ["organization_id", "user_id"]
        constraints = [models.UniqueConstraint(fields=["user", "organization"], name="membership_unique")]

    def __str__(self) -> str:
        return f"{self.user} · {self.organization} ({self.get_role_display()})"


class Store(models.Model):
    organization = models.ForeignKey(
        Organization, on_delete=models.CASCADE, related_name="stores", verbose_name=_("organization")
    )
    erp_code = models.CharField(_("ERP code"), max_length=40)
    name = models.CharField(_("name"), max_length=200)
    # By name, not import: the numbers are integrations' models, and integrations imports this module.
    whatsapp_number = models.ForeignKey(
        "integrations.WhatsappNumber",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="sending_stores",
        verbose_name=_("WhatsApp number"),
        help_text=_(
            "The number this store's customers get campaigns from when a campaign sends from the "
            "customer's store (the store of their latest sale). Empty: the campaign's own number."
        ),
    )
    created_at = models.DateTimeField(_("created at"), default=dj_timezone.now, editable=False)
    chatwoot_inbox_id = models.PositiveIntegerField(
        _("Chatwoot inbox id"),
        null=True,
        blank=True,
        help_text=_("Replies of this store's customers go to this Chatwoot inbox. Empty: the account's own."),
    )

    class Meta:
        verbose_name = _("store")
        verbose_name_plural = _("stores")
        ordering = ["organization_id", "erp_code"]
        constraints = [
            models.UniqueConstraint(fields=["organization", "erp_code"], name="store_unique_erp_code"),
        ]

    def __str__(self) -> str:
        return f"{self.erp_code} · {self.name}"

    def clean(self) -> None:
        super().clean()
        number = self.whatsapp_number
        if number is not None and self.organization_id and number.organization_id != self.organization_id:
            raise ValidationError(
                {"whatsapp_number": _("The WhatsApp number belongs to another organization.")}
            )


class OptOutSource(models.TextChoices):
    UNSUBSCRIBE_LINK = "unsubscribe_link", _("unsubscribe link")
    REPLY = "reply", _("customer reply")
    PROVIDER = "provider", _("provider (Meta 131050 / hard bounce)")
    ADMIN = "admin", _("admin")
    ERP = "erp", _("ERP")
    KEYWORD = "keyword", _("opt-out keyword or button in a WhatsApp reply")


class ConsentSource(models.TextChoices):
    """Where a customer's marketing consent (given or withdrawn) came from: only a source that carries
    one sets it; a customer that arrives without one has none."""

    ERP = "erp", _("ERP opt-in field")
    FORM = "form", _("sign-up form")
    IMPORT = "import", _("import with a consent column")
    ADMIN = "admin", _("recorded in the admin")
    INTEGRATION = "integration", _("integration")
    # Consent held before its source was recorded (kept, never invented: no time when none was kept).
    LEGACY = "legacy", _("legacy (recorded before its source was kept)")


class Customer(models.Model):
    organization = models.ForeignKey(
        Organization, on_delete=models.CASCADE, related_name="customers", verbose_name=_("organization")
    )
    # NULL (not "") for customers without an ERP record: NULLs never collide in the unique
    # constraint, so the constraint needs no condition and bulk upserts can use ON CONFLICT on it.
    erp_id = models.CharField(_("ERP id"), max_length=64, null=True, blank=True, default=None)  # noqa: DJ001
    name = models.CharField(_("name"), max_length=200, blank=True, default="")
    email = models.EmailField(_("email"), blank=True, default="")
    phone = models.CharField(_("phone (E.164)"), max_length=16, blank=True, default="", validators=[E164])
    cpf_cnpj = models.CharField(
        _("CPF/CNPJ"), max_length=14, blank=True, default="", help_text=_("Without punctuation, verified.")
    )
    # Where the ERP's copy stands: a sync writes a record only over an older (or equal) trans_id,
    # so a slow sync can never overwrite newer data with what it read earlier. NULL: never synced
    # (created here, or a placeholder for a customer a synced sale refers to).
    erp_trans_id = models.BigIntegerField(_("ERP trans_id"), null=True, blank=True)
    erp_registered_at = models.DateTimeField(_("registered in the ERP at"), null=True, blank=True)
    # A customer date automation reacts to (flows' `date` trigger, audience filters by birthday month).
    birth_date = models.DateField(_("birth date"), null=True, blank=True)
    # LGPD: marketing needs a recorded legal basis, so consent is "not given" until a source that
    # carries one sets it (crm.services.customers_consent_set), with its source, time and who.
    marketing_consent = models.BooleanField(_("marketing consent"), default=False)
    consent_at = models.DateTimeField(_("consent given at"), null=True, blank=True)
    marketing_consent_source = models.CharField(
        _("consent source"), max_length=20, blank=True, default="", choices=ConsentSource.choices
    )
    marketing_consent_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        verbose_name=_("consent recorded by"),
    )
    whatsapp_opted_out_at = models.DateTimeField(_("WhatsApp opt-out at"), null=True, blank=True)
    whatsapp_opt_out_source = models.CharField(
        _("WhatsApp opt-out source"), max_length=20, blank=True, default="", choices=OptOutSource.choices
    )
    email_opted_out_at = models.DateTimeField(_("email opt-out at"), null=True, blank=True)
    email_opt_out_source = models.CharField(
        _("email opt-out source"), max_length=20, blank=True, default="", choices=OptOutSource.choices
    )
    created_at = models.DateTimeField(_("created at"), default=dj_timezone.now, editable=False)
    updated_at = models.DateTimeField(_("updated at"), auto_now=True)

    class Meta:
        verbose_name = _("customer")
        verbose_name_plural = _("customers")
        ordering = ["organization_id", "id"]
        constraints = [
            models.UniqueConstraint(fields=["organization", "erp_id"], name="customer_unique_erp_id"),
        ]
        indexes = [
            models.Index(fields=["organization", "phone"], name="customer_org_phone"),
            models.Index(fields=["organization", "email"], name="customer_org_email"),
            models.Index(fields=["organization", "cpf_cnpj"], name="customer_org_cpf_cnpj"),
        ]

    def __str__(self) -> str:
        return self.name or self.email or self.phone or f"#{self.pk}"

    @property
    def can_receive_whatsapp(self) -> bool:
        return bool(self.phone) and self.marketing_consent and self.whatsapp_opted_out_at is None

    @property
    def can_receive_email(self) -> bool:
        return bool(self.email) and self.marketing_consent and self.email_opted_out_at is None


class ConsentChange(models.Model):
    """One change of a customer's marketing consent: the history behind the customer's current value."""

    organization = models.ForeignKey(
        Organization, on_delete=models.CASCADE, related_name="+", verbose_name=_("organization")
    )
    customer = models.ForeignKey(
        Customer, on_delete=models.CASCADE, related_name="consent_changes", verbose_name=_("customer")
    )
    given = models.BooleanField(_("consent given"))
    source = models.CharField(_("source"), max_length=20, choices=ConsentSource.choices)
    at = models.DateTimeField(_("at"), default=dj_timezone.now)
    by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        verbose_name=_("recorded by"),
    )

    class Meta:
        verbose_name = _("consent change")
        verbose_name_plural = _("consent changes")
        ordering = ["customer_id", "-at"]
        indexes = [models.Index(fields=["customer", "at"], name="consentchange_customer_at")]

    def __str__(self) -> str:
        """What the customer's page lists above each change: "consentimento dado · campo de opt-in do ERP"."""
        what = _("consent given") if self.given else _("consent withdrawn")
        return f"{what} · {self.get_source_display()}"


class Sale(models.Model):
    organization = models.ForeignKey(
        Organization, on_delete=models.CASCADE, related_name="sales", verbose_name=_("organization")
    )
    store = models.ForeignKey(Store, on_delete=models.PROTECT, related_name="sales", verbose_name=_("store"))
    customer = models.ForeignKey(
        Customer,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="sales",
        verbose_name=_("customer"),
    )
    erp_id = models.CharField(_("ERP id"), max_length=64)
    total = models.DecimalField(_("total"), max_digits=12, decimal_places=2)
    sold_at = models.DateTimeField(_("sold at"))
    # [{"product": "SKU-1", "quantity": "2", "price": "49.90"}]: decimals as strings, exact.
    items = models.JSONField(_("items"), default=list, blank=True)
    erp_trans_id = models.BigIntegerField(_("ERP trans_id"), null=True, blank=True)
    created_at = models.DateTimeField(_("created at"), default=dj_timezone.now, editable=False)

    class Meta:
        verbose_name = _("sale")
        verbose_name_plural = _("sales")
        ordering = ["-sold_at"]
        constraints = [
            models.UniqueConstraint(fields=["organization", "erp_id"], name="sale_unique_erp_id"),
        ]
        indexes = [
            models.Index(fields=["customer", "sold_at"], name="sale_customer_sold_at"),
            models.Index(fields=["store", "sold_at"], name="sale_store_sold_at"),
        ]

    def __str__(self) -> str:
        return f"{self.erp_id} · {format_money(self.total)}"


class JobRun(models.Model):
    """A checkpoint: a piece of work recorded before its side effects, so it can be found and resumed.

    `queue`, `func` and `kwargs` say how to run it again; `recover` re-enqueues a run the database
    says is unfinished when Redis no longer holds its job.
    """

    class Status(models.TextChoices):
        RUNNING = "running", _("running")
        COMPLETED = "completed", _("completed")
        FAILED = "failed", _("failed")

    kind = models.CharField(_("kind"), max_length=64)
    key = models.CharField(_("key"), max_length=200)
    organization = models.ForeignKey(
        Organization,
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="job_runs",
        verbose_name=_("organization"),
    )
    status = models.CharField(_("status"), max_length=16, choices=Status.choices, default=Status.RUNNING)
    attempts = models.PositiveIntegerField(_("attempts"), default=0)
    queue = models.CharField(_("queue"), max_length=64, blank=True, default="")
    func = models.CharField(_("function"), max_length=200, blank=True, default="")
    kwargs = models.JSONField(_("arguments"), default=dict, blank=True)
    job_id = models.CharField(_("job id"), max_length=200, blank=True, default="")
    started_at = models.DateTimeField(_("started at"), default=dj_timezone.now)
    finished_at = models.DateTimeField(_("finished at"), null=True, blank=True)
    error = models.TextField(_("error"), blank=True, default="")

    class Meta:
        verbose_name = _("job run")
        verbose_name_plural = _("job runs")
        ordering = ["-started_at"]
        constraints = [models.UniqueConstraint(fields=["kind", "key"], name="jobrun_unique_kind_key")]
        indexes = [models.Index(fields=["status", "started_at"], name="jobrun_status_started")]

    def __str__(self) -> str:
        return f"{self.kind}:{self.key} ({self.get_status_display()})"

    @property
    def duration(self):
        return (self.finished_at - self.started_at) if self.finished_at else None


class InboxEvent(models.Model):
    """An event an intake accepted and a worker has not applied yet (crm/inbox.py): written by the
    request in one statement, deleted in the transaction that applies it."""

    kind = models.CharField(_("kind"), max_length=40)
    # Known for some kinds only (a Meta webhook names a phone number, not an organization).
    organization = models.ForeignKey(
        Organization,
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="+",
        verbose_name=_("organization"),
        db_index=False,
        db_constraint=False,
    )
    received_at = models.DateTimeField(_("received at"), db_default=Now())
    payload = models.TextField(_("payload"))
    # Set when the kind's handler refused the event on its own (a bug or poison), or could still not
    # apply it after RETRY_ATTEMPTS tries: never drained again.
    failed_at = models.DateTimeField(_("failed at"), null=True, blank=True)
    error = models.TextField(_("error"), blank=True, default="")
    # Set when the kind's handler could not apply (all of) the event yet and asked to be given the
    # rest again later (an ESP event that came before its send was recorded): not drained before.
    not_before = models.DateTimeField(_("not before"), null=True, blank=True)
    retries = models.PositiveSmallIntegerField(_("retries"), default=0, db_default=0)

    class Meta:
        verbose_name = _("inbox event")
        verbose_name_plural = _("inbox events")
        indexes = [
            # The drain's two reads (crm/inbox.py): events not tried yet, per organization in
            # acceptance order (and the organizations waiting, by a loose scan), and the few to be
            # tried again, by when.
            models.Index(
                fields=["kind", "organization", "id"],
                name="inbox_fresh_by_org",
                condition=models.Q(failed_at__isnull=True, not_before__isnull=True),
            ),
            models.Index(
                fields=["kind", "not_before"],
                name="inbox_retry",
                condition=models.Q(failed_at__isnull=True, not_before__isnull=False),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind} #{self.pk}"
