"""Resources for the outside services: the browser, the embedder, the
caption, transcript and translation models, the quality gate, the wiki
agent and the Telegram notifier. Each hands out its core client."""

from __future__ import annotations

from kb.x.browser import Browser
from kb.index.embedder import Embedder
from kb.telegram.gate import QualityGate
from kb.telegram.notifier import TelegramNotifier
from kb.enrich.transcriber import Transcriber
from kb.enrich.translator import Translator
from kb.enrich.vision import Captioner
from kb.wiki.agent import WikiAgent
from kb_resources.client_resource import ClientResource


class BrowserResource(ClientResource):
    """Playwright on Chromium. The X login state is used on X pages only."""

    client_class = Browser

    def get_client(self) -> Browser:
        return super().get_client()


class EmbedderResource(ClientResource):
    """The embedding model: local, Ollama or the test hash."""

    client_class = Embedder

    def get_client(self) -> Embedder:
        return super().get_client()


class CaptionerResource(ClientResource):
    """Captions and OCR text of photos."""

    client_class = Captioner

    def get_client(self) -> Captioner:
        return super().get_client()


class TranscriberResource(ClientResource):
    """Transcripts of videos."""

    client_class = Transcriber

    def get_client(self) -> Transcriber:
        return super().get_client()


class TranslatorResource(ClientResource):
    """English translations through Groq."""

    client_class = Translator

    def get_client(self) -> Translator:
        return super().get_client()


class QualityGateResource(ClientResource):
    """The LLM quality gate of Telegram sources."""

    client_class = QualityGate

    def get_client(self) -> QualityGate:
        return super().get_client()


class WikiAgentResource(ClientResource):
    """The wiki agent (Claude Code through claude-agent-sdk)."""

    client_class = WikiAgent

    def get_client(self) -> WikiAgent:
        return super().get_client()


class TelegramNotifierResource(ClientResource):
    """Item notifications through the Bot API."""

    client_class = TelegramNotifier

    def get_client(self) -> TelegramNotifier:
        return super().get_client()
