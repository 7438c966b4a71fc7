"""The controller's computation: inventory -> validated plan (rules, ports, capacity,
placement, the KV path, the planner's model). Reads no host; imports pdnode.node only."""
