"""`pdnode plan`'s computation: the performance model and its fit to measurements
(`model.py`), the layouts of a host's GPUs, each judged by building its plan
(`layouts.py`), and aiconfigurator's prior estimate (`prior.py`, the one module that
imports it). It imports the rooms below it (host/, plan/, rules/, inventory/), core's base
and node/; nothing of change/."""
