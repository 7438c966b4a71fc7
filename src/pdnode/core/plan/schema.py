"""pdnode.plan/1: the shape of the plan every consumer reads.

`Plan.as_dict()` is the contract between the controller and everything downstream: the
roles (through the ``pdnode_plan`` filter), the verifier, collect, the bench counters,
the upgrade, the runbooks and the monitoring rules. These records say what it holds; the
JSON Schema in ``data/pdnode.plan-1.schema.json`` is exported from them
(``python -m pdnode.core.plan.schema --write``; tests/test_plan_schema.py keeps it fresh
and validates the plan of every example inventory against it with the jsonschema
package). A change of shape that breaks a reader is a new version, ``pdnode.plan/2``.

Standard-library typing only: the export asks pydantic (a development dependency) to turn
these records into JSON Schema, so the runtime needs neither.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Literal, NotRequired, TypedDict

from ..inventory.fields import FIELDS

from ...node.plan_file import SCHEMA_ID  # one definition: the host readers check it
SCHEMA_FILE = Path(__file__).resolve().parents[2] / "data" / "pdnode.plan-1.schema.json"

Role = Literal["prefill", "decode", "router"]
KvPath = Literal["nvlink", "rdma", "tcp"]


class Install(TypedDict):
    """Where the release lives on the host and what it runs as."""
    user: str
    home: str  # the service user's home
    root: str
    venv: str  # the engines' release venv
    python: str
    router_venv: str  # the router's own venv: a release that keeps the router keeps its process
    router_python: str
    config_dir: str
    prefix: str
    target: str
    state_directory: str  # systemd StateDirectory= of every unit
    applied_dir: str  # digests of what the running services were started with
    cuda_major: int  # the CUDA major of the driver branch (Mooncake's build follows it)
    engine: Literal["sglang", "sim"]
    router_package: Literal["smg", "sglang-router"]
    router_requirement: str
    admin_key_path: str
    api_key_path: str
    kv_check_tool: str


class PairProbe(TypedDict):
    """The timer on the router's host that sends one request to every prefill-decode pair."""
    service: str  # the oneshot unit the timer starts
    timer: str
    interval_s: int
    textfile_dir: str  # its StateDirectory=, read by the node exporter's textfile collector
    spec_file: str
    spec: dict[str, Any]  # pdnode.node.pair_probe's (engines, api_key_file, timeout_s, out)
    exec: list[str]


class Service(TypedDict):
    """One systemd service of this host: an engine instance or the router."""
    id: str
    name: str
    role: Role
    host: str
    unit: str
    url: str
    config: str  # its JSON (ServerArgs or the router's arguments)
    env_file: str
    args: dict[str, Any]  # argument names as SGLang / the router package spell them
    environment: dict[str, str]
    exec: list[str]  # the argv systemd runs
    ready: list[str]  # URLs its readiness gate waits for
    gpus: list[int]
    upholds: list[str]
    bound_to: str | None  # the unit this one restarts with (docs/decisions.md)
    restart_delay_s: int | None
    bootstrap_port: NotRequired[int]  # prefill only
    metrics_url: NotRequired[str]  # router only
    live_args: NotRequired[list[str]]  # router only: args changed through its admin API, not a restart
    # router only: what its unit runs once it is ready (its worker list made the plan's),
    # and the spec that reads (pdnode.node.drain's: key file names, never keys)
    post_start: NotRequired[list[str]]
    reconcile_spec_file: NotRequired[str]
    reconcile_spec: NotRequired[dict[str, Any]]
    # router only, unless pdnode_pair_probe_interval_s is 0: the per-pair probe its host
    # runs on a timer (pdnode.node.pair_probe)
    pair_probe: NotRequired[PairProbe]


class ClusterEngine(TypedDict):
    id: str
    role: Literal["prefill", "decode"]
    unit: str
    url: str
    address: str
    hosts: list[str]
    bootstrap_port: NotRequired[int]


class ClusterHost(TypedDict):
    address: str
    services: list[str]


class ClusterRouter(TypedDict):
    host: str
    url: str


class KvCheck(TypedDict):
    """One Mooncake transfer check the verifier runs (a distinct GPU pair)."""
    pair: str
    src_gpu: int
    dst_gpu: int
    args: list[str]


class Kv(TypedDict):
    """How KV moves from prefill to decode, and what it costs (docs/kv-path.md)."""
    backend: str
    path: KvPath
    why: str
    gb_s: float
    source: str
    floor_gb_s: float
    floor_source: str
    floor_from_path: bool
    prompt_tokens: int
    bytes_per_token: int | None
    bytes_source: str
    handoff_s: float | None
    checks: list[KvCheck]


