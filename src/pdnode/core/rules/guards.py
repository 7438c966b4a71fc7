"""What a node description may not do unless the operator says so: hand the deploy a file
that is not one key, or turn on an argument that opens a door (called by
pdnode.core.plan.build.build_plan; docs/security.md).

- ``pdnode_api_key_file`` is copied to every host of the layout and owned by the service
  user: it must hold exactly one key (pdnode.node.secrets.key_problem). A private key, a
  credentials file or anything else is refused in one line that never quotes it.
- An engine or router argument that opens a listener beyond loopback, serves without the
  API key, runs uploaded code, routes to workers the plan does not list, or sends data
  or loads weights over the network is refused unless ``pdnode_allow_exposing_args``
  names it; then it passes with a warning.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...node.secrets import key_file_problem

# (rule id, field, value, rule, fix): the plan checker's error() and warn()
Report = Callable[[str, str, Any, str, str], None]
ALLOW = "pdnode_allow_exposing_args"


def check_api_key_file(error: Report, value: Any, root: Path) -> None:
    """The controller file pdnode_api_key_file names (relative to the repository root, as
    the deploy resolves it). A file that is not there yet is the deploy's to report (the
    pd_services role asserts it before it writes anything): inventories are checked on
    machines that do not hold the keys."""
    if not isinstance(value, str) or not value:
        return
    path = Path(value) if value.startswith("/") else root / value
    if not os.path.lexists(path):
        return
    problem = key_file_problem(str(path))
    if problem:
        error("api-key-file-one-key", "pdnode_api_key_file", value,
              f"{problem} (the deploy copies it to every host, owned by the service user; its content is not shown)",
              "point pdnode_api_key_file at a file holding only the key: 16-4096 printable ASCII characters "
              "without spaces, e.g. `openssl rand -hex 32 > FILE; chmod 600 FILE`")


# --- arguments that open a door --------------------------------------------------------------
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_LOCAL_SCHEMES = ("ipc://", "inproc://", "unix://", "unix:")


def deploy_key_file_problem(path: str) -> str:
    """'' when PATH (the controller's pdnode_api_key_file, as the deploy resolved it) is a
    readable, non-empty file, else one line naming it and the fix. The deploy asks before it
    writes anything (roles/pd_services/tasks/configure.yml): units that require a key that
    never arrives would fail every start. What the key holds is check_api_key_file's rule."""
    if not os.path.exists(path):
        what = "missing"
    elif not os.path.isfile(path):
        what = "not a regular file"
    elif not os.access(path, os.R_OK):
        what = f"not readable by {os.environ.get('USER', 'this user')}"
    elif os.path.getsize(path) == 0:
        what = "empty"
    else:
        return ""
    return (f"pdnode_api_key_file (pd_services_api_key_file) is {json.dumps(path)}, which is {what} on the "
            'controller; fix: write the key into that file (one line, mode 0600) or set pdnode_api_key_file to "" '
            "for no key")


def _host_of(endpoint: str) -> str:
    rest = _SCHEME.sub("", endpoint.strip())
    rest = rest.split("/", 1)[0].rpartition("@")[2]
    if rest.startswith("["):
        return rest[1:].split("]", 1)[0]
    return rest.rsplit(":", 1)[0] if rest.count(":") == 1 else rest


def _is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name, '*', an interface name (ZMQ) or a wildcard: beyond loopback


def _endpoints(value: Any) -> list[str]:
    """Every endpoint string in VALUE (a string, a list, or a JSON list in a string)."""
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            try:
                return _endpoints(json.loads(text))
            except ValueError:
                return [text]
        return [text] if text else []
    if isinstance(value, (list, tuple)):
        return [e for item in value for e in _endpoints(item)]
    return [str(value)] if value is not None else []


def _remote(value: Any) -> bool:
    """Some endpoint in VALUE is neither local IPC nor a loopback address."""
    return any(not e.startswith(_LOCAL_SCHEMES) and not _is_loopback(_host_of(e)) for e in _endpoints(value))


def _set(value: Any) -> bool:
    return value not in (None, False, "", [], {}, 0) and not (isinstance(value, str) and value.lower() == "off")


def _load_publish(value: Any) -> bool:
    # 'auto' derives its address from --kv-events-config, which must bind a wildcard host
    return _set(value) and (str(value).strip().lower() == "auto" or _remote(value))


def _kv_events(value: Any) -> bool:
    if not _set(value):
        return False
    try:
        cfg = json.loads(value) if isinstance(value, str) else value
    except ValueError:
        return True  # where it would bind cannot be told: SGLang's default is tcp://*:5557
    if not isinstance(cfg, dict):
        return True
    return _remote(cfg.get("endpoint", "tcp://*:5557")) or _remote(cfg.get("replay_endpoint") or [])


# name -> (does this value open the door?, what it opens). From SGLang 0.5.23's ServerArgs
# (sglang/srt/arg_groups/fields/*.py and where each is used), sglang-router 0.3.2 and
# smg 1.13.0 (router_args.py, docs/smg.md).
Door = tuple[Callable[[Any], bool], str]
ENGINE_DOORS: dict[str, Door] = {
    "decoupled_spec_bind_endpoint": (_remote, "binds a ZMQ listener (decoupled speculative decoding) beyond loopback"),
    "decoupled_spec_connect_endpoints": (_remote, "connects to speculative-decoding peers on other hosts"),
    "kv_events_config": (_kv_events, "publishes KV-cache events on a ZMQ listener beyond loopback (SGLang's default "
                                     "endpoint is tcp://*:5557)"),
    "load_publish_endpoint": (_load_publish, "publishes the load on a ZMQ listener beyond loopback"),
    "otlp_traces_endpoint": (_remote, "exports request traces to another host"),
    "encoder_urls": (_remote, "sends requests' media to encoder servers on other hosts"),
    "encoder_register_urls": (_remote, "registers with encoder servers on other hosts"),
    "tool_server": (_set, "lets the model call tool servers (MCP, or the demo's web browsing) off the node"),
    "grpc_mode": (_set, "serves SGLang's gRPC API, which checks no API key"),
    "smg_grpc_mode": (_set, "serves SGLang's gRPC API, which checks no API key"),
    "grpc_port": (_set, "serves SGLang's gRPC API, which checks no API key"),
    "remote_instance_weight_loader_seed_instance_ip": (_set, "loads the weights from another instance over the "
                                                             "network"),
    "remote_instance_weight_loader_seed_instance_service_port": (_set, "loads the weights from another instance "
                                                                       "over the network"),
    "remote_instance_weight_loader_send_weights_group_ports": (_set, "opens ports that send this instance's weights "
                                                                     "to other instances"),
    "remote_instance_weight_loader_start_seed_via_transfer_engine": (_set, "serves this instance's weights to other "
                                                                           "instances through the transfer engine"),
}
# pdnode_model_load_format values (load_format itself is the plan's): weights from elsewhere.
REMOTE_LOAD_FORMATS = {"remote": "loads the weights from a remote store (model_path is its URL)",
                       "remote_instance": "loads the weights from another running instance over the network"}
ROUTER_DOORS: dict[str, Door] = {
    "mini_lb": (_set, "replaces the router with sglang-router's Python mini load balancer, which checks neither the "
                      "API key nor the admin key"),
    "enable_mesh": (_set, "turns on smg's mesh: a listener for peers, and the /ha/* routes (/ha/shutdown among them) "
                          "for every client"),
    "enable_wasm": (_set, "lets smg run WebAssembly middleware uploaded through /wasm inside the router"),
    "service_discovery": (_set, "routes to the workers the router discovers in Kubernetes, not the plan's"),
    "otlp_traces_endpoint": (_remote, "exports request traces to another host"),
    "rdma_listen_ip": (_remote, "binds smg's RDMA media listener beyond loopback"),
}


def _router_door(key: str) -> Door | None:
    if key in ROUTER_DOORS:
        return ROUTER_DOORS[key]
    if key.startswith("mesh_"):  # smg's mesh listener and peers (mesh_host, mesh_port, mesh_peer_urls, ...)
        return _set, "configures smg's mesh (a listener for peers; with it the /ha/* routes, /ha/shutdown among them)"
    return None


DOOR_NAMES = frozenset(ENGINE_DOORS) | frozenset(ROUTER_DOORS) | {"load_format", "mesh_*"}


def allowed(error: Report, value: Any) -> set[str]:
    """The names pdnode_allow_exposing_args allows (an unknown name is an error: a typo
    would allow nothing and say nothing)."""
    if not isinstance(value, list):
        return set()
    names: set[str] = set()
    for i, name in enumerate(value):
        if not isinstance(name, str) or (name not in DOOR_NAMES and not name.startswith("mesh_")):
            error("exposing-allow-known", f"{ALLOW}[{i}]", name,
                  "is not an argument the plan refuses as opening a door",
                  "list argument names from docs/security.md (\"What opens a door\"), e.g. otlp_traces_endpoint")
        else:
            names.add(name)
    return names


_USERINFO = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://)[^/?#@\s]*@")


def shown(value: Any) -> Any:
    """VALUE as a problem line may show it: credentials in URLs (scheme://user:pass@) hidden."""
    if isinstance(value, str):
        return _USERINFO.sub(r"\1<hidden>@", value)
    if isinstance(value, list):
        return [shown(v) for v in value]
    if isinstance(value, dict):
        return {k: shown(v) for k, v in value.items()}
    return value


def _door(error: Report, warn: Report, allow: set[str], field: str, name: str, value: Any, what: str) -> bool:
    """Report one door; True when it is refused."""
    if name in allow or (name.startswith("mesh_") and "mesh_*" in allow):
        warn("exposing-arg-allowed", field, shown(value), f"opens a door: {what}; allowed by {ALLOW}",
             f"remove it unless the node needs it (and drop it from {ALLOW})")
        return False
    error("exposing-arg", field, shown(value), f"opens a door: {what}",
          f"remove it, or add {name} to {ALLOW} to accept the exposure")
    return True


def check_engine_doors(error: Report, warn: Report, allow: set[str], fields: list[tuple[str, dict[str, Any]]],
                       load_format: Any, reported: set[str]) -> None:
    """Each instance's extra_args (FIELDS: (field of extra_args, the mapping)) and
    pdnode_model_load_format; REPORTED: fields already refused for another cause."""
    if isinstance(load_format, str) and load_format in REMOTE_LOAD_FORMATS and "pdnode_model_load_format" not in reported:
        _door(error, warn, allow, "pdnode_model_load_format", "load_format", load_format, REMOTE_LOAD_FORMATS[load_format])
    for where, extra in fields:
        for key, value in extra.items():
            field = f"{where}.{key}"
            if key in ENGINE_DOORS and field not in reported and ENGINE_DOORS[key][0](value):
                _door(error, warn, allow, field, key, value, ENGINE_DOORS[key][1])


def router_door(error: Report, warn: Report, allow: set[str], key: str, value: Any) -> bool:
    """One pdnode_router_extra_args entry; True when it is refused as a door."""
    door = _router_door(key)
    if door is None or not door[0](value):
        return False
    return _door(error, warn, allow, f"pdnode_router_extra_args.{key}", key, value, door[1])
