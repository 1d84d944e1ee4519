"""The names of the owner's specification for kb's settings.

The specification (wiki-and-telegram-spec.txt, section 10) names its
settings INGEST_MAX_TURNS, DEEPSEEK_MODEL, LINT_HOUR and so on. kb's own
names start with KB_. An owner who brings the `.env` of the specification
must get the values that it sets, not kb's defaults without a word. So kb
reads both names of each setting (`SpecNamesSource`, the first source of
kb.settings.Settings), and `kb status` tells which name gave each value.

Rules:
- Both names set to different values (in the environment, the settings
  file, or one in each): an error that names both. kb cannot know which one
  the owner means.
- LINT_HOUR and LINT_MINUTE make KB_LINT_TIME (HH:MM); SYNTHESIS_HOUR and
  SYNTHESIS_MINUTE make KB_SYNTHESIS_TIME. A part that is not set comes
  from the default of kb's setting.
- RETRIES_MAX and RETRY_BACKOFF_BASE_SECONDS set the retries of the wiki
  stage. They also give the waits of the parse and gate retries (base,
  2 x base, 4 x base ...: the specification's rule for every stage), unless
  KB_SOURCE_RETRY_WAITS_S or KB_GATE_RETRY_WAITS_S names the waits itself:
  the setting of one stage wins over the setting of all stages.
- A name of the specification that has no meaning in kb (STATE_DB,
  POLL_INTERVAL_SECONDS) changes nothing; `kb status` says that it is set and why
  it has no effect.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic_settings import PydanticBaseSettingsSource

# The specification's name -> kb's setting (a field of kb.settings.Settings).
SPEC_NAMES: dict[str, str] = {
    "DEEPSEEK_BASE_URL": "kb_gate_base_url",
    "DEEPSEEK_MODEL": "kb_gate_model",
    "GATE_ACCEPT_THRESHOLD": "kb_gate_threshold",
    "INGEST_TIMEOUT_SECONDS": "kb_agent_timeout_s",
    "INGEST_MAX_TURNS": "kb_agent_max_turns",
    "LINT_MAX_TURNS": "kb_lint_max_turns",
    "SYNTHESIS_MAX_TURNS": "kb_synthesis_max_turns",
    "RETRIES_MAX": "kb_wiki_max_retries",
    "RETRY_BACKOFF_BASE_SECONDS": "kb_wiki_retry_delay_s",
    "SWEEPER_STUCK_MINUTES": "kb_stuck_minutes",
    "SYNTHESIS_DAY": "kb_synthesis_day",
    # The git remote that the wiki commits go to (specification 13.4). It can
    # hold a token: an error names it, never shows it (_shown).
    "KB_GIT_REMOTE": "kb_wiki_remote",
}
# Names whose value can hold a password or a token: named, never shown.
SECRET_NAMES = frozenset({"KB_GIT_REMOTE", "KB_WIKI_REMOTE"})
# kb's HH:MM setting -> the specification's hour and minute names.
TIME_PARTS: dict[str, tuple[str, str]] = {
    "kb_lint_time": ("LINT_HOUR", "LINT_MINUTE"),
    "kb_synthesis_time": ("SYNTHESIS_HOUR", "SYNTHESIS_MINUTE"),
}
# kb's lists of retry waits that RETRIES_MAX and RETRY_BACKOFF_BASE_SECONDS give.
DERIVED_WAITS = ("kb_source_retry_waits_s", "kb_gate_retry_waits_s")
RETRY_NAMES = ("RETRIES_MAX", "RETRY_BACKOFF_BASE_SECONDS")
# Names of the specification (and earlier names of kb) that change nothing in kb, and why.
NO_MEANING: dict[str, str] = {
    "STATE_DB": "kb keeps no SQLite state file: the state of each item is in Dagster, the data in "
                "DuckDB and LanceDB under KB_HOME",
    "POLL_INTERVAL_SECONDS": "kb has no poll loops: Dagster sensors look for work "
                             "(KB_INBOX_SENSOR_INTERVAL_S, KB_NOTIFY_SENSOR_INTERVAL_S)",
    "KB_WIKI_MAX_TRIES": "an earlier name: use KB_WIKI_MAX_RETRIES (or RETRIES_MAX), the retries after the first try",
}
# Labels of the settings that `kb status` shows with the name that it read.
LABELS: dict[str, str] = {
    "kb_gate_base_url": "gate endpoint",
    "kb_gate_model": "gate model",
    "kb_gate_threshold": "gate accept threshold",
    "kb_agent_timeout_s": "ingest timeout seconds",
    "kb_agent_max_turns": "ingest max turns",
    "kb_lint_max_turns": "lint max turns",
    "kb_synthesis_max_turns": "synthesis max turns",
    "kb_wiki_max_retries": "wiki retries",
    "kb_wiki_retry_delay_s": "retry backoff base seconds",
    "kb_stuck_minutes": "stuck minutes",
    "kb_lint_time": "lint time",
    "kb_synthesis_day": "synthesis day",
    "kb_synthesis_time": "synthesis time",
    "kb_source_retry_waits_s": "parse retry waits",
    "kb_gate_retry_waits_s": "gate retry waits",
    "kb_root": "wiki folder",
}


class SettingNameConflict(ValueError):
    """Two names of one setting hold different values."""


def _layers(env: Mapping[str, Any], file: Mapping[str, Any]) -> list[tuple[str, dict[str, str]]]:
    """The places that hold values, highest first, with upper-case names.
    An empty value counts as not set."""
    def upper(values: Mapping[str, Any]) -> dict[str, str]:
        return {str(k).upper(): str(v) for k, v in values.items() if v is not None and str(v) != ""}
    return [("the environment", upper(env)), ("the settings file", upper(file))]


def _find(layers, name: str) -> tuple[str, str] | None:
    """(value, place) of the name in the highest place that holds it."""
    for place, values in layers:
        if name in values:
            return values[name], place
    return None


def _shown(name: str, value: str) -> str:
    # A URL or a git remote can hold a password: name it, never show it.
    return name if name.endswith("_URL") or name in SECRET_NAMES else f"{name}={value!r}"


def _check_same(spec_name: str, spec: tuple[str, str], kb_name: str, kb: tuple[str, str],
                same=lambda a, b: a.strip() == b.strip(), spec_shown: str = "") -> None:
    if not same(spec[0], kb[0]):
        raise SettingNameConflict(
            f"{spec_shown or _shown(spec_name, spec[0])} (in {spec[1]}) and {_shown(kb_name, kb[0])} (in {kb[1]}) are two "
            f"names of one setting, and they differ. {spec_name} is the name of the specification, "
            f"{kb_name} is kb's name. Remove one of them, or give both the same value.")


def _whole(name: str, value: str, low: int, high: int | None = None) -> int:
    text = value.strip()
    if not text.isdigit() or int(text) < low or (high is not None and int(text) > high):
        top = f" to {high}" if high is not None else " or more"
        raise SettingNameConflict(f"{name}={value!r} is not a whole number from {low}{top}")
    return int(text)


def spec_values(env: Mapping[str, Any], file: Mapping[str, Any],
                defaults: Mapping[str, Any]) -> tuple[dict[str, str], dict[str, str]]:
    """(values, read): the values that the specification's names give, by
    kb's field name, and for each setting of LABELS the name or names that
    gave its value ("default" when none). `env` and `file` map names (any
    case) to values; `defaults` maps kb's fields to their defaults.
    Raises SettingNameConflict when two names of one setting differ."""
    layers = _layers(env, file)
    values: dict[str, str] = {}
    read: dict[str, str] = {}
    for spec_name, field in SPEC_NAMES.items():
        kb_name = field.upper()
        spec, kb = _find(layers, spec_name), _find(layers, kb_name)
        if spec and kb:
            same = (lambda a, b: a.strip().lower()[:3] == b.strip().lower()[:3]) if field == "kb_synthesis_day" else None
            _check_same(spec_name, spec, kb_name, kb, *([same] if same else []))
        if spec:
            values[field] = spec[0]
        read[field] = " and ".join(n for n, found in ((spec_name, spec), (kb_name, kb)) if found) or "default"
    for field, (hour_name, minute_name) in TIME_PARTS.items():
        kb_name = field.upper()
        hour, minute = _find(layers, hour_name), _find(layers, minute_name)
        kb = _find(layers, kb_name)
        if not (hour or minute):
            read[field] = kb_name if kb else "default"
            continue
        default_hour, default_minute = str(defaults[field]).split(":")
        composed = (f"{_whole(hour_name, hour[0], 0, 23) if hour else int(default_hour):02d}:"
                    f"{_whole(minute_name, minute[0], 0, 59) if minute else int(default_minute):02d}")
        names = " and ".join(n for n, found in ((hour_name, hour), (minute_name, minute)) if found)
        if kb:
            _check_same(names, (composed, (hour or minute)[1]), kb_name, kb,
                        same=lambda a, b: a == _hh_mm(b), spec_shown=f"{names} (the time {composed})")
        values[field] = composed
        read[field] = names + (f" and {kb_name}" if kb else "")
    retries, base = _find(layers, "RETRIES_MAX"), _find(layers, "RETRY_BACKOFF_BASE_SECONDS")
    for field in DERIVED_WAITS:
        kb = _find(layers, field.upper())
        if kb or not (retries or base):
            read[field] = field.upper() if kb else "default"
            continue
        count = _whole("RETRIES_MAX", retries[0], 0) if retries else int(defaults["kb_wiki_max_retries"])
        first = _whole("RETRY_BACKOFF_BASE_SECONDS", base[0], 1) if base else int(defaults["kb_wiki_retry_delay_s"])
        values[field] = ",".join(str(first * 2 ** n) for n in range(count))
        read[field] = " and ".join(n for n, found in zip(RETRY_NAMES, (retries, base)) if found)
    read["kb_root"] = "KB_ROOT" if _find(layers, "KB_ROOT") else "default"
    return values, read


def _hh_mm(text: str) -> str:
    """HH:MM with two digits each, as kb's validator writes it ("2:00" -> "02:00")."""
    hours, _, minutes = text.strip().partition(":")
    return f"{int(hours):02d}:{minutes}" if hours.isdigit() else text.strip()


def names_without_meaning(env: Mapping[str, Any], file: Mapping[str, Any]) -> dict[str, str]:
    """The names of NO_MEANING that are set, with the reason that they change nothing."""
    layers = _layers(env, file)
    return {name: why for name, why in NO_MEANING.items() if _find(layers, name)}


class SpecNamesSource(PydanticBaseSettingsSource):
    """The values that the specification's names give. It comes before
    kb's own names; a conflict of the two is an error (spec_values)."""

    def __init__(self, settings_cls, env_source, file_source):
        super().__init__(settings_cls)
        self.env_source, self.file_source = env_source, file_source

    def get_field_value(self, field, field_name):  # the class asks for it; __call__ does the work
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        defaults = {name: info.default for name, info in self.settings_cls.model_fields.items()}
        values, _ = spec_values(self.env_source.env_vars, self.file_source.env_vars, defaults)
        return values
