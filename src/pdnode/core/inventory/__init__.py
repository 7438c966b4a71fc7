"""Reading an inventory: every host's variables through ansible-core's own managers
(`read.py`), the limits on its files checked before Ansible reads them (`limits.py`), the
guard that runs none of its code (`guard.py`), the values reading left uncomputed
(`deferred.py`), the one table of site variables (`fields.py`) and the verification's
threshold table (`thresholds.py`, which fields.py imports). The lowest room of core: it
imports node/ and core's base (`exits`, `resources`), nothing of the other rooms."""
