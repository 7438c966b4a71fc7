"""The plan: inventory values -> `Plan` (`build.py`) and its contract `pdnode.plan/1`
(`schema.py`), and what is derived with it: which host runs what (`cluster.py`), the KV
hand-off's path (`kv_path.py`), the paths the deploy writes (`managed.py`), the alert rules
and scrape configuration (`monitoring.py`); `load.py` is the inventory -> plan helper every
command uses. It imports rules/, inventory/, core's base and node/; nothing of host/,
planner/ or change/."""
