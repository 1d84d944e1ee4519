"""The models that kb uses, by their published names (catalog.py), and where
kb finds their checked files (files.py)."""
