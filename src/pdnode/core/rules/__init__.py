"""The rules over a host's values, each a pure judgement: the value patterns and the role
variables' rules (`values.py`), the argument tables (`argtable.py`), the engine instances
(`instances.py`), ports (`ports.py`), whether the weights fit (`capacity.py`), SGLang's and
the router's own validation (`sglang_judge.py`, `router_judge.py`), what opens a door
(`guards.py`), the disaggregation settings (`disagg.py`), which Mooncake wheel fits a host
(`mooncake_select.py`) and every rule's stable id (`catalogue.py`). It imports inventory/
(the field table), core's base and node/; nothing of plan/ or the rooms above it."""
