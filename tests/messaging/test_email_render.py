"""messaging.email_render: compiling operators' subjects and MJML/HTML bodies, rendering them per recipient
(variables, tracked links, open pixel, text part). Pure: real mrml and Django templates, no database."""

from __future__ import annotations

import re
import time

import mrml
import pytest

from messaging.email_render import (
    VARIABLES,
    CompiledEmail,
    RenderedEmail,
    TemplateError,
    compile_email,
    render_email,
)

CLICK = "https://crm.example.com/r/e~tok.sig"
PIXEL = "https://crm.example.com/o/e~tok.sig"
UNSUBSCRIBE = "https://crm.example.com/u/e~tok.sig"
VALUES = {
    "first_name": "Ana",
    "name": "Ana Souza",
    "email": "ana@example.com",
    "store_name": "Loja Centro",
    "unsubscribe_url": UNSUBSCRIBE,
}

MJML = """<mjml>
  <mj-head>
    <mj-title>Ofertas da {{ store_name }}</mj-title>
    <mj-preview>So hoje, {{ first_name }}</mj-preview>
    <mj-style>.promo a { color: #ff0000; }</mj-style>
  </mj-head>
  <mj-body>
    <mj-section>
      <mj-column>
        <mj-text>Oi {{ first_name|default:"cliente" }}, a {{ store_name }} tem novidades &amp; descontos.
        </mj-text>
        <mj-button href="https://shop.example.com/sale?utm_source=email&amp;utm_medium=crm">
          Ver ofertas
        </mj-button>
        <mj-image src="https://cdn.example.com/banner.png" alt="Banner"
                  href="https://shop.example.com/sale?utm_source=email&amp;utm_medium=crm"></mj-image>
        <mj-text>
          <a href="https://shop.example.com/lojas">Nossas lojas</a> ·
          <a href="mailto:sac@example.com">sac@example.com</a> ·
          <a href="{{ unsubscribe_url }}">Descadastrar</a>
        </mj-text>
      </mj-column>
    </mj-section>
  </mj-body>
</mjml>
"""


def compile_html(body: str, subject: str = "Oi") -> CompiledEmail:
    return compile_email(subject=subject, body=body, body_format="html")


def render(
    compiled: CompiledEmail,
    variables: dict[str, str] | None = None,
    click_url: str = CLICK,
    open_pixel_url: str | None = None,
) -> RenderedEmail:
    return render_email(
        compiled,
        variables=VALUES if variables is None else variables,
        click_url=click_url,
        open_pixel_url=open_pixel_url,
    )


# --- compiling and variables ----------------------------------------------------------------------


def test_mjml_compiles_to_html_with_variables_and_tracked_links() -> None:
    compiled = compile_email(subject="Oi {{ first_name }}", body=MJML, body_format="mjml")

    assert compiled.links == (
        "https://shop.example.com/sale?utm_source=email&utm_medium=crm",
        "https://shop.example.com/lojas",
    )
    email = render(compiled, open_pixel_url=PIXEL)
    assert email.subject == "Oi Ana"
    assert email.html.lower().startswith("<!doctype html>")
    assert "<title>Ofertas da Loja Centro</title>" in email.html
    assert "Oi Ana, a Loja Centro tem novidades &amp; descontos." in email.html
    assert email.html.count(f'href="{CLICK}/0"') == 2  # the button and the image share index 0
    assert email.html.count(f'href="{CLICK}/1"') == 1
    assert f'href="{UNSUBSCRIBE}"' in email.html
    assert 'href="mailto:sac@example.com"' in email.html
    assert "shop.example.com" not in email.html  # every tracked target is behind the redirect
    assert "{{" not in email.html and "{%" not in email.html


def test_html_body_passes_through_unchanged_apart_from_variables() -> None:
    body = (
        "<!DOCTYPE html>\n<html><head><style>p { margin: 0 }</style></head>\n"
        "<body><p class=x>Hello {{ name }}</p>\n<img src=logo.png alt=''></body></html>"
    )

    email = render(compile_html(body))

    assert email.html == body.replace("{{ name }}", "Ana Souza")


