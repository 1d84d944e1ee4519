"""Enrichment: the text behind links (extraction), photos (vision), videos (transcripts), translation."""
