"""A recurrence is shown back to the manager in words, in the manager's language ("toda segunda-feira às
09:00"), for the shapes a manager writes; any other shape (or text) gets no words, never an error."""

from __future__ import annotations

import pytest
from django.utils import translation
from hypothesis import given
from hypothesis import strategies as st

from campaigns.recurrence import EXAMPLES, describe, next_occurrences


@pytest.mark.parametrize(
    ("cron", "pt_br", "en"),
    [
        ("0 9 * * 1", "toda segunda-feira às 09:00", "every Monday at 09:00"),
        ("30 18 * * 1-5", "de segunda a sexta-feira às 18:30", "Monday to Friday at 18:30"),
        ("0 10 1 * *", "no dia 1 de cada mês às 10:00", "on day 1 of every month at 10:00"),
        ("0 9 * * 6,0", "todo domingo e todo sábado às 09:00", "every Sunday and every Saturday at 09:00"),
        ("0 9 * * 7", "todo domingo às 09:00", "every Sunday at 09:00"),
        ("15 8,20 * * *", "todos os dias às 08:15 e 20:15", "every day at 08:15 and 20:15"),
        ("0 9 1,15 * *", "no dia 1 e 15 de cada mês às 09:00", "on day 1 and 15 of every month at 09:00"),
    ],
)
def test_a_schedule_reads_in_words_in_the_managers_language(cron: str, pt_br: str, en: str) -> None:
    with translation.override("pt-br"):
        assert describe(cron) == pt_br
    with translation.override("en"):
        assert describe(cron) == en


def test_every_example_offered_to_the_manager_reads_in_words() -> None:
    with translation.override("pt-br"):
        assert all(describe(cron) for cron, _meaning in EXAMPLES)


@pytest.mark.parametrize("cron", ["*/15 * * * *", "0 9 * 12 *", "0 9 1 * 1", "0 * * * *"])
def test_a_shape_without_words_gets_none_and_still_runs(cron: str) -> None:
    assert describe(cron) == ""
    assert len(next_occurrences(cron, "America/Sao_Paulo")) == 3


@given(st.text(max_size=40))
def test_any_text_gets_words_or_none_without_an_error(text: str) -> None:
    with translation.override("pt-br"):
        words = describe(text)
    assert isinstance(words, str)
    if words:
        assert "às" in words
