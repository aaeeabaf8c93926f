"""The OpenAI-shaped client errors billing's APIs raise (common.errors), imported in one place."""

from common.errors import InvalidRequest, NotFound  # noqa: F401
