"""The registry of every queue: names, worker order, retry policy and timeouts.

Pure data (no Django imports) so settings can build RQ_QUEUES from it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class QueueSpec:
    name: str
    description: str
    attempts: int = 1  # attempts in all, the first run included (the seeds count this way)
    backoff: int = 0  # seconds before the first retry; doubles for every further retry
    timeout: int = 600  # seconds a job may run before the worker kills it
    result_ttl: int = 3600  # how long a finished job stays visible (and blocks its job id)
    # Tenants served in turn (crm.fairshare): a job enqueued with its organization waits in that
    # organization's list, not behind every other tenant's backlog.
    fair: bool = False

    def retry_intervals(self) -> list[int]:
        """Exponential backoff for RQ's Retry, which counts retries after the first run."""
        return [self.backoff * 2**i for i in range(max(self.attempts - 1, 0))]


# Trigger -> priority of seeds/000 (JOB_PRIORITY): a lower value is served first.
JOB_PRIORITY: dict[str, int] = {"webhook": 1, "manual": 2, "queue": 3, "schedule": 5}

WHATSAPP_SEND = "whatsapp-send"
EMAIL_SEND = "email-send"
CAMPAIGN_TRIGGER = "campaign-trigger"
ERP_SYNC = "erp-sync-queue"
ERP_CUSTOMER_SYNC = "erp-customer-sync-queue"
POST_SALE_SURVEY = "post-sale-survey"
RUNS = "runs"
CHATWOOT_MIRROR = "chatwoot-mirror"
CHATWOOT_INBOUND = "chatwoot-inbound"
MAINTENANCE = "maintenance"
INBOX = "inbox"
FLOWS = "flows"


def items_queue(priority: int) -> str:
    """RQ has no per-job priority: every priority level of `items` is its own queue."""
    if priority not in JOB_PRIORITY.values():
        raise ValueError(
            f"unknown item priority {priority!r}; expected one of {sorted(JOB_PRIORITY.values())}"
        )
    return f"items-p{priority}"


_ITEMS = {
    p: QueueSpec(
        items_queue(p),
        f"Integration items, priority {p} ({t})",
        attempts=3,
        backoff=5,
        timeout=300,
        fair=True,
    )
    for t, p in sorted(JOB_PRIORITY.items(), key=lambda kv: kv[1])
}

# Workers listen in this order: a worker always takes from the first non-empty queue, so
# latency-sensitive work (webhook items, scheduled campaign starts, sends) comes first and
# bulk syncs last. Run dedicated workers with `workers --queues` to isolate a queue.
QUEUES: tuple[QueueSpec, ...] = (
    # Draining the webhook inbox is short, batched work that every webhook's latency waits on.
    QueueSpec(
        INBOX, "Applies accepted webhook events in batches (crm/inbox.py)", attempts=3, backoff=1, timeout=120
    ),
    _ITEMS[1],
    # A flow's next steps for one enrollment: an event's first send waits on it (seconds, not a tick).
    QueueSpec(
        FLOWS,
        "Runs an enrollment's due flow steps (flows/engine.py)",
        attempts=3,
        backoff=5,
        timeout=300,
        fair=True,
    ),
    QueueSpec(CAMPAIGN_TRIGGER, "Starts a scheduled campaign (one delayed job per campaign)", timeout=1800),
    QueueSpec(
        WHATSAPP_SEND, "Sends WhatsApp template messages", attempts=2, backoff=1, timeout=120, fair=True
    ),
    QueueSpec(EMAIL_SEND, "Sends campaign emails", attempts=3, backoff=60, timeout=300, fair=True),
    # What customers write reaches an agent within seconds: before the bulk, each tenant in turn.
    QueueSpec(
        CHATWOOT_INBOUND,
        "Delivers customers' WhatsApp messages to Chatwoot, in order per conversation",
        attempts=3,
        backoff=5,
        timeout=300,
        fair=True,
    ),
    _ITEMS[2],
    QueueSpec(POST_SALE_SURVEY, "Sends a post-sale survey", attempts=3, backoff=60, timeout=120, fair=True),
    QueueSpec(
        RUNS,
        "Integration runs: produce items and fan them out",
        attempts=3,
        backoff=5,
        timeout=1800,
        fair=True,
    ),
    _ITEMS[3],
    QueueSpec(
        ERP_SYNC,
        "Syncs one store's ERP sales for a window",
        attempts=3,
        backoff=60,
        timeout=3600,
        result_ttl=25 * 3600,
    ),
    QueueSpec(
        ERP_CUSTOMER_SYNC,
        "Full or incremental ERP customer sync",
        attempts=3,
        backoff=60,
        timeout=4 * 3600,
        result_ttl=25 * 3600,
    ),
    _ITEMS[5],
    QueueSpec(MAINTENANCE, "Platform housekeeping: recovery pass, cron bookkeeping", timeout=600),
)

QUEUE_NAMES: tuple[str, ...] = tuple(q.name for q in QUEUES)

# Queues no worker listens to any more -> the queue their jobs are moved onto (crm.retired, by the
# recovery pass) when an upgrade finds some left on them. chatwoot-mirror: campaign messages'
# Chatwoot copies go through the conversations' push (campaigns/chatwoot.py) since 2026-12.
RETIRED: dict[str, str] = {CHATWOOT_MIRROR: CHATWOOT_INBOUND}
_BY_NAME = {q.name: q for q in QUEUES}


def is_fair(name: str) -> bool:
    """Does this queue serve its tenants in turn? (False for a queue that is not ours.)"""
    spec = _BY_NAME.get(name)
    return spec is not None and spec.fair


def get_spec(name: str) -> QueueSpec:
    try:
        return _BY_NAME[name]
    except KeyError:
        raise ValueError(f"unknown queue {name!r}; known queues: {', '.join(QUEUE_NAMES)}") from None


def redis_keys(queue: str) -> dict[str, str]:
    """RQ's keys for a queue, by the state the operator reads in them: the waiting list and the
    registries (active = started, completed = finished)."""
    return {
        "waiting": f"rq:queue:{queue}",
        "active": f"rq:wip:{queue}",
        "failed": f"rq:failed:{queue}",
        "completed": f"rq:finished:{queue}",
        "scheduled": f"rq:scheduled:{queue}",
        "deferred": f"rq:deferred:{queue}",
        "canceled": f"rq:canceled:{queue}",
    }