class Cluster(TypedDict):
    """Every host of the layout and every engine on it; on one host, this host."""
    multi_host: bool
    hosts: dict[str, ClusterHost]
    engines: dict[str, ClusterEngine]
    router: ClusterRouter
    kv: Kv


class Firewall(TypedDict):
    enabled: bool
    peers: list[str]
    tcp_ports: list[int]
    tcp_port_ranges: list[list[int]]
    public_tcp_ports: list[int]


class ManagedPath(TypedDict):
    """A path the deploy's roles write (pdnode.core.plan.managed), as they write it."""
    path: str
    kind: Literal["directory", "config", "env", "unit", "drop-in", "record", "state", "secret", "marker"]
    mode: str  # octal, as the roles give it
    owner: str
    group: str
    role: Literal["sglang", "pd_services"]  # the role that writes it
    # what a re-run of the deploy restores when it drifted
    restores: list[Literal["content", "mode", "owner", "group", "presence"]]


# The settings are the validated pdnode_* values with defaults filled in: their types are
# the field table's (pdnode.core.inventory.fields), not a second list.
_KIND_TYPES: dict[str, Any] = {
    "int": int, "float": float, "str": str, "bool": bool, "int_list": list[int], "str_list": list[str],
    "dict": dict[str, Any], "str_or_none": str | None, "int_or_none": int | None, "float_or_none": float | None,
    "instance_list": list[dict[str, Any]],
}
Settings = TypedDict("Settings", {f.name: _KIND_TYPES[f.kind] for f in FIELDS})  # type: ignore[misc]


class Owned(TypedDict):
    """A path with the mode and owners a role gives it."""
    path: str
    mode: str
    owner: str
    group: str


class RoleFile(TypedDict):
    """A file as the pd_services_files module writes it: its content, or the role's template
    that renders it (for service ``service``)."""
    path: str
    mode: str
    owner: str
    group: str
    kind: Literal["config", "env", "unit", "drop-in", "state"]
    roles: list[str] | None  # the services that read it (a change restarts them); None: systemd does
    unit: bool
    validate: list[str] | None  # argv run on the candidate ("%s"), no shell
    digest: str | None  # what counts in the restart decision instead of the content
    content: str | None
    template: str | None
    service: str | None
    header: bool  # content given: the ansible_managed comment goes before it (role_files)
    converged: str | None  # the content once the handlers have run (the layout record after its change's steps)


class SecretFile(TypedDict):
    """The API key's file; its content stays a lookup of the role (a no_log option)."""
    path: str
    mode: str
    owner: str
    group: str
    roles: list[str]
    validate: list[str]


class ServiceInput(TypedDict):
    """A file another task installs that services read (a path or a glob)."""
    path: str
    roles: list[str]


class ServiceView(TypedDict):
    """What a service's unit, environment file and drop-ins write."""
    id: str
    role: Role
    engine: bool
    unit: str
    stem: str  # the unit's name without .service (SyslogIdentifier=, RuntimeDirectory=)
    env_file: str
    exec_start: str  # the ExecStart= value (pdnode.node.unitcheck.exec_line)
    python: str
    ready: list[str]
    post_start: str | None
    hold: list[str] | None  # one of several prefills: the wait before it starts again


class ProbeView(TypedDict):
    """What the pair probe's service and timer write."""
    service: str
    timer: str
    stem: str
    exec_start: str
    timeout_start_s: int
    state_directory: str


class AccountUser(TypedDict):
    name: str
    group: str
    home: str
    shell: str


class Account(TypedDict):
    """The service account, as node_state reads it."""
    groups: list[str]
    users: list[AccountUser]


class HoldSpec(TypedDict):
    unit: str
    argv: list[str]


class StartSpec(TypedDict):
    """What pd_services_start starts: the workers, then the rest."""
    workers: list[str]
    others: list[str]
    after: list[str]
    hold: list[HoldSpec]


class ReadCommand(TypedDict):
    """A node_state check (argv, no shell)."""
    argv: list[str]
    differs: str
    stdin: NotRequired[str]
    json: NotRequired[bool]


class DrainSpec(TypedDict):
    """pdnode.node.drain's spec: key file names, never keys."""
    router: str
    admin_key_file: str
    api_key_file: str | None
    timeout_s: int | float
    workers: list[dict[str, Any]]


