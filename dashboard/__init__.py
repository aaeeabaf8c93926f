"""The tenant dashboard (/dashboard/) and the operator console (custom views in the admin).

Reads only: billing's rollups, ledger, limits and invoices, the queue's heartbeats and depths.
Nothing imports this app (import-linter's top layer).
"""
