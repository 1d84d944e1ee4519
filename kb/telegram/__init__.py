"""The Telegram inflow: the Bot API, the inbox, parsers, the quality gate, replies and notices."""
