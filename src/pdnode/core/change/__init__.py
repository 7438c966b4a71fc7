"""Changing a running node: what a planned restart or upgrade costs on the layout
(`cost.py`) and the upgrade's decisions, the host's release record and the upgrade report
(`upgrade.py`; its command line is commands/upgrade.py, which playbooks/upgrade.yml
runs). It imports the rooms below it (host/, plan/, rules/, inventory/), core's base and
node/; nothing of planner/."""
