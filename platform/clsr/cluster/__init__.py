"""Clusters: the checks a study makes of the cluster and storage it is about to use, MLflow's logins, a
SLURM job's Ray nodes and batch script, free ports. The loopback cluster (real services on one machine,
``platform cluster up``) runs from a source checkout: ``benchmarks/clsr_bench/loopback.py``."""
