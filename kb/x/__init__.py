"""Reading X: the GraphQL answers, the browser and the capture that keeps them,
the raw store, and normalize (the rows and the SQL of the bookmark tables)."""
