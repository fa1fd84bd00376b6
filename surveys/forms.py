"""The public survey form. Its messages are Portuguese: the page is always shown in pt-br."""

from __future__ import annotations

from django import forms

from surveys.models import COMMENT_MAX, SCORE_MAX, SCORE_MIN

SCORES = list(range(SCORE_MIN, SCORE_MAX + 1))
SCORE_ERROR = f"Escolha uma nota de {SCORE_MIN} a {SCORE_MAX}."


class SurveyForm(forms.Form):
    score = forms.TypedChoiceField(
        choices=[(str(n), str(n)) for n in SCORES],
        coerce=int,
        widget=forms.RadioSelect,
        error_messages={"required": SCORE_ERROR, "invalid_choice": SCORE_ERROR},
    )
    comment = forms.CharField(
        required=False,
        max_length=COMMENT_MAX,
        widget=forms.Textarea(attrs={"rows": 4, "maxlength": COMMENT_MAX}),
        error_messages={
            "max_length": f"O comentário pode ter no máximo {COMMENT_MAX} caracteres "
            "(o seu tem %(show_value)d)."
        },
    )