def test_variables_are_html_escaped_in_the_body_but_not_in_the_text_part() -> None:
    compiled = compile_html(
        '<p>Oi {{ first_name }} da {{ store_name }}</p><a href="https://x.example/?e={{ email }}">x</a>'
    )

    email = render(
        compiled, {"first_name": "<b>Ana</b> & Bia", "store_name": 'Loja "A"', "email": "a&b@x.example"}
    )

    assert "Oi &lt;b&gt;Ana&lt;/b&gt; &amp; Bia da Loja &quot;A&quot;" in email.html
    assert 'href="https://x.example/?e=a&amp;b@x.example"' in email.html
    assert "<b>" not in email.html
    assert 'Oi <b>Ana</b> & Bia da Loja "A"' in email.text
    assert "x (https://x.example/?e=a&b@x.example)" in email.text


def test_missing_variables_render_empty_and_the_allowed_filters_work() -> None:
    compiled = compile_html(
        "<p>[{{ first_name }}] {{ first_name|default:'cliente' }} {{ name|default:store_name }}</p>"
        "<p>{{ store_name|upper }} {{ store_name|lower }} {{ email|title }} {{ name|capfirst }}</p>"
    )

    empty = render(compiled, {})
    full = render(compiled, {"store_name": "Loja Centro", "email": "ana souza", "name": "ana"})

    assert "<p>[] cliente </p>" in empty.html
    assert "<p>[] cliente ana</p><p>LOJA CENTRO loja centro Ana Souza Ana</p>" in full.html


def test_unknown_keys_in_variables_are_ignored() -> None:
    email = render(compile_html("<p>{{ first_name }}</p>"), {"first_name": "Ana", "password": "x"})

    assert email.html == "<p>Ana</p>"


def test_subject_is_not_html_escaped_and_line_breaks_in_values_are_removed() -> None:
    compiled = compile_email(
        subject="{{ first_name }}, ofertas da {{ store_name|upper }}", body="<p>x</p>", body_format="html"
    )

    email = render(compiled, {"first_name": "Ana & <Bia>\r\nBcc: evil@example.com", "store_name": "A&B\n"})

    assert email.subject == "Ana & <Bia> Bcc: evil@example.com, ofertas da A&B"
    assert "\r" not in email.subject and "\n" not in email.subject


def test_variables_lists_the_documented_names() -> None:
    assert VARIABLES == ("first_name", "name", "email", "store_name", "unsubscribe_url")


