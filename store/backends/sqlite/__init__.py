"""The embedded backend: one SQLite file per descriptor folder under a store root."""
