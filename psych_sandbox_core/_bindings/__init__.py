"""Host tools a program calls: providers, the catalogue the model reads, and the run log the
per-Run budget is read from. Internal."""
