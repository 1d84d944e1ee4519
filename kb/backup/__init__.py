"""The backup archive of the whole KB_HOME, and the checks that read an
archive as data before a restore. Above the rooms: it holds the index and
the wiki too. No room of its own: the backups job of the graph calls it."""
