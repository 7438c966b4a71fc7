"""Each role's view of the plan (``plan["roles"][ROLE]``): what a role reads, computed here.

The plan computes, the roles read (docs/decisions.md): the lists, sets and decisions a role
needs (its files with their modes and owners, its units in start order, the specs its
modules take, the package lists and markers) are built from the plan's own records by one
module per role, typed in pdnode.plan/1 (plan_schema.py) and unit-tested; the role's
``vars/main.yml`` aliases them and its templates only write them down. A module here reads
the plan dict (``Plan.as_dict()`` without ``roles``) and imports nothing of the roles.
"""
