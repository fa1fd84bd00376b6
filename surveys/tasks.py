"""RQ jobs of post-sale surveys: they take ids, load fresh state and call services."""

from __future__ import annotations

from surveys import sending, services


def survey_send(survey_id: int) -> str:
    """Send one due survey; a second run (retry, recovery, another worker) does nothing."""
    return sending.survey_send(survey_id=survey_id)


def surveys_dispatch(limit: int = 5000) -> int:
    """Every minute: enqueue the sends of due surveys that Redis does not hold; returns how many."""
    return services.surveys_dispatch(limit=limit)
