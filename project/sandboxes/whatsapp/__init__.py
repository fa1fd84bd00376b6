"""A sandbox standing in for Meta's WhatsApp Cloud API (Graph API), for tests, the demo and benchmarks.

It answers ``POST /{version}/{phone_number_id}/messages`` like Graph does: the same token check, the
same validation of template messages and the same JSON shapes for success and for errors. Accepted
sends are recorded, and, when a webhook URL and an app secret are configured, ``sent``, ``delivered``
and ``read`` status callbacks are POSTed to the webhook signed with ``X-Hub-Signature-256``.

Test controls (JSON, under ``/_sandbox/``; the in-process :class:`SandboxServer` methods do the same):

- ``POST /_sandbox/rules`` ``{"to": "5511999990001" | "*", "code": 131026, "http_status": 400,
  "times": 1, "webhook_failure_code": 131049, "error_subcode": 2494010}`` - the next ``times`` sends to
  that recipient (``times`` null or absent = every send) fail with that Graph error, or, with only
  ``webhook_failure_code``, are accepted and get one ``failed`` status callback instead of
  sent/delivered/read, or, with ``"hang_up": true``, are accepted and the connection is dropped
  before any answer. Rules apply to sends that pass validation; a recipient's own rules come before
  ``"*"`` rules, oldest first. ``GET`` lists the rules, ``DELETE`` clears them.
- ``POST /_sandbox/config`` ``{"latency_ms": 200, "drop_ninth_digit": true, "webhook_url": "...",
  "app_secret": "...", "status_delays_ms": [20, 40, 60], "waba_id": "...",
  "display_phone_number": "..."}`` - changes only the keys given; ``GET`` shows the configuration.
  Sends and status callbacks that are waiting re-read ``latency_ms`` and ``status_delays_ms``: a
  test holds them with a long delay and releases them with a short one (no fixed sleeps).
- ``GET /_sandbox/messages[?to=DIGITS]`` - ``{"count": N, "messages": [...]}``, accepted sends in order.
  ``DELETE`` forgets the messages and resets the stats.
- ``GET /{version}/{waba_id}/message_templates?limit=&after=&fields=`` - the business account's
  templates as Meta pages them (``templates.TEMPLATES``: approved, one rejected, one paused).
- ``GET /_sandbox/stats`` - ``{"accepted", "rejected", "by_recipient_max", "webhooks_delivered",
  "webhooks_failed", "in_flight", "in_flight_max", "webhooks_pending"}`` (sends being answered now
  and at most at once; accepted sends whose status callbacks are not all posted yet).

Run it with ``python manage.py whatsapp_sandbox`` or in-process::

    with SandboxServer(numbers={"1234567890": "tok"}) as server:
        httpx.post(f"{server.url}/v21.0/1234567890/messages", headers={"Authorization": "Bearer tok"}, ...)
"""

from project.sandboxes.whatsapp.server import SandboxServer

__all__ = ["SandboxServer"]
