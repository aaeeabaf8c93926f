"""The Batch API's services: files, batches (creation, cancelling), their states, the validation of lines."""