# --- what the operator gets told --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("subject", "body", "body_format", "message"),
    [
        ("Oi", "<p>{{ foo }}</p>", "html", "unknown variable 'foo' in the body; use first_name, name, email"),
        ("Oi", "<p>\n\n{{ foo }}</p>", "html", "unknown variable 'foo' in the body (line 3)"),
        ("Oi {{ bar }}", "<p>x</p>", "html", "unknown variable 'bar' in the subject"),
        ("Oi", "<p>{{ first_name|default:foo }}</p>", "html", "unknown variable 'foo'"),
        ("Oi", "<p>{{ first_name.upper }}</p>", "html", "unknown variable 'first_name.upper'"),
        ("Oi", "<p>{{ '<b>' }}</p>", "html", "is not a variable"),
        ("Oi", "<p>{{ 42 }}</p>", "html", "is not a variable"),
        ("Oi", "<p>{{ }}</p>", "html", "empty variable"),
        (
            "Oi",
            "{% load static %}<p>x</p>",
            "html",
            "template tags are not allowed in the body: '{% load static %}'",
        ),
        ("Oi", "<p>{% include 'secrets.html' %}</p>", "html", "template tags are not allowed"),
        ("Oi", "<a href=\"{% url 'admin:index' %}\">x</a>", "html", "template tags are not allowed"),
        ("Oi", "<p>{% if first_name %}x{% endif %}</p>", "html", "template tags are not allowed"),
        ("Oi", "{% autoescape off %}{{ name }}{% endautoescape %}", "html", "template tags are not allowed"),
        ("{% now 'Y' %}", "<p>x</p>", "html", "template tags are not allowed in the subject"),
        ("Oi", "<p>{{ name|safe }}</p>", "html", "filter 'safe' is not allowed in the body"),
        ("Oi", "<p>{{ name|date:'Y' }}</p>", "html", "filter 'date' is not allowed"),
        ("Oi", "<p>{{ name|nosuchfilter }}</p>", "html", "filter 'nosuchfilter' is not allowed"),
        ("Oi", "<p>{{ name|default: }}</p>", "html", "invalid variable '{{ name|default: }}' in the body"),
        ("Oi", "<p>{{ name|upper:'x' }}</p>", "html", "invalid variable"),
        ("Oi", "<p>{{ first name }}</p>", "html", "invalid variable"),
        ("Oi", "<p>{{ _secret }}</p>", "html", "invalid variable"),
        ("Oi", "<p>Oi\n{{ first_name</p>", "html", "unclosed '{{' or '{%' in the body (line 2)"),
        ("Oi", "<p>{{ first_name\n}}</p>", "html", "unclosed"),
        ("Oi", "<mjml><mj-body><mj-text>x</mj-body></mjml>", "mjml", "the MJML body does not compile:"),
        ("Oi", "just text", "mjml", "the MJML body does not compile:"),
        (
            "Oi",
            '<mjml><mj-body><mj-include path="/etc/passwd" /></mj-body></mjml>',
            "mjml",
            "does not compile",
        ),
        (
            "Oi",
            "<mjml><mj-body>\n\n<mj-text>{{ foo }}</mj-text></mj-body></mjml>",
            "mjml",
            "'foo' in the body (line 3)",
        ),
        ("", "<p>x</p>", "html", "the subject is empty"),
        ("  ", "<p>x</p>", "html", "the subject is empty"),
        ("Oi", "", "html", "the body is empty"),
        ("Oi", " \n ", "mjml", "the body is empty"),
        ("Oi\nBcc: x@example.com", "<p>x</p>", "html", "the subject has a line break"),
        ("Oi\r", "<p>x</p>", "html", "the subject has a line break"),
        ("Oi", "<p>x</p>", "text", "unknown body format 'text'; use mjml or html"),
    ],
)
def test_invalid_templates_raise_a_useful_template_error(
    subject: str, body: str, body_format: str, message: str
) -> None:
    with pytest.raises(TemplateError) as caught:
        compile_email(subject=subject, body=body, body_format=body_format)

    assert message in str(caught.value)


def test_template_error_is_a_value_error() -> None:
    assert issubclass(TemplateError, ValueError)


def test_the_engine_itself_knows_no_tags_or_other_filters() -> None:
    from django.template import Context, TemplateSyntaxError

    from messaging.email_render import _ENGINE

    for source in ("{% load static %}", "{% include 'x.html' %}", "{% if 1 %}{% endif %}", "{{ x|safe }}"):
        with pytest.raises(TemplateSyntaxError):
            _ENGINE.from_string(source)
    assert _ENGINE.from_string("{{ x|default:'a'|upper }}").render(Context()) == "A"


def test_django_comments_are_allowed_and_dropped() -> None:
    email = render(compile_html("<p>{# internal note #}Oi {{ first_name }}</p>"))

    assert email.html == "<p>Oi Ana</p>"


# --- link tracking ---------------------------------------------------------------------------------


def test_tracked_links_share_an_index_per_target_and_are_unescaped() -> None:
    compiled = compile_html(
        '<a href="https://a.example/x?p=1&amp;q=2">one</a>'
        "<A HREF='https://b.example/'>two</A>"
        '<a href="https://a.example/x?p=1&q=2">one again</a>'
        '<a class="c" href = " http://c.example/page#top " target="_blank">three</a>'
        "<a href=https://d.example/unquoted>four</a>"
        '<map><area shape="rect" coords="0,0,1,1" href="https://b.example/"></map>'
    )

    assert compiled.links == (
        "https://a.example/x?p=1&q=2",
        "https://b.example/",
        "http://c.example/page#top",
        "https://d.example/unquoted",
    )
    assert render(compiled).html == (
        f'<a href="{CLICK}/0">one</a>'
        f'<A HREF="{CLICK}/1">two</A>'
        f'<a href="{CLICK}/0">one again</a>'
        f'<a class="c" href = "{CLICK}/2" target="_blank">three</a>'
        f'<a href="{CLICK}/3">four</a>'
        f'<map><area shape="rect" coords="0,0,1,1" href="{CLICK}/1"></map>'
    )


