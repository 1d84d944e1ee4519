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
