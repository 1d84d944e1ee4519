"""The index: chunks, the local embedder, the LanceDB client, folders, search, the reranker, reading."""