def test_click_url_is_html_escaped_in_the_href() -> None:
    email = render(
        compile_html('<a href="https://a.example/">a</a>'), click_url="https://crm.example/r?t=1&s=2"
    )

    assert email.html == '<a href="https://crm.example/r?t=1&amp;s=2/0">a</a>'


@pytest.mark.parametrize(
    "href",
    [
        "mailto:sac@example.com",
        "tel:+5511999999999",
        "#top",
        "/relative/path",
        "relative.html",
        "//cdn.example.com/protocol-relative",
        "ftp://files.example.com/x",
        "",
    ],
)
def test_non_http_links_are_not_tracked(href: str) -> None:
    body = f'<a href="{href}">x</a>'

    compiled = compile_html(body)

    assert compiled.links == ()
    assert render(compiled).html == body


def test_templated_links_and_unsubscribe_are_not_tracked() -> None:
    compiled = compile_html(
        '<a href="{{ unsubscribe_url }}">sair</a>'
        "<a href='https://shop.example/?who={{ email }}'>shop</a>"
        "<a href=\"{{ unsubscribe_url|default:'https://crm.example/u' }}\">sair 2</a>"
    )

    assert compiled.links == ()
    assert render(compiled).html == (
        f'<a href="{UNSUBSCRIBE}">sair</a>'
        "<a href='https://shop.example/?who=ana@example.com'>shop</a>"
        f'<a href="{UNSUBSCRIBE}">sair 2</a>'
    )


def test_only_links_are_tracked_not_stylesheets_or_other_hrefs() -> None:
    body = (
        '<html><head><link href="https://fonts.example.com/css" rel="stylesheet">'
        '<base href="https://base.example.com/"></head><body><a href="https://a.example/">a</a></body></html>'
    )

    compiled = compile_html(body)

    assert compiled.links == ("https://a.example/",)
    assert '<link href="https://fonts.example.com/css" rel="stylesheet">' in render(compiled).html
    assert '<base href="https://base.example.com/">' in render(compiled).html


def test_mrml_font_links_are_not_tracked() -> None:
    body = "<mjml><mj-body><mj-section><mj-column><mj-text>Oi</mj-text></mj-column></mj-section></mj-body>"
    body += "</mjml>"

    compiled = compile_email(subject="Oi", body=body, body_format="mjml")

    assert compiled.links == ()
    assert 'href="https://fonts.googleapis.com/' in render(compiled).html


def test_href_text_outside_tags_is_left_alone() -> None:
    body = (
        '<html><head><style>a[href="https://style.example/"] { color: red }</style>'
        "<script>var s = '<a href=\"https://script.example/\">';</script></head><body>"
        '<p>Type href="https://text.example/" into the box</p>'
        "<p title=\"see href='https://attr.example/'\">hover</p>"
        '<!-- <a href="https://comment.example/">old</a> -->'
        '<!--[if mso]><v:roundrect href="https://vml.example/"><![endif]-->'
        '<a href="https://real.example/">real</a></body></html>'
    )

    compiled = compile_html(body)

    assert compiled.links == ("https://real.example/",)
    assert render(compiled).html == body.replace("https://real.example/", f"{CLICK}/0")


def test_mso_conditional_comments_from_mrml_survive_intact() -> None:
    compiled_mjml = mrml.to_html(MJML).content
    comments = re.findall(r"<!--.*?-->", compiled_mjml, re.DOTALL)
    assert any("[if mso" in comment for comment in comments)

    html = render(compile_email(subject="Oi", body=MJML, body_format="mjml"), open_pixel_url=PIXEL).html

    for comment in comments:
        assert comment in html
    assert html.count("<!--") == compiled_mjml.count("<!--")


def test_placeholders_cannot_be_typed_by_accident() -> None:
    body = (
        "<p>{0} {link0} __LINK_0__ %%LINK0%% [[0]] {{ first_name }}</p>"
        '<a href="https://a.example/">a</a><a href="https://b.example/">b</a>'
    )
    compiled = compile_html(body)

    email = render(compiled, {"first_name": "__LINK_1__ {1}"})

    assert "<p>{0} {link0} __LINK_0__ %%LINK0%% [[0]] __LINK_1__ {1}</p>" in email.html
    assert email.html.endswith(f'<a href="{CLICK}/0">a</a><a href="{CLICK}/1">b</a>')


