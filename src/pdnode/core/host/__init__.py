"""A host against the plan, on the controller: pure parsers over what the preflight's
probes print (`facts.py`), the preflight's judgement (`preflight.py`; its port judgement is
node/preflight.py's, which the deploy runs on the host too), the GPU/NUMA/NIC placement
view (`placement.py`) and the placement advice per engine instance (`placement_advice.py`).
It imports plan/, rules/, inventory/, core's base and node/; nothing of planner/ or
change/."""
