"""Clusters: a loopback cluster with real services for trying the cluster path on one machine, and the
checks a study makes of the cluster and storage it is about to use."""
