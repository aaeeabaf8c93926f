"""The Batch API: tenants' files (`/v1/files`) and batches of requests run from them (`/v1/batches`)."""
