"""What the user wrote: the study file's schema, its safe YAML, dotted keys, paths, and the JSON Schema and reference generated from them."""
