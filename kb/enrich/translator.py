"""Translation into English: Groq `openai/gpt-oss-120b` through the official
`groq` client, at settings.groq_base_url.

Rules, and why:
- The text goes out in paragraph-aligned pieces of at most 1,500
  characters. A long piece makes the model summarize or drop lines; cuts at
  paragraph ends (then sentence ends, then spaces) keep the meaning whole.
  The pieces join again with the separators they had.
- reasoning_effort "low": translation needs little reasoning, and reasoning
  tokens cost time and money.
- The model answers ENGLISH when a piece is already English. When every
  piece is, translate() returns None, and the cache stores NULL, so the
  text is never sent again.
- The `groq` client retries a 429, a 5xx and a lost connection itself
  (max_retries times). After a 429 it waits what retry-after or
  retry-after-ms asks, up to 60 s, else a short growing back-off. A
  rate limit that outlasts the retries is groq.RateLimitError: the piece
  fails, and the next run tries it again.
- No key, or `translate = false` in config.toml: translation is off.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from pydantic import BaseModel, SecretStr

from kb.settings import Settings, get_settings, redact_secrets

if TYPE_CHECKING:
    import groq

PIECE_CHARS = 1_500
ENGLISH = "ENGLISH"
# The suffix of Groq's OpenAI-compatible address. The groq client adds it
# itself, so it comes off a GROQ_BASE_URL that still carries it.
OPENAI_SUFFIX = "/openai/v1"
# These statuses mean the whole run cannot work (bad key, no such model).
FATAL_STATUSES = (401, 403, 404)

INSTRUCTIONS = """\
Translate the user's text into English. Keep the meaning, the names, numbers, \
links, hashtags, @handles and line breaks. Answer with the translation only, \
with no note or comment. If the text is already in English, answer with the \
single word ENGLISH."""

PARAGRAPH_BREAK = re.compile(r"\n[ \t]*\n\s*")
# Between sentences: white space after . ! ?, or nothing after the CJK marks.
SENTENCE_BREAK = re.compile(r"(?<=[.!?])\s+|(?<=[。！？])")
WORD_BREAK = re.compile(r"\s+")
LETTER = re.compile(r"[^\W\d_]", re.UNICODE)


class TranslateError(RuntimeError):
    """A piece could not be translated. `fatal`: no other piece can be either
    (a bad key, a wrong model name), so the run stops."""

    def __init__(self, message: str, *, fatal: bool = False):
        super().__init__(message)
        self.fatal = fatal


def _split_keep(text: str, pattern: re.Pattern) -> list[tuple[str, str]]:
    """[(separator before, part)]; "".join(sep + part) gives `text` again."""
    parts, separator, last = [], "", 0
    for match in pattern.finditer(text):
        if match.end() == match.start() and match.start() in (0, len(text)):
            continue
        parts.append((separator, text[last:match.start()]))
        separator, last = match.group(), match.end()
    parts.append((separator, text[last:]))
    return parts


def _atoms(separator: str, text: str, limit: int, levels: tuple[re.Pattern, ...]) -> list[tuple[str, str]]:
    """Cut `text` at the first level of breaks (then the next) until each
    part fits in `limit`; a run with no break at all is cut hard."""
    if len(text) <= limit:
        return [(separator, text)]
    if not levels:
        return [(separator if start == 0 else "", text[start:start + limit]) for start in range(0, len(text), limit)]
    out = []
    for number, (sep, part) in enumerate(_split_keep(text, levels[0])):
        out += _atoms(separator if number == 0 else sep, part, limit, levels[1:])
    return out


def split_pieces(text: str, limit: int = PIECE_CHARS) -> list[tuple[str, str]]:
    """Paragraph-aligned pieces of at most `limit` characters, each with the
    separator that stood before it: "".join(sep + piece) == text."""
    pieces: list[tuple[str, str]] = []
    for separator, part in _split_keep(text, PARAGRAPH_BREAK):
        for atom_sep, atom in _atoms(separator, part, limit, (SENTENCE_BREAK, WORD_BREAK)):
            if pieces and len(pieces[-1][1]) + len(atom_sep) + len(atom) <= limit:
                pieces[-1] = (pieces[-1][0], pieces[-1][1] + atom_sep + atom)
            else:
                pieces.append((atom_sep, atom))
    return pieces


