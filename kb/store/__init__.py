"""The stores on disk that every room shares: the DuckDB file and its schema,
the writer lock, atomic and private files, and the backup archive with its
checks. No room of its own: no asset group writes here alone."""
