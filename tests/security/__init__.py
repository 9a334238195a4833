"""The threat model as tests: each attack on a rule of docs/reliability.md reproduced and refused."""
