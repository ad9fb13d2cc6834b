"""What an execution leaves for its caller: captured streams and their previews, attachments
and the blob store, artifacts, streaming, and reading stored bytes back (paging, pattern
search). Internal."""
