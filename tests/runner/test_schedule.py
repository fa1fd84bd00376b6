from __future__ import annotations

from datetime import UTC, datetime

from crm.models import JobRun
from runner import schedules
from runner.models import Execution


def test_a_scheduled_handler_runs_once_per_occurrence_in_the_organizations_time_zone(py_handler, org):
    org.timezone = "America/Manaus"  # UTC-4
    org.save()
    py_handler.schedule_cron = "0 8 * * *"  # 08:00 in Manaus = 12:00 UTC
    py_handler.save()
    assert schedules.schedules_dispatch(now=datetime(2026, 3, 2, 11, 0, 30, tzinfo=UTC)) == 0
    due = datetime(2026, 3, 2, 12, 0, 30, tzinfo=UTC)
    assert schedules.schedules_dispatch(now=due) == 1
    assert schedules.schedules_dispatch(now=due) == 0  # a second dispatcher, or the next minute
    assert schedules.schedules_dispatch(now=datetime(2026, 3, 2, 12, 1, 30, tzinfo=UTC)) == 0
    execution = Execution.objects.get()
    assert (execution.trigger, execution.organization_id) == ("schedule", org.pk)
    assert JobRun.objects.filter(kind="runner-schedule").count() == 1
