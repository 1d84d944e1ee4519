import os
from pathlib import Path

from kb.settings import Settings, env_example, get_settings

REPO = Path(__file__).resolve().parents[1]


def test_env_example_lists_every_setting():
    text = (REPO / ".env.example").read_text()
    assert text == env_example(), "run: python -c 'from kb.settings import env_example; open(\".env.example\",\"w\").write(env_example())'"
    for name in Settings.model_fields:
        assert f"\n{name.upper()}=" in text


def test_kb_home_comes_from_the_environment(kb_home):
    settings = get_settings()
    assert settings.home == kb_home.resolve()
    assert settings.duckdb_path.parent == kb_home.resolve()
    assert settings.dagster_home == kb_home.resolve() / "dagster"
    # The X login never lives in KB_HOME.
    assert kb_home.resolve() not in settings.x_state_path.resolve().parents


def test_settings_follow_environment_changes(monkeypatch, tmp_path):
    monkeypatch.setenv("KB_HOME", str(tmp_path / "other"))
    assert get_settings().home == (tmp_path / "other").resolve()
    first = get_settings()
    assert get_settings() is first  # no change: the cached settings
    monkeypatch.setenv("KB_GATE_THRESHOLD", "77")
    assert get_settings().kb_gate_threshold == 77
    monkeypatch.delenv("KB_GATE_THRESHOLD")
    assert get_settings().kb_gate_threshold == first.kb_gate_threshold
    os.environ["KB_HOME"] = str(tmp_path / "third")  # a write that does not go through monkeypatch
    assert get_settings().home == (tmp_path / "third").resolve()


def test_schedule_and_retry_settings_have_the_spec_defaults_and_clear_errors(monkeypatch):
    import pytest
    from pydantic import ValidationError

    from kb.settings import local_zone

    monkeypatch.delenv("TZ", raising=False)
    assert Settings().tz == local_zone()  # empty: the machine's zone
    monkeypatch.setenv("TZ", "Europe/Berlin")
    assert local_zone() == "Europe/Berlin"
    settings = Settings()
    assert (settings.tz, settings.source_retry_waits, settings.kb_wiki_max_retries) == ("Europe/Berlin", (60, 120, 240), 3)
    assert settings.cron_at(settings.kb_lint_time) == "0 2 * * *"
    assert settings.cron_at(settings.kb_synthesis_time, settings.kb_synthesis_day) == "0 9 * * sun"
    for name, value, words in (("TZ", "Mars/Olympus", "TZ='Mars/Olympus' is not a time zone name"),
                               ("KB_SOURCE_RETRY_WAITS_S", "60,soon", "must be whole seconds of 1 or more"),
                               ("KB_LINT_TIME", "25:00", "KB_LINT_TIME='25:00' is not a time of day"),
                               ("KB_SYNTHESIS_DAY", "someday", "KB_SYNTHESIS_DAY='someday' is not a day")):
        monkeypatch.setenv(name, value)
        with pytest.raises(ValidationError, match=words.replace("(", r"\(").replace("[", r"\[")):
            Settings()
        monkeypatch.delenv(name)
    monkeypatch.setenv("TZ", "Europe/Berlin")
def test_settings_come_from_the_settings_file_then_the_environment(monkeypatch, tmp_path):
    import pytest

    from kb.settings import SettingsFileError, settings_file

    env_file = tmp_path / "kb.env"
    env_file.write_text(f"GROQ_API_KEY=gsk-from-the-file\nKB_HOME={tmp_path / 'file-home'}\nKB_GATE_THRESHOLD=75\n")
    monkeypatch.setenv("KB_ENV_FILE", str(env_file))
    # A .env in the working folder is not read: a process started elsewhere must see the same keys.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / ".env").write_text("KB_GATE_THRESHOLD=10\n")
    monkeypatch.chdir(elsewhere)
    monkeypatch.delenv("KB_HOME")
    settings = get_settings()
    assert settings_file() == env_file.resolve()
    assert settings.groq_api_key.get_secret_value() == "gsk-from-the-file"
    assert settings.kb_gate_threshold == 75
    assert settings.home == (tmp_path / "file-home").resolve()
    # The environment wins over the file.
    monkeypatch.setenv("KB_HOME", str(tmp_path / "env-home"))
    assert get_settings().home == (tmp_path / "env-home").resolve()

    monkeypatch.setenv("KB_ENV_FILE", str(tmp_path / "missing.env"))
    with pytest.raises(SettingsFileError, match=r"KB_ENV_FILE=.*missing\.env is not a file"):
        get_settings()


