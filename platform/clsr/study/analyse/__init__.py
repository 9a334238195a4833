"""Read-only over the record: the report and its renderers, the results frame, compare, promote."""
