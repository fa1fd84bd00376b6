"""The public survey page /s/<signed>: Portuguese, no login, no cookies, answered once."""

from __future__ import annotations

import re

import pytest
from django.core import signing
from django.test import Client

from surveys import links, services
from surveys.models import Survey
from tests.surveys.conftest import Shop, reload

S = Survey.Status


@pytest.fixture
def sent(shop: Shop) -> Survey:
    survey = shop.due_survey(shop.ana, store=shop.shopping)
    Survey.objects.filter(pk=survey.pk).update(status=S.SENT)
    return reload(survey)


@pytest.fixture
def browser() -> Client:
    """A recipient's in-app browser: no session, no CSRF cookie, and CSRF checks enforced."""
    return Client(enforce_csrf_checks=True, HTTP_ACCEPT_LANGUAGE="en-US,en;q=0.9")


def _url(survey: Survey) -> str:
    return "/" + links.survey_path(survey)


def test_the_page_shows_the_form_in_portuguese_whatever_the_browser_language(sent: Survey, browser: Client):
    response = browser.get(_url(sent))

    assert response.status_code == 200
    assert response.headers["Content-Language"] == "pt-br"
    assert "no-cache" in response.headers["Cache-Control"] or "max-age=0" in response.headers["Cache-Control"]
    html = response.content.decode()
    assert "Como foi sua compra na loja Shopping?" in html
    assert "De 0 a 10, o quanto você recomendaria a Loja Teste" in html
    assert "Enviar resposta" in html
    assert re.findall(r'type="radio" name="score" value="(\d+)"', html) == [str(n) for n in range(11)]
    assert 'name="comment"' in html and 'name="viewport"' in html
    assert "csrfmiddlewaretoken" not in html
    assert not response.cookies


def test_an_answer_is_recorded_once_and_a_second_submission_shows_already_answered(
    sent: Survey, browser: Client
):
    response = browser.post(_url(sent), {"score": "9", "comment": "  Atendimento ótimo, voltarei!  "})

    assert response.status_code == 200
    assert "Obrigado pela sua resposta!" in response.content.decode()
    survey = reload(sent)
    assert (survey.status, survey.score, survey.comment) == (S.ANSWERED, 9, "Atendimento ótimo, voltarei!")
    assert survey.answered_at is not None

    again = browser.post(_url(sent), {"score": "0", "comment": "mudei de ideia"})

    assert again.status_code == 200
    assert "Esta pesquisa já foi respondida" in again.content.decode()
    assert (reload(sent).score, reload(sent).comment) == (9, "Atendimento ótimo, voltarei!")
    assert "já foi respondida" in browser.get(_url(sent)).content.decode()


def test_survey_answer_is_a_compare_and_set(sent: Survey):
    assert services.survey_answer(survey=sent, score=10, comment="") is True
    assert services.survey_answer(survey=sent, score=3, comment="de novo") is False
    assert reload(sent).score == 10
    with pytest.raises(ValueError):
        services.survey_answer(survey=sent, score=11, comment="")


@pytest.mark.parametrize("score", ["", "11", "-1", "dez", "9.5"])
def test_an_invalid_score_shows_a_portuguese_error_and_records_nothing(
    sent: Survey, browser: Client, score: str
):
    data = {"comment": "Bom"} | ({"score": score} if score else {})

    response = browser.post(_url(sent), data)

    assert response.status_code == 200
    html = response.content.decode()
    assert "Escolha uma nota de 0 a 10." in html
    assert "Bom</textarea>" in html  # what they wrote is kept
    survey = reload(sent)
    assert (survey.status, survey.answered_at, survey.score) == (S.SENT, None, None)


def test_a_comment_over_2000_characters_is_refused(sent: Survey, browser: Client):
    response = browser.post(_url(sent), {"score": "7", "comment": "a" * 2001})

    assert "O comentário pode ter no máximo 2000 caracteres (o seu tem 2001)." in response.content.decode()
    assert 'value="7" id="score-7" checked' in response.content.decode()
    assert reload(sent).answered_at is None
    assert browser.post(_url(sent), {"score": "7", "comment": "a" * 2000}).status_code == 200
    assert len(reload(sent).comment) == 2000


def test_a_tampered_or_unknown_link_is_a_404_page(sent: Survey, browser: Client):
    signed = links.survey_path(sent).removeprefix("s/")
    token, signature = signed.split(".")
    tampered = f"/s/{token[:-1]}{'A' if token[-1] != 'A' else 'B'}.{signature}"
    other_salt = "/s/" + signing.Signer(salt="campaigns.link", sep=".").sign(sent.token)

    for url in (tampered, other_salt, "/s/nothing-here", f"/s/{token}"):
        response = browser.get(url)
        assert response.status_code == 404, url
        assert "Link inválido" in response.content.decode()
        assert browser.post(url, {"score": "10"}).status_code == 404
    assert reload(sent).answered_at is None


def test_the_page_is_not_linked_to_a_session_or_a_login(sent: Survey, browser: Client):
    response = browser.post(_url(sent), {"score": "10"})

    assert response.status_code == 200
    assert not response.cookies
    assert reload(sent).score == 10