def is_english_answer(answer: str) -> bool:
    return answer.strip().strip(".\"'`*").upper() == ENGLISH


class Translator(BaseModel):
    """English translations through the groq client
    (GROQ_BASE_URL, KB_TRANSLATE_MODEL, GROQ_API_KEY)."""

    base_url: str
    model: str
    api_key: SecretStr | None = None
    max_retries: int = 6
    timeout_s: float = 120.0
    # Why translation is off by the owner's choice (config.toml), or "".
    turned_off: str = ""

    @classmethod
    def from_settings(cls, settings: Settings | None = None, **overrides) -> "Translator":
        s = settings or get_settings()
        off = f"translate = false in {s.kb_config_file}" if s.owner_config().get("translate", True) is False else ""
        return cls(**{"base_url": s.groq_base_url, "model": s.kb_translate_model, "api_key": s.groq_api_key,
                      "max_retries": s.kb_translate_max_retries, "turned_off": off, **overrides})

    def model_name(self) -> str:
        return self.model

    def _base_url(self) -> str:
        return self.base_url.rstrip("/").removesuffix(OPENAI_SUFFIX)

    def off_reason(self) -> str | None:
        if self.turned_off:
            return self.turned_off
        if not (self.api_key and self.api_key.get_secret_value()):
            return "no GROQ_API_KEY"
        return None

    def readiness(self) -> tuple[bool, str]:
        reason = self.off_reason()
        return (False, reason) if reason else (True, f"{self.model_name()} at {self._base_url()}")

    def client(self) -> groq.Groq:
        # groq is imported here and in _ask, not at the top: every Dagster
        # process imports this module when it loads the graph.
        import groq

        from kb.guards.tls import tls_context

        return groq.Groq(base_url=self._base_url(), api_key=self.api_key.get_secret_value(),
                         timeout=self.timeout_s, max_retries=self.max_retries,
                         http_client=groq.DefaultHttpxClient(verify=tls_context()))  # kb/guards/tls.py

    def translate(self, text: str, client: groq.Groq | None = None) -> str | None:
        """The English of `text`, or None when it is English already."""
        client = client or self.client()
        out, translated = [], False
        for separator, piece in split_pieces(text):
            if not LETTER.search(piece):
                out.append(separator + piece)  # numbers, links, emoji: nothing to translate
                continue
            answer = self._ask(client, piece)
            if is_english_answer(answer):
                out.append(separator + piece)
            else:
                out.append(separator + answer.strip())
                translated = True
        return "".join(out).strip() if translated else None

    def _ask(self, client: groq.Groq, piece: str) -> str:
        """One piece, with the client's own retries. Every error text is
        redacted: an endpoint can quote the key in it."""
        import groq

        try:
            response = client.chat.completions.create(
                model=self.model_name(),
                messages=[{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": piece}],
                reasoning_effort="low",
            )
        except groq.RateLimitError:
            raise TranslateError(f"{self._base_url()} answered 429 (rate limit) {self.max_retries + 1} times "
                                 "in a row; the text waits for the next run") from None
        except groq.APIStatusError as exc:
            if exc.status_code >= 500:
                raise TranslateError(f"{self._base_url()} failed {self.max_retries + 1} times with "
                                     f"HTTP {exc.status_code}") from None
            raise TranslateError(f"{self._base_url()} refused the request: HTTP {exc.status_code}: "
                                 f"{redact_secrets(str(exc))[:200]}", fatal=exc.status_code in FATAL_STATUSES) from None
        except groq.APIError as exc:  # connection errors and timeouts, after the retries
            raise TranslateError(redact_secrets(f"{self._base_url()} does not answer: {type(exc).__name__}: {exc}"),
                                 fatal=True) from None
        content = response.choices[0].message.content if response.choices else None
        if not content or not content.strip():
            raise TranslateError(f"{self.model_name()} gave an empty answer")
        return content
