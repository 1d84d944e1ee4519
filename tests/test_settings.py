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


def test_schedule_and_retry_settings_have_the_spec_defaults_and_clear_errors(monkeypatch):
    import pytest
    from pydantic import ValidationError

    from kb.settings import local_zone

    monkeypatch.delenv("TZ", raising=False)
    assert Settings().tz == local_zone()  # empty: the machine's zone
    monkeypatch.setenv("TZ", "Europe/Berlin")
    assert local_zone() == "Europe/Berlin"
    settings = Settings()
    assert (settings.tz, settings.source_retry_waits, settings.kb_wiki_max_tries) == ("Europe/Berlin", (60, 120, 240), 3)
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
