"""The secrets that must never leave the machine in the wiki, and the scan
that finds them in a text.

A secret here is the value of a configured key or token (every SecretStr
setting), the password part of the wiki remote's address, and the value of
each cookie of the X login. The wiki goes into the search index, the MCP
server and a remote, so the worker scans every change of the agent before
it commits, and every commit before a push (kb/wiki/repo.py).

The scan finds each secret as it is, and also in the forms that a model or
a page can give it without a change of one bit:
- base64, standard and URL-safe, at each of the three alignments: the
  secret can start at any byte of an encoded block, so each alignment
  gives other characters. Only the characters that the secret alone
  decides are compared. Line breaks do not hide it (MIME and PEM break
  base64 into lines).
- hex, in any case (lower, upper, or mixed), also broken into lines;
- percent-encoding (URL encoding) of any of its characters, also encoded
  twice or three times;
- a part of it (PIECE_CHARS characters, or all of a shorter secret), also
  reversed, in the text as a reader sees it: HTML entities read, Unicode
  in its NFKC form, no format characters (zero-width space, soft hyphen),
  no Markdown escapes, no white space. Why: a page may split a secret
  over two lines, put a zero-width space in it, or write it as `&#49;`;
  a reader (and a model that reads the page) still reads the secret.
The forms are made once for each set of secrets (encoded_forms).
"""

from __future__ import annotations

import base64
import html
import json
import re
import unicodedata
from functools import lru_cache
from pathlib import Path
from urllib.parse import unquote

from kb.settings import Settings, get_settings, named_secret_values

# Shorter values would match common words and numbers. Real keys, tokens
# and X's session cookies (auth_token, ct0, twid) are longer.
MIN_SECRET_LENGTH = 8


def guarded_secrets(settings: Settings | None = None) -> dict[str, str]:
    """Each secret value, by a name that a notice may show (never the value)."""
    settings = settings or get_settings()
    found = named_secret_values(settings)
    for cookie, value in x_login_cookies(settings.x_state_path).items():
        found[f"X login cookie {cookie}"] = value
    return {name: value for name, value in found.items() if len(value) >= MIN_SECRET_LENGTH}


def x_login_cookies(path: Path) -> dict[str, str]:
    """The cookies of the X login state file (Playwright's storage state).
    A missing or unreadable file has none."""
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    cookies = state.get("cookies") if isinstance(state, dict) else None
    return {str(c.get("name")): str(c.get("value")) for c in cookies or []
            if isinstance(c, dict) and c.get("value")}


# Characters of base64 that each byte offset of the secret in a block
# shares with the bytes before it: they do not say anything of the secret.
B64_SKIP = (0, 2, 3)
# Characters of the last, part-filled block that the secret alone decides,
# by the number of its bytes in that block (0, 1 or 2).
B64_TAIL = (0, 1, 2)
URL_SAFE = str.maketrans("+/", "-_")
# A text can encode a secret twice or more (%2541 is %41 is "A").
URL_DECODE_ROUNDS = 3
WHITESPACE = str.maketrans("", "", " \t\r\n\f\v")
# A part of a secret that a text may not hold: long enough that no text
# holds it by chance (a key of 40 random characters has 25 such parts).
PIECE_CHARS = 16
MARKDOWN_ESCAPE = re.compile(r"\\(?=[!-/:-@\[-`{-~])")


def as_read(text: str) -> str:
    """The text as a reader reads it, without white space (see the module's text)."""
    read = unicodedata.normalize("NFKC", html.unescape(text))
    read = "".join(char for char in read if unicodedata.category(char) != "Cf")
    return MARKDOWN_ESCAPE.sub("", read).translate(WHITESPACE)


def pieces(value: str) -> tuple[str, ...]:
    """The parts of a secret that as_read() text may not hold, also reversed."""
    value = value.translate(WHITESPACE)
    size = min(PIECE_CHARS, len(value))
    parts = {value[at:at + size] for at in range(len(value) - size + 1)}
    return tuple(sorted(parts | {part[::-1] for part in parts}))


def base64_cores(raw: bytes) -> list[str]:
    """The base64 characters that `raw` decides at each of the three byte
    offsets in the encoded block, in the standard alphabet."""
    cores = []
    for offset in range(3):
        encoded = base64.b64encode(b"\0" * offset + raw).decode("ascii")
        length = offset + len(raw)
        cores.append(encoded[B64_SKIP[offset]:(length // 3) * 4 + B64_TAIL[length % 3]])
    return cores


@lru_cache(maxsize=8)
def encoded_forms(secrets: tuple[tuple[str, str], ...]) -> tuple[tuple[str, tuple[str, ...], ...], ...]:
    """For each (name, value): the name, the base64 forms (standard and
    URL-safe, three alignments), the hex form (lower case) and the pieces
    (pieces(): parts, also reversed). Made once
    for each set of secrets: the scan runs for each wiki change."""
    forms = []
    for name, value in secrets:
        raw = value.encode("utf-8")
        cores = base64_cores(raw)
        b64 = tuple(dict.fromkeys(cores + [core.translate(URL_SAFE) for core in cores]))
        forms.append((name, b64, (raw.hex(),), pieces(value)))
    return tuple(forms)


def _found(text: str, secrets: dict[str, str]) -> set[tuple[str, str]]:
    """(name, form) for each form of each secret in `text`."""
    if not text or not secrets:
        return set()
    squeezed = text.translate(WHITESPACE)
    lowered = squeezed.lower()
    decoded = [text]
    while "%" in decoded[-1] and len(decoded) <= URL_DECODE_ROUNDS:
        once = unquote(decoded[-1], errors="surrogateescape")
        if once == decoded[-1]:
            break
        decoded.append(once)
    read = as_read(text)
    found = set()
    for name, b64, hexes, parts in encoded_forms(tuple(sorted(secrets.items()))):
        value = secrets[name]
        if any(value in view for view in decoded):
            found.add((name, "text"))
        found.update((name, f"piece {part}") for part in parts if part in read)
        found.update((name, f"base64 {form}") for form in b64 if form in squeezed)
        found.update((name, f"hex {form}") for form in hexes if form in lowered)
    return found


def secrets_in(text: str, secrets: dict[str, str], *, already: str = "") -> list[str]:
    """The names of the secrets whose value, or a base64, hex or
    percent-encoded form of it, is in `text` and was not in `already` (the
    text before the change) in that same form."""
    found = _found(text, secrets)
    if found and already:
        found -= _found(already, secrets)
    return sorted({name for name, _ in found})
