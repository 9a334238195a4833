"""``python -m clsr.cli``: the ``platform`` command (the study driver's child is started this way)."""

from clsr.cli import run

if __name__ == "__main__":
    run()