def test_many_links_keep_their_own_indexes() -> None:
    body = "".join(f'<a href="https://shop.example/{n}">{n}</a>' for n in range(12))

    email = render(compile_html(body))

    assert email.html == "".join(f'<a href="{CLICK}/{n}">{n}</a>' for n in range(12))


def test_preview_keeps_the_real_targets() -> None:
    compiled = compile_html(
        '<a href="https://a.example/x?p=1&amp;q=&quot;2&quot;">a</a><a href="{{ unsubscribe_url }}">u</a>'
        "<body></body>"
    )

    email = render(compiled, click_url="", open_pixel_url=None)

    assert email.html == (
        '<a href="https://a.example/x?p=1&amp;q=&quot;2&quot;">a</a>'
        f'<a href="{UNSUBSCRIBE}">u</a><body></body>'
    )
    assert 'a (https://a.example/x?p=1&q="2")' in email.text


# --- the open pixel ----------------------------------------------------------------------------------


def test_open_pixel_goes_just_before_the_closing_body_tag() -> None:
    compiled = compile_html("<html><body><p>x</p><!-- </body> --></BODY></html>")

    email = render(compiled, open_pixel_url=PIXEL + "?a=1&b=2")

    pixel = (
        '<img src="https://crm.example.com/o/e~tok.sig?a=1&amp;b=2" width="1" height="1" alt=""'
        ' style="display:none" border="0">'
    )
    assert email.html == f"<html><body><p>x</p><!-- </body> -->{pixel}</BODY></html>"


def test_open_pixel_is_appended_without_a_body_tag_and_absent_without_a_url() -> None:
    compiled = compile_html("<p>x</p>")

    assert render(compiled, open_pixel_url=PIXEL).html.startswith(f'<p>x</p><img src="{PIXEL}" width="1"')
    assert render(compiled, open_pixel_url=None).html == "<p>x</p>"


def test_open_pixel_in_mjml_is_inside_the_body() -> None:
    email = render(compile_email(subject="Oi", body=MJML, body_format="mjml"), open_pixel_url=PIXEL)

    assert re.search(rf'<img src="{re.escape(PIXEL)}"[^>]*></body>\s*</html>\s*$', email.html)
    assert PIXEL not in email.text


# --- the text part -----------------------------------------------------------------------------------


def test_text_part_has_the_visible_text_and_tracked_urls_and_no_css() -> None:
    email = render(compile_email(subject="Oi", body=MJML, body_format="mjml"), open_pixel_url=PIXEL)

    text = email.text
    assert "Oi Ana, a Loja Centro tem novidades & descontos." in text
    assert f"Ver ofertas ({CLICK}/0)" in text
    assert f"Nossas lojas ({CLICK}/1)" in text
    assert f"Descadastrar ({UNSUBSCRIBE})" in text
    assert "sac@example.com ·" in text and "mailto:" not in text
    assert "shop.example.com" not in text
    for css in ("{", "}", "color:", "mso-", "@media", "font-family", "<", "&amp;", "Ofertas da"):
        assert css not in text, css


def test_text_part_line_breaks_and_whitespace() -> None:
    compiled = compile_html(
        "<html><head><title>T</title><style>p{}</style></head><body>"
        "<h1>Title</h1><p>First   line\n   wraps</p><div>Second<br>third</div>"
        "<ul><li>one</li><li>two</li></ul><table><tr><td>a</td><td>b</td></tr><tr><td>c</td></tr></table>"
        "<p>5 &lt; 6 &amp;&nbsp;ok &#233;</p><script>alert(1)</script><!--[if mso]>MSO<![endif]-->"
        '<img src="https://x.example/i.png" alt="image"></body></html>'
    )

    assert render(compiled).text == (
        "Title\n\nFirst line wraps\n\nSecond\nthird\n\none\n\ntwo\n\na b\n\nc\n\n5 < 6 & ok é"
    )


