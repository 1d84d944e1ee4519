"""`kb-bot`: starts the Telegram bot with a reader of the Dagster instance.

The bot (telegram_bridge/bot.py) must not import Dagster or the graph, so
this app, which may, builds the state reader and hands it to the bot.
"""

from __future__ import annotations

from kb.apps.quick_exit import skip_final_collection
from kb.settings import Settings, get_settings
from kb.telegram.item_states import StateReader
from kb_assets.source_states import state_reader


def dagster_reader(settings: Settings) -> StateReader:
    """The state reader that `kb-bot` gives the bot."""
    return state_reader(settings.dagster_home)


def main() -> int:
    from kb.apps.lifeline import watch_lifeline

    watch_lifeline()  # the bot stops when the kb up that started it dies
    # The bot imports aiogram (seconds of CPU: benchmarks/figures_from_comments.md)
    # only here, so that a process that wants dagster_reader() alone does not pay for it.
    from telegram_bridge.bot import serve

    from kb.store.private_files import private_process

    skip_final_collection()  # aiogram's and Dagster's objects: no last collection at SIGTERM
    private_process()  # the inbox holds the owner's messages (kb/store/private_files.py)
    settings = get_settings()
    return serve(settings, dagster_reader(settings))


if __name__ == "__main__":
    # `kb up` starts the bot as `python -m kb.apps.bot_runner`.
    raise SystemExit(main())
