"""The guards that every room uses against hostile input: the fetch guard
(which addresses a fetch may reach), the binds of a bubblewrap room, and the
secret scan."""
