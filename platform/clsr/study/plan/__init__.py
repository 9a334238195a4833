"""What will run, without running it: a study loaded and validated, its trials resolved, fingerprinted, deduplicated, their sources checked and their cost projected."""
