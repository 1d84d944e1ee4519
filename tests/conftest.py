"""Shared test set-up: every test gets its own KB_HOME in a temp folder, and
no test reads the owner's ~/.config/kb."""

from __future__ import annotations

import contextlib
import os
import sys

import pytest

# Keep the bytecode. This machine sets PYTHONDONTWRITEBYTECODE=1, so each
# process compiled kb's modules again: each xdist worker at collection, and
# each `kb` command, Dagster code server, daemon and run worker that a test
# starts (they get this environment). With the cache, `pytest --collect-only`
# takes 6.0 s of user CPU, not 10.6 s (load 9 to 11), and `import
# kb_assets.definitions` 1.3 s, not 1.8 s (load 17; 3 December 2026). The xdist workers and every subprocess start
# after this line, so they inherit it. .gitignore keeps __pycache__/ out of git.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# The ONNX file of the local model (kb/index/embedder.py) lives in the user's cache
# folder. Tests that give a process another HOME keep this one, so the file
# is made once, not once per test (the wiki checks load the model).
os.environ.setdefault("XDG_CACHE_HOME", os.path.join(os.path.expanduser("~"), ".cache"))
# The install's folder of ONNX files (kb/index/onnx_cache.py) is the user's
# one here: a test never writes into the venv that other clones share.
os.environ.setdefault("KB_ONNX_SHARED_DIR", os.path.join(os.environ["XDG_CACHE_HOME"], "kb", "onnx"))
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# The wiki assets build their retry policy at import: a test of a failed
# wiki change must not wait a minute for each retry.
os.environ.setdefault("KB_WIKI_RETRY_DELAY_S", "0")
# The gate waits 60, 120 and 240 s between its tries: no test waits so long.
os.environ.setdefault("KB_GATE_RETRY_WAITS_S", "0,0,0")


