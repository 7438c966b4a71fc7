"""What a role decides from the host's own facts (the driver's packages and pins, the Mooncake
build that fits), as typed functions the roles call through filters (plugins/filter/roles.py).
What a role reads from the plan alone is in pdnode.core.plan.roles."""
