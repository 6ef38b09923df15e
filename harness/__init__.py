"""The reliability harness (`make harness`): real daphne, real PostgreSQL and Redis on loopback, faults
injected on purpose, client histories checked against the database. ``python -m harness``."""