@pytest.fixture(autouse=True)
def restore_environ():
    """Every test ends with the environment it began with. Building a
    resource exports a secret from the settings file to the environment
    (kb_resources/client_resource.py), so one test's key must not reach the next."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture(autouse=True)
def kb_home(tmp_path, monkeypatch):
    home = tmp_path / "kb_home"
    home.mkdir(mode=0o700)  # as kb makes it: a wider mode makes each kb command say that it tightened it
    config = tmp_path / "config"
    config.mkdir(mode=0o700)
    monkeypatch.setenv("KB_HOME", str(home))
    monkeypatch.setenv("KB_X_STATE", str(config / "state.json"))
    monkeypatch.setenv("KB_CONFIG_FILE", str(config / "config.toml"))
    monkeypatch.setenv("DAGSTER_HOME", str(home / "dagster"))
    # An empty settings file: no test reads the owner's ~/.config/kb/.env.
    (config / ".env").write_text("")
    monkeypatch.setenv("KB_ENV_FILE", str(config / ".env"))
    # Keep a developer's .env and real keys out of tests.
    for var in ("TELEGRAM_BOT_TOKEN", "GROQ_API_KEY", "DEEPSEEK_API_KEY", "ANTHROPIC_AUTH_TOKEN",
                "ANTHROPIC_BASE_URL", "ANTHROPIC_API_KEY", "OLLAMA_URL", "KB_EMBED_BACKEND",
                # A developer's shared stores: no test may write to them.
                "KB_DAGSTER_POSTGRES_URL", "KB_LANCE_URI", "KB_S3_ENDPOINT", "KB_S3_ACCESS_KEY_ID",
                "KB_S3_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(var, raising=False)
    # The names of the owner's specification set kb's settings too (kb/setting_names.py).
    from kb.setting_names import NO_MEANING, RETRY_NAMES, SPEC_NAMES, TIME_PARTS

    for var in (*SPEC_NAMES, *RETRY_NAMES, *NO_MEANING, *(n for pair in TIME_PARTS.values() for n in pair), "KB_ROOT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)
    return home


@pytest.fixture
def loopback_fetches(monkeypatch):
    """Let kb's fetch guard reach the loopback servers of this test, by port,
    for test files whose loopback sites fetch links (`pytestmark =
    pytest.mark.usefixtures("loopback_fetches")`). The guard refuses
    loopback by default, and a loopback entry of KB_FETCH_ALLOW_HOSTS needs
    its port (kb/fetch_guard.py). So the fixture allows each port on which
    this process listens: the servers of module fixtures, which started
    before it, and each server that starts later in the test (it watches
    socketserver's listen). Every other loopback port stays refused."""
    import socketserver

    ports = set(listening_ports())

    def publish() -> None:
        monkeypatch.setenv("KB_FETCH_ALLOW_HOSTS",
                           ",".join(f"{host}:{port}" for port in sorted(ports) for host in ("127.0.0.1", "localhost")))

    listen = socketserver.TCPServer.server_activate

    def server_activate(server) -> None:
        listen(server)
        if isinstance(server.server_address, tuple):  # not a Unix socket (a subclass too): it has a path
            ports.add(server.server_address[1])
            publish()

    monkeypatch.setattr(socketserver.TCPServer, "server_activate", server_activate)
    publish()


def listening_ports() -> list[int]:
    """The TCP ports on which this process listens (Linux /proc)."""
    sockets = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith("socket:["):
                sockets.add(target[8:-1])
    ports = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as fh:
            for line in fh.readlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in sockets:  # 0A: LISTEN
                    ports.append(int(fields[1].rsplit(":", 1)[1], 16))
    return sorted(set(ports))


@pytest.fixture
def hasher():
    """The deterministic hash embedder: shared words make near vectors, and
    no model loads."""
    from kb.index.embedder import Embedder

    return Embedder.from_settings(backend="hash")


# --- the order of the work on `pytest -n 3` -----------------------------------
# pyproject.toml runs the workers with --dist loadfile --no-loadscope-reorder:
# a file is a unit of work (its module fixtures are built once) that goes to
# the next free worker, in the order below. The longest files start first, so
# no long file starts late while the other worker runs out of work (before:
# test_up.py and test_shared_instance.py, late in the alphabet, often ended
# the run alone). Seconds of one full run on two cores that other jobs also
# used (load average 5.6, 1 December 2026); a file not named here counts as
# short.
FILE_SECONDS = {
    "test_crash_safety.py": 172, "test_up.py": 149, "test_sync.py": 96, "test_wiki_agent.py": 130,
    "test_extract.py": 87, "test_shared_instance.py": 71, "test_layout.py": 66, "test_bad_input.py": 66,
    "test_demo.py": 95, "test_run_monitoring.py": 16, "test_run_endings.py": 36, "test_security.py": 55, "test_capture.py": 52, "test_sources_assets.py": 49,
    "test_embedder.py": 29, "test_stage_commands.py": 47, "test_sqlite_instance.py": 46, "test_parsers.py": 44,
    "test_captions.py": 39, "test_definitions.py": 35, "test_documents.py": 34, "test_normalize.py": 32,
    "test_notifications.py": 24, "test_telegram_bot.py": 19, "test_web.py": 18, "test_mcp_server.py": 17,
    "test_object_storage.py": 16, "test_backup.py": 30, "test_load.py": 14, "test_inbox_sensor.py": 10,
    "test_translations.py": 9, "test_transcripts.py": 8, "test_search.py": 7, "test_inspect.py": 7,
    "test_rerank.py": 12, "test_modal_apps.py": 7, "test_x_graphql.py": 6, "test_fetch_guard.py": 40,
    "test_wiki_remote.py": 8, "test_folders_threads.py": 45, "test_first_hour.py": 10, "test_red_team.py": 75,
    "test_writer_lock.py": 35,
    "test_filtered_search.py": 6,
    "test_wiki_coherence.py": 30,
    "test_mcp_front.py": 30,
    "test_rows_files.py": 40,
    "test_scripts.py": 8,
    "test_dagster_internals.py": 8, "test_fast_loop.py": 1, "test_sync_kb_up.py": 100,
    "test_page_types.py": 8,
    "test_control_plane.py": 65,
    "test_agent_on_the_owner_machine.py": 20,
}


# --- the fast loop: `pytest -m "not slow"` -------------------------------------
# The fast loop holds the core rules (parsing, chunking, search, guards,
# checks) and must stay under 60 s on 2 cores. The rule: a test is slow when
# it needs a browser, starts a `kb` command or a server in another process,
# loads a real model, starts PostgreSQL or runs the agent's CLI, or when it
# takes 0.4 s of CPU or more after the warm-up (measure with `--durations=0`;
# on a loaded machine compare CPU time, not wall time). Name a slow test in
# SLOW_TESTS under its file, or the whole file in SLOW_FILES when its tests
# are slow as a rule. `@pytest.mark.slow` and `@pytest.mark.browser` on a test
# also make it slow. Figures: CPU seconds of each test in one warm process,
# 2 December 2026 (load average 12 to 20 on 2 cores).
SLOW_FILES = {
    "test_capture.py", "test_documents.py", "test_web.py",  # a browser
    "test_crash_safety.py", "test_demo.py", "test_up.py", "test_load.py", "test_mcp_stdio_channel.py",
    "test_definitions.py", "test_mcp_server.py",  # kb or a server in another process
    "test_stage_commands.py", "test_sync.py",  # whole Dagster runs of the graph, 1 to 3 s of CPU each
    "test_backup.py", "test_notifications.py", "test_sources_assets.py",  # a sync, sensors and source runs
    "test_shared_instance.py",  # PostgreSQL
    "test_red_team.py", "test_wiki_agent.py",  # the agent's CLI
    # Two processes that share a store; a kb process writes each rows file.
    # 3 December 2026, load 8 to 9: 9.5 and 7.4 s of CPU with their
    # processes, a quarter of the fast loop's CPU in its tests.
    "test_writer_lock.py", "test_rows_files.py",
}
SLOW_TESTS = {
    "test_bad_input.py": {
        "test_a_300_page_pdf_from_telegram_is_parsed_whole_in_seconds",
        "test_a_300_page_pdf_is_read_whole_in_seconds",
        "test_bad_sources_fail_with_a_named_reason_keep_their_files_and_stop_nothing_else",
        "test_documents_asset_stores_a_reason_for_every_bad_pdf",
        "test_generated_pages_in_a_batch_never_stop_the_normalize_asset",
        "test_generated_pages_parse_or_raise_page_shape_error_naming_the_file",
        "test_malformed_updates_are_skipped_and_the_next_messages_are_handled",
    },
    "test_captions.py": {
        "test_excluded_images_leave_the_index_but_stay_in_duckdb",
        "test_kb_caption_runs_every_waiting_batch_in_one_run",
        "test_photos_wait_below_the_threshold_then_get_captions",
    },
    "test_dagster_internals.py": {
        "test_no_module_but_the_adapter_uses_private_dagster_modules",
        "test_the_public_execute_job_still_makes_runs_that_the_ui_cannot_re_execute",
    },
    "test_embedder.py": {
        "test_a_few_texts_are_embedded_without_pytorch_and_match_a_large_batch",  # PyTorch loads for its fixture
        "test_onnx_runtime_gives_the_vectors_of_sentence_transformers",
        "test_without_a_usable_onnx_file_the_model_runs_on_pytorch",
    },
    "test_eval.py": {
        "test_kb_eval_retrieval_rerank",
    },
    "test_extract.py": {
        "test_on_real_pages_kb_scores_at_least_as_well_as_trafilatura_alone",
    },
    "test_fetch_guard.py": {
        "test_the_clean_context_loads_no_subresource_from_a_private_address",
        "test_the_documents_stage_fails_private_links_by_name",
        "test_the_x_context_reaches_x_and_public_addresses_only",
    },
    "test_first_hour.py": {
        "test_the_commands_that_the_readme_prints_work_as_typed",
    },
    "test_folders_threads.py": {
        "test_folders_and_the_authors_thread_from_import_to_search",
    },
    "test_inbox_sensor.py": {
        "test_a_burst_is_taken_in_slices_without_loss",
    },
    "test_inspect.py": {
        "test_report_over_kb_home_agrees_with_the_normalized_tables",
    },
    "test_layout.py": {
        "test_loading_the_graph_imports_no_client_library",
        "test_opening_lancedb_imports_no_rest_client_until_a_name_of_it_is_read",
        "test_serving_apps_and_the_core_load_no_dagster",
    },
    "test_mcp_front.py": {  # a `kb-mcp` process, and a `kb web` for the first two
        "test_kb_mcp_never_relays_to_a_socket_that_another_user_can_plant",
        "test_kb_mcp_relays_to_the_service_and_loads_no_index",
        "test_kb_mcp_serves_alone_when_the_service_stopped",
    },
    "test_modal_apps.py": {
        "test_the_transcription_body_runs_on_the_cpu",
    },
    "test_normalize.py": {
        "test_a_bad_page_is_kept_and_named_and_the_rest_normalizes",
        "test_checks_fail_on_rows_that_break_the_rules",
        "test_normalize_the_real_captures",
        "test_rematerializing_never_duplicates_and_the_later_batch_wins",
        "test_soft_delete_and_restore_with_full_captures",
        "test_unknown_entry_kinds_are_counted_in_the_metadata",
    },
    "test_object_storage.py": {
        "test_search_reads_the_bucket",
        "test_web_page_and_mcp_server_read_the_bucket",
        "test_writes_and_indexes_go_to_the_bucket",
    },
    "test_parsers.py": {
        "test_only_the_models_that_kb_ships_are_offline",  # a kb process loads the local model
        "test_a_voice_note_in_another_language_fails_instead_of_making_nonsense",
        "test_voice_file_that_is_not_audio_fails_permanently",
        "test_voice_note_is_transcribed_by_tiny_en_when_small_cannot_load",
        "test_web_page_that_needs_javascript_falls_back_to_the_browser",
        "test_web_pdf_link_is_parsed_as_pdf",
    },
    "test_rerank.py": {
        "test_the_model_reads_the_best_window_of_the_whole_bookmark",
    },
    "test_search.py": {
        "test_search_while_another_thread_writes",
    },
    "test_security.py": {
        "test_a_stranger_gets_no_reply_and_writes_nothing",
        "test_documents_send_the_x_login_to_x_only",
        "test_mcp_tools_are_read_only_and_calls_change_no_byte",
        "test_no_key_or_token_reaches_a_log_or_a_file",
    },
    "test_sqlite_instance.py": {
        "test_a_dagster_yaml_of_an_earlier_kb_gets_the_event_log_and_keeps_its_runs",
        "test_a_new_run_file_made_by_kb_equals_the_one_that_dagster_makes",
        "test_another_process_changes_a_run_while_this_one_keeps_its_connections",
        "test_another_process_writes_the_same_run_while_the_keepers_are_open",
    },
    "test_status.py": {
        "test_status_loads_no_model_and_no_bot_library",
    },
    "test_telegram_bot.py": {
        "test_a_link_sent_to_the_bot_is_searchable_and_the_owner_hears_that_it_waits",
        "test_commands_read_state_from_dagster_and_write_requests",
    },
    "test_transcripts.py": {
        "test_local_transcripts_of_speech_silence_and_a_cut_download",
    },
    "test_translations.py": {
        "test_translations_asset_caches_foreign_chunks_and_the_index_shows_english",
    },
}


def is_slow(item: pytest.Item) -> bool:
    name = getattr(item, "originalname", item.name)  # without the parameters
    return (item.path.name in SLOW_FILES or name in SLOW_TESTS.get(item.path.name, ())
            or item.get_closest_marker("browser") is not None)


# First: pytest's own `-m` selection runs after this hook and sees the marks.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    for item in items:
        if is_slow(item) and item.get_closest_marker("slow") is None:
            item.add_marker(pytest.mark.slow)
    # Stable: the tests of a file keep their order.
    items.sort(key=lambda item: -FILE_SECONDS.get(item.path.name, 0))
