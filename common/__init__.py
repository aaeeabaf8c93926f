"""What every app may import: the error hierarchy (OpenAI error shape, DRF handler)."""
