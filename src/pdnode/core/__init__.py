"""The controller's computation: inventory -> plan, and what is computed from it
(docs/architecture.md). Its rooms, top first, each importing only from the rooms below it
(the contract "core's rooms" in pyproject.toml): `planner/`, `host/`, `plan/`, `change/`
(pure computations of a change, which the plan reads), `rules/`, `inventory/`; at core's top, `exits.py` and
`resources.py`, the shared base that imports nothing of core. Callers import a module by
its full path (`pdnode.core.plan.build`); no room re-exports another's names."""
