"""A study, from the file a researcher wrote to the record they publish from. Its subpackages are the
pipeline, each importing only those below it (``importlinter`` contracts in ``pyproject.toml``):

``run``      executes a plan on Ray Tune: the driver, one trial, searches, confirm, adaptive seeds
``analyse``  reads the record back: the report, the results frame, compare, promote
``record``   the MLflow record as policy: the lease, the parent run's life, retention
``control``  the line between the study command and its driver: the link, interrupts
``plan``     what will run, pure: loading and validating, resolved trial documents, fingerprints
``stats``    seed statistics, verdicts, effects, Pareto fronts (a leaf)
``spec``     what the user wrote: the schema, safe YAML, dotted keys, paths, the generated reference
"""
