"""A trial's configuration as plain pydantic models, below every layer that uses it: the sections
(``trial``), the encoder's ``model`` section (``model``), custom evaluation sets (``custom_task``), the
step arithmetic (``steps``) and the methods a study may name (``methods``). Nothing here imports
torch (a test holds it), so reading and checking a study's own sections does not pay for it."""
