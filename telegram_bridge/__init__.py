"""The Telegram bridge: the bot `kb-bot` (intake, type detection, inbox
writer, replies, commands) and the notifications that Dagster sends back.

The bot is intake only. It writes inbox items; the inbox sensor turns each
one into a partition of `sources`, and Dagster does the work. The bot never
opens DuckDB: it reads item state from the Dagster instance.
"""
