"""python -m pdnode.verify --plan PLAN.json [options]: see pdnode.verify.cli."""

import sys

from .cli import main_plan

sys.exit(main_plan())
