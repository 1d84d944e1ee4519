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
