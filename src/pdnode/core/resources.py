"""Where pdnode finds its files, in a checkout and installed alike. The one place that knows.

- Package data: `pdnode/data/`, and what the controller reads from the checkout's top
  level, shipped in the wheel under the same path below `pdnode/` (pyproject.toml: the
  site-wide `templates/`, the demo model's tokenizer, the pd_services role's defaults).
  `resource("templates", ...)` is the installed package's copy when there is one, else
  the checkout's.
- The node programs the roles copy to hosts (drain, collect, the upgrade probe, the whole
  package as a bundle) are modules of the imported package: `module_file("pdnode.node.drain")`.
- The playbooks `pdnode` runs (collect, bench): a checkout's `playbooks/NAME.yml` with its
  ansible.cfg, else the installed collection's `pdnode.sglang_pd.NAME`.
- The controller's directory: what the inventory's relative paths (a wheelhouse, a key
  file, a model) are relative to, and where runs keep their reports (`.cache/verify/`,
  ...). A checkout's root; with the installed package and collection (never written
  to), the directory pdnode or ansible-playbook runs in.
"""

from __future__ import annotations

import importlib.util
import os
from importlib.resources import files
from pathlib import Path

# The package's own directory (this is pdnode/core/resources.py), and the checkout's root
# when it is run from one (src/pdnode -> the repository).
_PACKAGE = Path(__file__).resolve().parents[1]
_CHECKOUT = _PACKAGE.parents[1]


COLLECTION = "pdnode.sglang_pd"  # galaxy.yml's namespace.name


def from_checkout() -> bool:
    """Is this pdnode a checkout's src/pdnode (not an installed wheel)?"""
    return (_CHECKOUT / "pyproject.toml").is_file() and (_CHECKOUT / "playbooks").is_dir()


def user_cache_dir() -> Path:
    """pdnode's cache of the user who runs it ($PDNODE_CACHE_DIR, else
    $XDG_CACHE_HOME/pdnode or ~/.cache/pdnode): the validator, its verdicts, the models'
    config files."""
    base = os.environ.get("PDNODE_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "pdnode")
    return Path(base)


def controller_dir() -> Path:
    """The controller's directory for pdnode's commands and plan (see above)."""
    return _CHECKOUT if from_checkout() else Path.cwd()


def playbook(name: str) -> tuple[str, dict[str, str]]:
    """What ansible-playbook runs for the playbook NAME, and the environment it needs."""
    if from_checkout():
        return str(_CHECKOUT / "playbooks" / f"{name}.yml"), {"ANSIBLE_CONFIG": str(_CHECKOUT / "ansible.cfg")}
    return f"{COLLECTION}.{name}", {}


def resource(*parts: str) -> Path:
    """The package data file or directory at PARTS ("templates", "prometheus", ...)."""
    packaged = Path(str(files("pdnode").joinpath(*parts)))
    if packaged.exists():
        return packaged
    in_checkout = _CHECKOUT.joinpath(*parts)
    if in_checkout.exists():
        return in_checkout
    raise FileNotFoundError(f"pdnode's {'/'.join(parts)} is in neither the installed package ({packaged}) "
                            f"nor a checkout ({in_checkout}): reinstall pdnode")


def module_file(module: str) -> Path:
    """The source file of MODULE (a dotted name under pdnode) as imported here."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        raise ModuleNotFoundError(f"{module} is not a module of the installed pdnode package")
    return Path(spec.origin)


def controller_root(playbook_dir: str) -> Path:
    """The controller's directory for a run of the playbooks in PLAYBOOK_DIR (see above):
    the checkout's root for the checkout's playbooks; for the installed collection's (it
    holds MANIFEST.json, not galaxy.yml) and for anyone's own, the current directory."""
    root = Path(playbook_dir).resolve().parent
    if (root / "galaxy.yml").is_file() and (root / "src" / "pdnode").is_dir():
        return root
    return Path(os.getcwd())


def controller_path(path: str | None, playbook_dir: str) -> str:
    """An inventory path setting (a wheelhouse, a key file) as the host's roles get it:
    unset stays empty, an absolute path stays, a relative one is under the controller's
    directory for the playbooks in PLAYBOOK_DIR."""
    return str(controller_root(playbook_dir) / path) if path else ""  # absolute stays (pathlib)
