"""The wire-level PostgreSQL proxy now lives in ``fencing.testing.pgproxy`` (the handler test
kit injects its lost COMMIT replies with it, and ``fencing`` may not import ``ops``); this
name stays for the tests and tools that import it from here."""

from fencing.testing.pgproxy import Action, PgProxy, Rule, rewrite_dsn

__all__ = ["Action", "PgProxy", "Rule", "rewrite_dsn"]
