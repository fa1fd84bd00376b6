"""Brazilian Portuguese agreement for Django's generic admin messages: "O {name} “{obj}” foi
adicionado com sucesso" is written for a masculine noun; a feminine model's name ("campanha",
"loja") gets "A … foi adicionada". One table of the feminine nouns our models are named with."""

from __future__ import annotations

import re

from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import get_language, gettext_noop

# First word of a model's verbose name in pt-BR that is feminine.
FEMININE = frozenset(
    {
        "campanha",
        "campanhas",
        "loja",
        "lojas",
        "organização",
        "organizações",
        "venda",
        "vendas",
        "mensagem",
        "mensagens",
        "pesquisa",
        "pesquisas",
        "resposta",
        "respostas",
        "conexão",
        "conexões",
        "execução",
        "execuções",
        "integração",
        "integrações",
        "configuração",
        "configurações",
        "conta",
        "contas",
        "inscrição",
        "inscrições",
        "etapa",
        "etapas",
        "jornada",
        "jornadas",
        "supressão",
        "supressões",
        "métrica",
        "métricas",
        "pendência",
        "pendências",
        "rotina",
        "rotinas",
    }
)
# Django's "unique" messages, translated by our catalogue in words that agree whatever the fields'
# and the model's gender (Django's own pt-BR: "Venda com este Organização e Id no ERP já existe").
UNIQUE_MESSAGES = (
    gettext_noop("%(model_name)s with this %(field_labels)s already exists."),
    gettext_noop("%(model_name)s with this %(field_label)s already exists."),
)
_PRONOUNS = re.compile(r"\b(editá|alterá|adicioná)-l(o|os)\b")
_PARTICIPLES = re.compile(r"\b(foi|foram) (adicionad|alterad|removid|modificad|excluíd)(o|os)\b")


def is_feminine(verbose_name: str) -> bool:
    words = str(verbose_name).split()
    return bool(words) and words[0].lower() in FEMININE


def gender_agree(message: str, verbose_name: str) -> str:
    """`message` with the article and participles made feminine when `verbose_name` is (pt-BR only)."""
    if not (get_language() or "").lower().startswith("pt") or not is_feminine(verbose_name):
        return message
    name = str(verbose_name)
    text = str(message)
    agreed = re.sub(rf"\bO\s+{re.escape(name)}\b", f"A {name}", text)
    agreed = re.sub(rf"\bo\s+{re.escape(name)}\b", f"a {name}", agreed)
    agreed = re.sub(rf"\boutro\s+{re.escape(name)}\b", f"outra {name}", agreed)
    agreed = _PARTICIPLES.sub(lambda m: f"{m[1]} {m[2]}{'a' if m[3] == 'o' else 'as'}", agreed)
    agreed = _PRONOUNS.sub(lambda m: f"{m[1]}-l{'a' if m[2] == 'o' else 'as'}", agreed)  # editá-la
    agreed = agreed.replace("outro(a)", "outra")
    agreed = re.sub(rf"\b{re.escape(name)}\s+selecionado(s?)\b", rf"{name} selecionada\1", agreed)  # actions
    return mark_safe(agreed) if isinstance(message, SafeString) else agreed  # noqa: S308 - escaped before
