"""The Batch API's models, one module per concern."""

from batches.models.batches import Batch, BatchLine
from batches.models.files import StoredFile

__all__ = ["Batch", "BatchLine", "StoredFile"]
