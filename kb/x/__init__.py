"""Reading X: the GraphQL answers, the browser that captures them, the raw store."""
