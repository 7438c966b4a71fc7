"""What the monitoring role writes and reads back: the alert rules and the scrape
configuration rendered from the plan (pdnode.core.plan.monitoring), and node_state's
questions about the four files (their SHA-256 and mode) and the rules directory. The
two /etc/default command lines are the role's templates (they carry its role values),
rendered by the role and handed in as text."""

from __future__ import annotations

import hashlib
import posixpath
from typing import Any

from pdnode.core.plan import monitoring


def files(plan: dict[str, Any], *, node_exporter: str, dcgm_exporter: str, scrape_interval: str,
          config_file: str, prometheus_default: str, node_exporter_default: str) -> dict[str, Any]:
    """The rules and the scrape configuration (text), and the node_state specs of every file
    the role's Prometheus tasks write (the very strings they write, mode 0644) and of the
    rules directory (0755). Raises what pdnode.core.plan.monitoring raises on a bad plan."""
    rules = monitoring.render_alert_rules(plan)
    scrape = monitoring.render_scrape_config(plan, node_exporter=node_exporter, dcgm_exporter=dcgm_exporter,
                                             scrape_interval=scrape_interval)
    rules_file = monitoring.role_facts(plan)["rules_file"]
    written = [("/etc/default/prometheus", prometheus_default),
               ("/etc/default/prometheus-node-exporter", node_exporter_default),
               (rules_file, rules), (config_file, scrape)]
    return {
        "rules": rules, "scrape_config": scrape,
        "state_files": [{"path": path, "sha256": hashlib.sha256(text.encode()).hexdigest(), "mode": "0644"}
                        for path, text in written],
        "state_directories": [{"path": posixpath.dirname(rules_file), "mode": "0755"}],
    }
