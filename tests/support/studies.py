"""Settings of the studies the tests run."""

# STS-B dev and test, STS16 test: the smoke study's seeded sample of each
SMOKE_STS_PAIRS = 300
