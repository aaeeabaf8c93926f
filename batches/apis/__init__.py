"""The Batch API's views: `/v1/files` (files.py) and `/v1/batches` (batches.py). Thin: parse, call a service
or a selector, render (batches.payloads). Every method needs the key's `inference` scope, as completions do."""