def test_text_part_leaves_out_empty_and_relative_link_urls() -> None:
    compiled = compile_html(
        '<p><a href="{{ unsubscribe_url }}">sair</a> <a href="/x">rel</a> <a href="#top">topo</a></p>'
    )

    assert render(compiled, {}).text == "sair rel topo"
    assert render(compiled, {"unsubscribe_url": "https://u.example/1"}).text == (
        "sair (https://u.example/1) rel topo"
    )


def test_text_part_keeps_literal_braces_and_collapses_values() -> None:
    compiled = compile_html("<p>{ not a tag } {&#123; x }} {{ first_name }}!</p>")

    email = render(compiled, {"first_name": "  Ana \n  Bia "})

    assert email.text == "{ not a tag } {{ x }} Ana Bia!"


def test_text_part_in_a_preview_shows_real_targets() -> None:
    email = render(compile_email(subject="Oi", body=MJML, body_format="mjml"), {}, click_url="")

    assert "Ver ofertas (https://shop.example.com/sale?utm_source=email&utm_medium=crm)" in email.text
    assert "Oi cliente, a  tem" not in email.text and "Oi cliente, a tem novidades" in email.text
    assert "Descadastrar" in email.text and "Descadastrar (" not in email.text


# --- speed -------------------------------------------------------------------------------------------


def _big_mjml() -> str:
    section = """
    <mj-section background-color="#ffffff" padding="10px 0">
      <mj-column width="50%">
        <mj-image src="https://cdn.example.com/product-{n}.png" alt="Produto {n}"
                  href="https://shop.example.com/p/{n}?utm_source=email&amp;utm_campaign=black-friday"></mj-image>
      </mj-column>
      <mj-column width="50%">
        <mj-text font-size="16px" color="#333333">{{{{ first_name|default:"Cliente"|title }}}}, o produto {n}
          esta com desconto na {{{{ store_name }}}}. Aproveite enquanto durarem os estoques.</mj-text>
        <mj-button background-color="#e85d04" href="https://shop.example.com/p/{n}?utm_source=email">Comprar</mj-button>
      </mj-column>
    </mj-section>"""
    sections = "".join(section.format(n=n) for n in range(6))
    return f"""<mjml>
  <mj-head><mj-title>Black Friday {{{{ store_name }}}}</mj-title><mj-preview>Ofertas para voce</mj-preview>
    <mj-attributes><mj-all font-family="Helvetica, Arial, sans-serif"></mj-all></mj-attributes></mj-head>
  <mj-body background-color="#f4f4f4">{sections}
    <mj-section><mj-column><mj-text font-size="11px" color="#888888">
      Voce recebeu este email porque e cliente da {{{{ store_name }}}} ({{{{ email }}}}).
      <a href="{{{{ unsubscribe_url }}}}">Descadastrar</a> · <a href="https://shop.example.com/privacidade">Privacidade</a>
    </mj-text></mj-column></mj-section>
  </mj-body>
</mjml>"""


def test_rendering_is_fast() -> None:
    body = _big_mjml()
    assert 4500 <= len(body) <= 6500
    compiled = compile_email(
        subject="{{ first_name }}, Black Friday na {{ store_name }}", body=body, body_format="mjml"
    )
    assert len(compiled.links) == 13

    count = 10_000
    started = time.perf_counter()
    for n in range(count):
        email = render_email(
            compiled,
            variables={**VALUES, "first_name": f"cliente {n}"},
            click_url=f"{CLICK}{n}",
            open_pixel_url=f"{PIXEL}{n}",
        )
    elapsed = time.perf_counter() - started

    print(
        f"\nrender_email: {elapsed / count * 1e6:.0f} µs per render ({count} renders in {elapsed:.2f} s; "
        f"html {len(email.html)} chars, text {len(email.text)} chars)"
    )
    assert f'href="{CLICK}{count - 1}/12"' in email.html
    assert f"Cliente {count - 1}, o produto 5" in email.html


def test_the_compiled_html_template_renders_the_same_body() -> None:
    from django.template import Context

    compiled = compile_email(subject="Oi", body=MJML, body_format="mjml")

    direct = re.sub(r"crm[0-9a-f]{16}l(\d+)_", rf"{CLICK}/\1", compiled.html.render(Context(VALUES)))
    assert re.sub(r"crm[0-9a-f]{16}p_", "", direct) == render(compiled).html
