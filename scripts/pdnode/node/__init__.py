"""Programs that run on the hosts (launcher, readiness, watchdog, drain, the collector,
the bench counters, the upgrade's prober, the router's launcher): standard library only,
each runnable with the host's or the release venv's Python. Imports nothing else of pdnode."""
