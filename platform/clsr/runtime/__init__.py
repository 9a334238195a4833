"""The ranks and gathers of a distributed step, below both the methods and the trainer that use them."""
