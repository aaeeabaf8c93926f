"""The OpenAI-shaped client errors billing's APIs raise: imported in this one place.

(They live in inference.errors today and are moving to common.errors, which
billing may import; re-point this line then.)
"""

from inference.errors import InvalidRequest, NotFound  # noqa: F401