def test_the_specifications_names_set_kbs_settings_and_status_names_the_one_it_read(monkeypatch, tmp_path):
    """An owner's .env of the specification (section 10) gives its values,
    and `kb status` says which name kb read for each setting."""
    from kb.apps.status import setting_name_lines
    from kb.settings import setting_names_read

    env_file = tmp_path / "spec.env"
    env_file.write_text("INGEST_MAX_TURNS=22\nDEEPSEEK_MODEL=deepseek-reasoner\nLINT_HOUR=3\nSYNTHESIS_DAY=sat\n"
                        "SYNTHESIS_MINUTE=30\nRETRIES_MAX=2\nRETRY_BACKOFF_BASE_SECONDS=10\nSTATE_DB=./state.db\n")
    monkeypatch.setenv("KB_ENV_FILE", str(env_file))
    monkeypatch.delenv("KB_GATE_RETRY_WAITS_S", raising=False)
    monkeypatch.delenv("KB_WIKI_RETRY_DELAY_S", raising=False)
    monkeypatch.setenv("GATE_ACCEPT_THRESHOLD", "70")
    monkeypatch.setenv("SWEEPER_STUCK_MINUTES", "45")
    monkeypatch.setenv("KB_LINT_MAX_TURNS", "33")  # kb's own name still works
    settings = get_settings()
    assert (settings.kb_agent_max_turns, settings.kb_gate_model, settings.kb_gate_threshold,
            settings.kb_stuck_minutes, settings.kb_lint_max_turns) == (22, "deepseek-reasoner", 70, 45, 33)
    assert (settings.kb_lint_time, settings.kb_synthesis_day, settings.kb_synthesis_time) == ("03:00", "sat", "09:30")
    # The specification's retry rule for every stage: base, 2 x base, 4 x base.
    assert (settings.kb_wiki_max_retries, settings.kb_wiki_retry_delay_s) == (2, 10)
    assert (settings.source_retry_waits, settings.gate_retry_waits) == ((10, 20), (10, 20))
    lines = setting_name_lines(setting_names_read(settings))
    for line in ("  ingest max turns: 22 (INGEST_MAX_TURNS)", "  gate accept threshold: 70 (GATE_ACCEPT_THRESHOLD)",
                 "  lint max turns: 33 (KB_LINT_MAX_TURNS)", "  lint time: 03:00 (LINT_HOUR)",
                 "  synthesis time: 09:30 (SYNTHESIS_MINUTE)", "  stuck minutes: 45 (SWEEPER_STUCK_MINUTES)",
                 "  synthesis max turns: 60 (default)",
                 "  parse retry waits: 10,20 (RETRIES_MAX and RETRY_BACKOFF_BASE_SECONDS)"):
        assert line in lines, lines
    assert any(line.startswith("  STATE_DB is set and changes nothing: kb keeps no SQLite state file")
               for line in lines), lines
    # RETRIES_MAX=0: no retry in any stage.
    monkeypatch.setenv("RETRIES_MAX", "0")
    assert (get_settings().kb_wiki_max_retries, get_settings().source_retry_waits, get_settings().gate_retry_waits) == (
        0, (), ())


def test_the_specifications_defaults():
    """Section 10 and 11.3 of the specification, where kb has no reason to differ (docs/settings.md)."""
    settings = Settings()
    assert (settings.kb_gate_base_url, settings.kb_gate_model, settings.kb_gate_threshold) == (
        "https://api.deepseek.com/v1", "deepseek-chat", 60)
    assert (settings.kb_agent_timeout_s, settings.kb_agent_max_turns, settings.kb_lint_max_turns,
            settings.kb_synthesis_max_turns) == (600, 25, 40, 60)
    assert (settings.kb_wiki_max_retries, settings.kb_stuck_minutes, settings.kb_lint_time,
            settings.kb_synthesis_day, settings.kb_synthesis_time) == (3, 30, "02:00", "sun", "09:00")
    assert Settings.model_fields["kb_wiki_retry_delay_s"].default == 60


def test_two_names_of_one_setting_with_two_values_is_an_error_that_names_both(monkeypatch, tmp_path):
    import pytest

    from kb.setting_names import SettingNameConflict

    env_file = tmp_path / "kb.env"
    env_file.write_text("KB_AGENT_MAX_TURNS=30\n")
    monkeypatch.setenv("KB_ENV_FILE", str(env_file))
    monkeypatch.setenv("INGEST_MAX_TURNS", "25")
    with pytest.raises(SettingNameConflict, match=r"INGEST_MAX_TURNS='25' \(in the environment\) and "
                                                  r"KB_AGENT_MAX_TURNS='30' \(in the settings file\) are two names"):
        get_settings()
    # The same value under both names is no conflict.
    env_file.write_text("KB_AGENT_MAX_TURNS=25\n")
    assert get_settings().kb_agent_max_turns == 25
    monkeypatch.setenv("LINT_MINUTE", "15")
    monkeypatch.setenv("KB_LINT_TIME", "02:30")
    with pytest.raises(SettingNameConflict, match=r"LINT_MINUTE \(the time 02:15\) \(in the environment\) and KB_LINT_TIME='02:30'"):
        get_settings()
    monkeypatch.setenv("KB_LINT_TIME", "2:15")
    assert get_settings().kb_lint_time == "02:15"
    # A URL is named, never shown: it can hold a password.
    monkeypatch.setenv("DEEPSEEK_BASE_URL", "https://user:pw-secret@gate.example/v1")
    monkeypatch.setenv("KB_GATE_BASE_URL", "https://gate.example/v1")
    with pytest.raises(SettingNameConflict) as error:
        get_settings()
    assert "DEEPSEEK_BASE_URL (in the environment) and KB_GATE_BASE_URL" in str(error.value)
    assert "pw-secret" not in str(error.value)
    monkeypatch.delenv("KB_GATE_BASE_URL")
    monkeypatch.setenv("LINT_HOUR", "24")
    with pytest.raises(SettingNameConflict, match="LINT_HOUR='24' is not a whole number from 0 to 23"):
        get_settings()


def test_kb_root_must_name_the_wiki_folder(monkeypatch, kb_home):
    import pytest
    from pydantic import ValidationError

    monkeypatch.setenv("KB_ROOT", str(kb_home / "wiki"))
    assert get_settings().wiki_dir == kb_home.resolve() / "wiki"
    monkeypatch.setenv("KB_ROOT", "../llm-kb-wiki")
    with pytest.raises(ValidationError, match=r"KB_ROOT='../llm-kb-wiki' is not the wiki folder of kb"):
        get_settings()
