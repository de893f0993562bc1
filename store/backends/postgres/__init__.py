"""The server backend: one PostgreSQL schema per descriptor, listed in a registry table."""
