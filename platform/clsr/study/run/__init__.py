"""A plan executed on Ray Tune: the driver, one trial, searches, confirmation, adaptive seeds, progress, Tune's state."""
