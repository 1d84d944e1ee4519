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
    chromium_path: str
    x_state_path: str
    x_base_url: str
    timeout_s: float
    headless: bool = True

    def get_client(self) -> Browser:
        return super().get_client()


class EmbedderResource(ClientResource):
    """The embedding model: local, Ollama or the test hash."""

    client_class = Embedder
    backend: str
    ollama_url: str
    ollama_model: str
    local_model: str
    batch_size: int
    cache_dir: str
    use_cache: bool = True
    ollama_timeout_s: float = 120.0
    query_int8: bool = True
    onnx_documents: bool = False
    int8_documents: bool = False

    def get_client(self) -> Embedder:
        return super().get_client()


class CaptionerResource(ClientResource):
    """Captions and OCR text of photos."""

    client_class = Captioner
    SECRETS = {"api_key": "KB_CAPTION_API_KEY"}
    backend: str = "off"
    base_url: str = ""
    api_key: str = ""
    model: str = ""
    modal_model: str = ""
    modal_gpu: str = "L40S"
    max_num_seqs: int = 64
    workers: int = 4
    timeout_s: float = 120.0
    max_retries: int = 2
    max_tokens: int = 512

    def get_client(self) -> Captioner:
        return super().get_client()


class TranscriberResource(ClientResource):
    """Transcripts of videos."""

    client_class = Transcriber
    backend: str = "off"
    model: str = ""
    modal_model: str = "large-v3-turbo"
    modal_gpu: str = "L4"
    modal_containers: int = 4
    whisper_model: str = ""

    def get_client(self) -> Transcriber:
        return super().get_client()


class TranslatorResource(ClientResource):
    """English translations through Groq."""

    client_class = Translator
    SECRETS = {"api_key": "GROQ_API_KEY"}
    base_url: str
    model: str
    api_key: str = ""
    max_retries: int = 6
    timeout_s: float = 120.0
    turned_off: str = ""

    def get_client(self) -> Translator:
        return super().get_client()


class QualityGateResource(ClientResource):
    """The LLM quality gate of Telegram sources."""

    client_class = QualityGate
    SECRETS = {"api_key": "DEEPSEEK_API_KEY"}
    base_url: str
    model: str
    threshold: int
    api_key: str = ""
    timeout_s: float = 60.0
    retry_waits_s: list[float] = [60.0, 120.0, 240.0]

    def get_client(self) -> QualityGate:
        return super().get_client()


class WikiAgentResource(ClientResource):
    """The wiki agent (Claude Code through claude-agent-sdk)."""

    client_class = WikiAgent
    SECRETS = {"auth_token": "ANTHROPIC_AUTH_TOKEN"}
    base_url: str
    model: str
    auth_token: str = ""
    max_turns: int = 30
    lint_max_turns: int = 40
    synthesis_max_turns: int = 60
    timeout_s: float = 600.0
    agent_dir: str
    sandbox: str = "auto"
    egress_proxy: str = ""  # KB_EGRESS_PROXY

    def get_client(self) -> WikiAgent:
        return super().get_client()


class TelegramNotifierResource(ClientResource):
    """Item notifications through the Bot API."""

    client_class = TelegramNotifier
    SECRETS = {"bot_token": "TELEGRAM_BOT_TOKEN"}
    inbox_dir: str
    api_base: str
    bot_token: str = ""
    owner_chat_id: str = ""
    egress_proxy: str = ""  # KB_EGRESS_PROXY
    notices_log: str = ""

    def get_client(self) -> TelegramNotifier:
        return super().get_client()