class OrphanRule(TypedDict):
    """How pd_services_files names the units the plan no longer has."""
    unit_dir: str
    prefix: str
    config_dir: str
    applied_dir: str
    own_pattern: str  # every unit file the role may have written (a regular expression)
    engine_pattern: str  # its engine units
    keep: list[str]  # the plan's units
    deferred: list[str]  # units a layout change stops at its step, not with the orphans


class RestartRule(TypedDict):
    """What pd_services_files's restart answer is computed from."""
    engines: list[str]  # in start order
    prefills: list[str]
    bound: list[str]  # decodes bound to the node's one prefill
    router: bool
    change: list[ChangeRef]  # this host's steps of a layout change, in order


class ChangeRef(TypedDict):
    kind: Literal["start", "stop", "restart"]
    id: str


class StopView(TypedDict):
    """A running instance a layout change stops on this host: its unit and its drain."""
    unit: str
    drain: DrainSpec


class PdServicesView(TypedDict):
    """What the pd_services role reads (pdnode.core.plan.roles.pd_services)."""
    user: str
    home: str
    applied_dir: str
    python: str
    target: str
    state_directory: str
    served_name: str
    units: list[str]  # the services' units in start order
    router: bool  # the router runs on this host
    router_unit: str | None
    probe: ProbeView | None
    enable: list[str]  # enabled and kept running: the services, the probe's timer, the target
    start: StartSpec
    read_units: list[dict[str, str]]
    directories: list[Owned]
    admin_key_files: list[Owned]
    admin_key_argv: list[str] | None
    account: Account
    secret_files: list[SecretFile]
    inputs: list[ServiceInput]
    files: list[RoleFile]
    services: dict[str, ServiceView]
    ports_argv: list[str]
    reconcile_spec: str | None
    read_commands: dict[str, ReadCommand]
    router_host: str
    drain: dict[str, DrainSpec]  # per engine id: it, and the decodes bound to it
    drain_unplanned: DrainSpec
    change_lines: list[str]  # the layout change as the deploy prints it
    windows: list[dict[str, Any]]  # the accepted windows, their steps as the handlers take them
    stops: dict[str, StopView]
    orphans: OrphanRule
    restart: RestartRule


class FirewallView(TypedDict):
    """What the firewall role reads (pdnode.core.plan.roles.firewall): its names after the
    install prefix and the rules file's values."""
    prefix: str
    table: str  # the nftables table: inet <prefix with _>_pdnode
    unit: str
    unit_path: str
    rules_file: str
    target: str  # the node's target, which the firewall unit comes before
    nft: str
    files: list[str]  # the unit and the rules file, in the order a disabled plan removes them
    load_argv: list[str]
    list_argv: list[str]
    delete_argv: list[str]
    enabled: bool
    peers_v4: list[str]
    peers_v6: list[str]
    port_rules: list[str]  # the input chain's port rules, in order, as nft reads them


class ModelToken(TypedDict):
    src: str  # the controller's token file (pdnode_model_token_file)
    dest: str  # where the role puts it (0600) while the download runs


class ModelShareUnit(TypedDict):
    unit: str  # the seed's transient unit that serves the commit to the peers
    start: list[str]  # systemd-run of pdnode.node.model_fetch --serve
    stop: list[str]


class ModelView(TypedDict):
    """The model role's view (pdnode.core.plan.roles.model); {"enabled": false} without a
    source (or when the plan has no lock to read)."""
    enabled: bool
    scheme: NotRequired[Literal["hf", "local"]]
    argv: NotRequired[list[str]]  # pdnode.node.model_fetch with the spec on stdin
    token: NotRequired[ModelToken | None]
    peer: NotRequired[bool]  # fetch from the seed host (spec.peer), not from the endpoint
    share: NotRequired[ModelShareUnit | None]  # the seed: serve the verified commit to the peers
    state_file: NotRequired[str | None]  # the host's {current, previous} commits (COMMIT.stamp.json beside it)
    spec: NotRequired[dict[str, Any]]  # pdnode.node.model_fetch's spec


class RoleViews(TypedDict):
    """Each role's view of the plan (pdnode.core.plan.roles): what it reads, computed."""
    pd_services: PdServicesView
    firewall: FirewallView
    model: ModelView


class ModelFactsDoc(TypedDict):
    """What the model's own files state (pdnode.core.plan.model_facts)."""
    kind: Literal["dense", "moe", "moe_mla"]
    architecture: str | None
    weight_bytes: int | None
    weight_source: str
    kv_bytes_per_token: int | None
    dtype: str | None
    quantization: str | None


