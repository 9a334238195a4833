"""What both the methods and the trainer need, below both so that neither imports the other in a circle:
the ranks and gathers of a distributed step (``distributed``) and the plan of a trial's steps
(``steps``). ``clsr.train`` imports ``clsr.methods``; both import this."""
