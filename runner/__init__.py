"""Seed 000's integration runner: integration types, handlers, executions and items; the webhook and
AMQP intake (`events`), runs with their fan-out and fan-in (`executions`), the ItemJob (`items`),
operator actions (`operator`), the schedule trigger (`schedules`), recovery (`recovery`), the DLQ.

Only `project` may import it; it plugs into the platform from `apps.py:ready()`.
"""