class ModelShare(TypedDict):
    """One download per layout spanning hosts (pdnode.core.plan.model.with_share)."""
    seed: str  # the engine host that downloads from the endpoint and serves the others
    address: str  # its address in the layout
    port: int  # pdnode_model_share_port
    peers: list[str]  # the other engine hosts: they fetch from the seed
    engine_host: bool  # does this host run an engine (a router-only host needs no model)


class Model(TypedDict):
    """Where the model comes from (pdnode.core.plan.model); the plan's ``model`` is {}
    when the inventory names no pdnode_model_source."""
    source: str
    scheme: Literal["hf", "local"]
    path: str | None  # pdnode_model_path: where the engines read it on the host
    endpoint: str | None
    token_file: str | None
    repo: NotRequired[str]  # hf: ORG/NAME
    revision: NotRequired[str]  # hf: as the source writes it
    lock_file: NotRequired[str | None]
    commit: NotRequired[str]  # hf: what the lock pins
    files: NotRequired[int]
    total_bytes: NotRequired[int]
    gated: NotRequired[bool]
    lock: NotRequired[dict[str, Any]]  # the lock file's document (pdnode.model-lock/1): what the hosts verify
    cache: NotRequired[str]  # the controller's copy of the commit's small files
    facts: NotRequired[ModelFactsDoc]
    share: NotRequired[ModelShare]


class NoModel(TypedDict):
    """The plan's ``model`` of an inventory without a pdnode_model_source: {}."""


class ChangeStep(TypedDict):
    """One step of a layout change (pdnode.core.change.layout_change)."""
    kind: Literal["start", "stop", "restart"]
    role: Literal["prefill", "decode"]
    id: str  # the instance it starts or restarts, or the running one it stops
    was: str | None  # the running instance (stop, restart)
    label: str
    serving: dict[str, int]  # role -> instances serving after the step
    at_zero: list[str]  # roles no instance serves during the step
    hosts: list[str]  # the hosts whose deploy takes it


class ChangeWindow(TypedDict):
    """Steps in a row that leave a role at zero, and how long (pdnode.core.change.window)."""
    role: str
    steps: list[int]  # 1-based
    expected_s: float | None
    source: str


class ChangeStop(TypedDict):
    unit: str
    hosts: list[str]
    worker: dict[str, Any]  # its entry in the router's worker list, as it was recorded


class Change(TypedDict):
    """The change from what the node runs (its record) to this layout (pdnode.core.change.identity)."""
    by: Literal["record", "index"]  # instances named after the node's record, or by their index (no record)
    notes: list[str]  # instances the record named otherwise than their index
    record: dict[str, Any]  # what the deploy records (pdnode.layout/1; with "from" while its steps run)
    converged: dict[str, Any]  # the record once the change's steps are done
    record_file: str
    steps: list[ChangeStep]
    windows: list[ChangeWindow]
    side_by_side: list[str]  # roles the hosts' steps, taken side by side, may leave with none serving
    stops: dict[str, ChangeStop]  # the running instances it stops
    strangers: dict[str, list[str]]  # host -> engine units it runs that neither the record nor the plan names
    refusal: str | None  # the line deploy and upgrade refuse with (units not named, an unfinished change, a window)
    refusal_one_host_at_a_time: str | None  # the same where the hosts switch one at a time (upgrade.yml)


class PlanDoc(TypedDict):
    """One host's plan, as every consumer reads it."""
    schema: Literal["pdnode.plan/1"]
    host: str
    install: Install
    services: dict[str, Service]  # this host's services, in start order
    router_argv: list[str]
    ports: dict[str, int]  # "<service>.<what>" -> port
    settings: Settings
    cluster: Cluster
    firewall: Firewall
    model: Model | NoModel
    change: Change
    warnings: list[str]
    managed: list[ManagedPath]  # every path the deploy's roles write (pdnode.core.plan.managed)
    roles: RoleViews  # what each role reads (pdnode.core.plan.roles)


def export() -> dict[str, Any]:
    """The JSON Schema of PlanDoc. Every record is closed (additionalProperties false): a
    key added to the plan without a type here fails the schema test."""
    from pydantic import TypeAdapter  # development dependency: only the export needs it

    schema = TypeAdapter(PlanDoc).json_schema()
    for record in schema.get("$defs", {}).values():
        if "properties" in record:
            record["additionalProperties"] = False
    schema["additionalProperties"] = False
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": SCHEMA_ID, **schema}


def render() -> str:
    return json.dumps(export(), indent=2, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args == ["--write"]:
        SCHEMA_FILE.write_text(render())
        print(f"wrote {SCHEMA_FILE.name}")
        return 0
    sys.stdout.write(render())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
