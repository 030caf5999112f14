"""`python -m volfsm.analytics serve|report|export ...` (the same as `volfsm analytics ...`)."""

from volfsm.analytics.cli import app

if __name__ == "__main__":
    app(prog_name="volfsm analytics")
