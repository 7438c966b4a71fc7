"""The releases this pdnode installs unless the inventory pins others: the one definition.

Every other place reads these: the site variables' defaults (pdnode.core.inventory.fields), the
launcher's and the stand-in's SGLang version, the Mooncake build choice, the argument
tables' file names, and the release venv's name in the plan. Role defaults hold none: the
playbooks pass the plan's values. What cannot import Python (pyproject's toolchain pins,
the conformance environment, the example inventories' versions.yml, the Mooncake
scenario's check) is compared with these by tests/test_versions.py.

Standard library only: the host programs import it.
"""

SGLANG = "0.5.23"
SGLANG_ROUTER = "0.3.2"  # sglang-router, the last of its line (docs/smg.md)
SMG = "1.13.0"  # the router's maintained successor
ROUTER_PACKAGE = "smg"
MOONCAKE = "0.3.13.post1"  # Mooncake's CUDA 12 and non-CUDA builds
MOONCAKE_CUDA13 = "0.3.14"  # the CUDA 13 build's own release line
# The model's download client in the release venv (pdnode.node.model_fetch) and on the
# controller (`pdnode model lock`; pyproject.toml pins the same): one SGLang 0.5.23 accepts.
HUGGINGFACE_HUB = "1.33.0"
