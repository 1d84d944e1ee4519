"""The secret scan (kb/guards/secret_scan.py) finds a secret in the forms that a
model or a page can give it without a change of one bit: base64 (standard
and URL-safe, at each byte offset in the block, also in lines), hex (any
case) and percent-encoding. Each form stands in the middle of a text, the
way a hostile agent would hide it in a page."""

from __future__ import annotations

import base64
import textwrap

import pytest

from kb.guards.secret_scan import base64_cores, encoded_forms, secrets_in

# "~?>" makes "+" and "/" in base64, so the URL-safe form differs from the standard one.
SECRET = "tok~?>~?>-3f9a7c1e55d2b8"
SECRETS = {"GROQ_API_KEY": SECRET, "X login cookie ct0": "a-cookie-value-1234567"}


def percent_all(text: str) -> str:
    return "".join(f"%{b:02X}" for b in text.encode())


def mixed_case(text: str) -> str:
    return "".join(c.upper() if i % 2 else c for i, c in enumerate(text))


FORMS = {
    "as it is": lambda s: s,
    "base64 at offset 0": lambda s: base64.b64encode(s.encode()).decode(),
    "base64 at offset 1": lambda s: base64.b64encode(b"{" + s.encode() + b"}").decode(),
    "base64 at offset 2": lambda s: base64.b64encode(b'{"' + s.encode() + b'"}').decode(),
    "URL-safe base64 at offset 0": lambda s: base64.urlsafe_b64encode(s.encode()).decode().rstrip("="),
    "URL-safe base64 at offset 1": lambda s: base64.urlsafe_b64encode(b"k" + s.encode() + b"!!").decode(),
    "URL-safe base64 at offset 2": lambda s: base64.urlsafe_b64encode(b"k=" + s.encode() + b"!").decode(),
    "base64 in lines of 76 (MIME)": lambda s: base64.encodebytes(b"x" * 70 + s.encode()).decode(),
    "hex, lower case": lambda s: s.encode().hex(),
    "hex, upper case": lambda s: s.encode().hex().upper(),
    "hex, mixed case": lambda s: mixed_case(s.encode().hex()),
    "hex in lines (xxd -p)": lambda s: "\n".join(textwrap.wrap("00ff" + s.encode().hex(), 30)),
    "percent-encoded, every byte": percent_all,
    "percent-encoded, lower-case hex": lambda s: percent_all(s).lower(),
    "percent-encoded, some characters": lambda s: s.replace("~", "%7E").replace("?", "%3F").replace("-", "%2d"),
    "percent-encoded twice": lambda s: percent_all(s).replace("%", "%25"),
    # As a reader reads it (the red team's forms, 7 December 2026):
    "split by a new line": lambda s: s[:9] + "\n" + s[9:],
    "split by a soft line break of Markdown": lambda s: s[:9] + "  \n  " + s[9:],
    "a zero-width space inside": lambda s: s[:5] + "\u200b" + s[5:],
    "a soft hyphen inside": lambda s: s[:5] + "\u00ad" + s[5:],
    "HTML entities, every character": lambda s: "".join(f"&#{ord(c)};" for c in s),
    "one HTML entity": lambda s: s[:3] + f"&#x{ord(s[3]):x};" + s[4:],
    "Markdown escapes": lambda s: "".join("\\" + c if c in "~?>-" else c for c in s),
    "full-width characters": lambda s: "".join(chr(ord(c) + 0xFEE0) if "!" <= c <= "~" else c for c in s),
    "reversed": lambda s: s[::-1],
    "two parts far apart": lambda s: s[:16] + " and, much later in the text, " + s[8:],
}


def test_the_chosen_secret_has_url_safe_forms_that_differ():
    assert all(set(core) & set("+/") for core in base64_cores(SECRET.encode()))


@pytest.mark.parametrize("form", list(FORMS))
def test_the_scan_finds_each_form_of_a_secret_in_the_middle_of_a_text(form):
    hidden = FORMS[form](SECRET)
    assert SECRET not in hidden or form == "as it is"
    text = f"# A page\n\nSome words before it, {hidden} and some words after it.\n"
    assert secrets_in(text, SECRETS) == ["GROQ_API_KEY"]


@pytest.mark.parametrize("before", range(6))
@pytest.mark.parametrize("after", range(4))
def test_base64_finds_the_secret_at_every_byte_offset(before, after):
    blob = bytes(range(200, 200 + before)) + SECRET.encode() + b"\x00\xff\x10"[:after]
    for encode in (base64.b64encode, base64.urlsafe_b64encode):
        assert secrets_in(f"data:{encode(blob).decode()};", SECRETS) == ["GROQ_API_KEY"]


def test_a_text_without_the_secret_is_clean():
    # No 16 characters in a row of the secret (a longer part is a leak).
    near = SECRET[:10] + "X" + SECRET[11:20]
    text = " ".join([
        "A page about keys.", near, FORMS["base64 at offset 0"](near), near.encode().hex(), percent_all(near),
        base64.b64encode(b"some other text of the same length as a key").decode(), "%zz %", "",
    ])
    assert secrets_in(text, SECRETS) == []
    assert secrets_in("", SECRETS) == [] and secrets_in(text, {}) == []


def test_a_form_that_was_there_before_is_not_new_but_a_new_form_is():
    page = f"Old page with {FORMS['hex, lower case'](SECRET)}.\n"
    assert secrets_in(page + "A new line.\n", SECRETS, already=page) == []
    assert secrets_in(page + FORMS["base64 at offset 1"](SECRET), SECRETS, already=page) == ["GROQ_API_KEY"]


def test_the_forms_are_made_once_for_a_set_of_secrets():
    encoded_forms.cache_clear()
    for _ in range(50):
        secrets_in("some text", SECRETS)
    assert encoded_forms.cache_info().misses == 1
    # Each base64 form decodes back to bytes of the secret.
    [(_, forms, hexes, parts)] = encoded_forms((("K", SECRET),))
    assert SECRET[:16] in parts and SECRET[-16:][::-1] in parts and len(parts) == 2 * (len(SECRET) - 15)
    assert hexes == (SECRET.encode().hex(),)
    assert SECRET.encode().startswith(base64.b64decode(forms[0][:len(forms[0]) // 4 * 4]))


def test_the_wiki_refuses_a_page_with_the_base64_of_a_secret(kb_home):
    """The scan as the worker runs it, on a real git wiki: the refusal
    names the secret, and no form of its value."""
    from kb.wiki.repo import Wiki

    wiki = Wiki.from_settings()
    root = wiki.ensure()
    before = wiki.begin_change()
    hidden = FORMS["base64 at offset 2"](SECRET)
    (root / "wiki/entities/Key.md").write_text(f"# Key\n\nThe value, encoded: {hidden}\n")
    problems = wiki.refusals(before, "ingest: a page", secrets=SECRETS)
    assert problems == ["refused: wiki/entities/Key.md holds the value of GROQ_API_KEY"]
    problems = wiki.refusals(before, f"ingest: {percent_all(SECRET)}", secrets=SECRETS)
    assert "refused: the commit message holds the value of GROQ_API_KEY" in problems
    assert not any(SECRET in p or hidden in p for p in problems)
    wiki.rollback(before.sha)
    wiki.end_change()
