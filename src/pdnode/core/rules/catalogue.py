"""Every rule the plan enforces, by a stable id: what ``pdnode check --json`` reports
and docs/inventory.md lists (``python -m pdnode.commands.docs``).

An id names the rule, not its message: a message may be reworded, an id stays (scripts
and dashboards key on it). A new check in the plan (plan.py, instances.py, ports.py,
values.py, capacity.py) passes an id from here, and tests/test_rules.py gets a case that
triggers it: a rule without a case, or a case without a rule, fails that test.
"""

from __future__ import annotations

from typing import NamedTuple


class Rule(NamedTuple):
    id: str
    severity: str  # error | warning
    doc: str


RULES: tuple[Rule, ...] = (
    # --- the variables themselves
    Rule("variable-unknown", "error", "a `pdnode_*` name the bundle does not know (a typo, or an instance key "
         "written as a variable)"),
    Rule("variable-retired", "error", "the one-instance variables of earlier releases (`pdnode_prefill_tp_size`, "
         "...): one line spells the `pdnode_<role>_instances` entry that replaces them"),
    Rule("variable-required", "error", "a required variable is not set"),
    Rule("variable-type", "error", "a variable's value is not of its type (integer, number, string, list, ...)"),
    Rule("value-templated", "error", "a value holds a Jinja template (`{{ ... }}`): the plan is computed without "
         "Ansible"),
    Rule("value-control-character", "error", "a string anywhere (keys included) holds a control character "
         "(newline, tab, escape, bidi, ...)"),
    Rule("value-finite", "error", "a number is NaN or infinite"),
    Rule("value-needs-lookup", "error", "a value that reaches a unit, an environment file, a command line or "
         "ServerArgs needs code run on the controller to be computed (a lookup, a filter or test from outside "
         "ansible-core or one that reads files, an include): check runs none of the inventory's code"),
    Rule("value-templated-at-deploy", "warning", "a value that reaches no unit, argv or ServerArgs (connection "
         "variables, the site's own, the verification's, ...) needs code run on the controller: check runs none, "
         "so the deploy templates it and check does not judge it"),
    Rule("role-variable-pattern", "error", "a role variable an inventory may set (`pd_services_*`, `sglang_*`, "
         "`mooncake_*`, `rdma_*`, `nvidia_driver_*`, `monitoring_*`: `pdnode.core.rules.values.ROLE_RULES`) does not match the "
         "pattern its role asserts (interpreters, package names, host paths, limits, URLs)"),
    Rule("hardening-off", "warning", "a role variable turns a hardening of the units off "
         "(`pd_services_device_policy: false`); the verifier's services check warns about it too"),
    # --- single settings
    Rule("engine-known", "error", "`pdnode_engine` is sglang or sim"),
    Rule("model-kind-known", "error", "`pdnode_model_kind` is moe_mla, moe or dense"),
    Rule("model-kind-needed", "error", "`pdnode_model_kind` is set, or the model's files (an hf:// source with its "
         "lock and cache) state it"),
    # --- where the model comes from (pdnode_model_source; docs/model.md)
    Rule("model-source-form", "error", "`pdnode_model_source` is hf://ORG/NAME[@REVISION] or local:///PATH"),
    Rule("model-endpoint-form", "error", "`pdnode_model_endpoint` is an http(s) URL: host, optional port and path"),
    Rule("model-reserve-range", "error", "`pdnode_model_reserve_gb` is 0 or more"),
    Rule("model-token-file", "error", "`pdnode_model_token_file` is a readable file on the controller"),
    Rule("model-source-local-path", "error", "a local:// source names `pdnode_model_path` itself"),
    Rule("model-lock-missing", "error", "an hf:// source is pinned by .model.lock.json beside the inventory "
         "(`pdnode model lock`)"),
    Rule("model-lock-readable", "error", "the model lock is a readable pdnode.model-lock/1 JSON file"),
    Rule("model-lock-stale", "error", "the model lock pins the repository and revision the source names"),
    Rule("model-cache-missing", "warning", "the locked commit's config files are in the controller's cache "
         "(else typed model facts are not checked against them)"),
    Rule("model-fact-contradicts-files", "error", "a typed `pdnode_model_kind`, `pdnode_model_weights_gb` or "
         "`pdnode_model_kv_bytes_per_token` agrees with the model's own files"),
    Rule("model-path-absolute", "error", "`pdnode_model_path` is an absolute local path (never a hub name)"),
    Rule("path-absolute", "error", "`pdnode_install_root` and `pdnode_config_dir` are absolute paths"),
    Rule("path-length", "error", "a host path is at most 200 characters"),
    Rule("path-characters", "error", "a host path holds only letters, digits and `. _ - /`"),
    Rule("path-normalized", "error", "a host path has no `..`, `.`, `//` or trailing `/`"),
    Rule("path-not-system-dir", "error", "the install root and the config dir (made owned by the service user) "
         "are not a system directory nor lie in one"),
    Rule("controller-path-pattern", "error", "a controller path (`pdnode_wheelhouse`, `pdnode_api_key_file`) holds "
         "only letters, digits and `. _ / + -` and does not start with `-`"),
    Rule("api-key-file-one-key", "error", "the controller file `pdnode_api_key_file` names (when it exists) holds "
         "exactly one key: 16-4096 printable ASCII characters without spaces on one line (never a private key); "
         "the message never shows its content"),
    Rule("service-user-not-root", "error", "the services do not run as root"),
    Rule("service-user-name", "error", "`pdnode_service_user` is a POSIX system user name"),
    Rule("service-prefix-name", "error", "`pdnode_service_prefix` (it names the units) is a-z first, then a-z 0-9 -"),
    Rule("served-name-pattern", "error", "`pdnode_model_served_name` holds only letters, digits and `. _ / @ + -` (SGLang reserves `:` for model:adapter)"),
    Rule("gpu-model-name", "error", "`pdnode_gpu_model` is a GPU name as nvidia-smi prints it"),
    Rule("gpu-count-positive", "error", "`pdnode_gpu_count` is at least 1"),
    Rule("pair-probe-interval-range", "error", "`pdnode_pair_probe_interval_s` is 0 (no probe) or 30-3600 "
         "seconds"),
    Rule("layout-record-readable", "error", "each host's record of the layout it runs is readable, and the hosts' "
         "records agree"),
    Rule("layout-change-keeps-serving", "error", "a change from the running layout leaves no role without an "
         "instance serving, or `pdnode_allow_unavailable` accepts the window"),
    Rule("layout-record-names-what-runs", "error", "every engine unit of the prefix a host runs is named by its "
         "record of the layout or by the inventory: the deploy does not stop what it did not start"),
    Rule("layout-change-finishes-first", "error", "an earlier deploy's change that was interrupted is finished (the "
         "same inventory again) before a change to another layout begins"),
    Rule("drain-timeout-positive", "error", "`pdnode_drain_timeout_s` is at least 1"),
    Rule("sim-value-range", "error", "a stand-in knob (`pdnode_sim_*`) is a time of 0 or more, or a count of 1 "
         "or more"),
    Rule("version-pattern", "error", "a version is a release number such as 0.5.23 or 0.3.13.post1"),
    Rule("host-address", "error", "a bind host is an IP address or a DNS name"),
    Rule("host-zone-id", "error", "no host or address field (`pdnode_router_host`, `pdnode_router_metrics_host`, "
         "`pdnode_worker_host`, `pdnode_node_address`) carries an IPv6 zone id (`%...`)"),
    Rule("worker-host-loopback", "error", "prefill and decode listen on loopback only (the router is the node's "
         "one public endpoint)"),
    Rule("verify-reference-length", "error", "the verifier's reference prompt and answer are short"),
    Rule("environment-name", "error", "a `pdnode_engine_environment` name is A-Z or _ first, then A-Z 0-9 _"),
    Rule("environment-value-type", "error", "a `pdnode_engine_environment` value is a string, a number or "
         "true/false"),
    Rule("environment-value-pattern", "error", "a `pdnode_engine_environment` value holds only characters that "
         "mean nothing in a systemd environment file"),
    Rule("environment-value-parses", "error", "a `pdnode_engine_environment` variable the plan knows "
         "(`pdnode.core.rules.environment_types.TYPES`: Mooncake's `MC_*`, NCCL's, SGLang's) holds a value of the "
         "type its library parses (an integer where it parses an integer, within its range; true/false where SGLang "
         "reads a boolean), whatever the KV path: a value it does not parse is read as 0 or a truncated number, "
         "ignored, or fails the engine's start"),
    Rule("load-format-value", "error", "`pdnode_model_load_format` is a `--load-format` choice of SGLang 0.5.23"),
    Rule("threshold-known", "error", "a `pdnode_verify_thresholds` key is a known threshold"),
    Rule("threshold-positive", "error", "a `pdnode_verify_thresholds` value is a positive number"),
    # --- the instances
    Rule("instances-not-empty", "error", "each role has at least one instance"),
    Rule("instance-mapping", "error", "an instance entry is a mapping of instance keys"),
    Rule("instance-key-unknown", "error", "an instance entry has only the keys of its role"),
    Rule("instance-key-required", "error", "an instance entry sets its required keys (`gpus`)"),
    Rule("instance-key-type", "error", "an instance key's value is of its type"),
    Rule("instance-name-pattern", "error", "an instance name is 1-12 characters a-z 0-9 (it names the unit and its "
         "files)"),
    Rule("instance-name-unique", "error", "two instances of one role have different names"),
    Rule("mem-fraction-range", "error", "`mem_fraction_static` is between 0 and 1"),
    Rule("size-at-least-1", "error", "`tp_size`, `dp_size`, `attn_dp_size` and `ep_size` are at least 1"),
    Rule("dp-replicas-without-attn-dp", "error", "DP replicas (`dp_size` > 1) are not combined with DP attention "
         "(SGLang 0.5.23 refuses it)"),
    Rule("dp-divides-gpus", "error", "`dp_size` divides the instance's GPUs when `tp_size` is left out"),
    Rule("tp-divisible-by-attn-dp", "error", "`tp_size` (all GPUs of the instance) is divisible by `attn_dp_size`"),
    Rule("nccl-port-not-pinned-with-dp", "error", "an instance with DP replicas does not pin `nccl_port` (every "
         "replica would bind it)"),
    Rule("gpus-not-empty", "error", "an instance lists at least one GPU"),
    Rule("gpus-exist", "error", "GPU ids lie in 0..`pdnode_gpu_count`-1"),
    Rule("gpus-unique", "error", "an instance lists each GPU once"),
    Rule("gpus-evenly-spaced", "error", "an instance's GPUs ascend evenly spaced (SGLang places rank r on "
         "base_gpu_id + r * gpu_id_step)"),
    Rule("gpus-match-tp-dp", "error", "an instance lists `tp_size` x `dp_size` GPUs"),
    Rule("gpus-not-shared", "error", "each GPU belongs to one instance"),
    Rule("ep-divides-tp", "error", "`ep_size` divides `tp_size` (EP is carved out of the TP world)"),
    Rule("ep-equals-tp-with-a2a", "error", "with an all-to-all MoE backend that spans the TP group, `ep_size` "
         "equals `tp_size` (SGLang overrides any other value)"),
    Rule("moe-dense-tp-1-or-tp", "error", "`moe_dense_tp_size` is unset, 1 or `tp_size`"),
    Rule("dp-lm-head-needs-attn-dp", "error", "`enable_dp_lm_head` needs DP attention (`attn_dp_size` > 1)"),
    Rule("dense-ignores-moe", "warning", "`ep_size` > 1 or `moe_dense_tp_size` on a dense model: SGLang ignores "
         "them"),
    Rule("prefill-attn-dp", "warning", "DP attention on a prefill instance makes TTFT several times worse"),
    # --- an instance's extra_args (SGLang ServerArgs)
    Rule("extra-arg-removed-flag", "error", "an SGLang flag removed in 2026-03 (`disaggregation_decode_tp`, ...)"),
    Rule("extra-arg-deprecated-dp-attention", "error", "`enable_dp_attention` (+ `dp_size`): the deprecated "
         "spelling of `attn_dp_size`"),
    Rule("extra-arg-owned", "error", "a ServerArgs field the plan sets itself (model, ports, sizes, GPUs, ...)"),
    Rule("extra-arg-unknown", "error", "not a ServerArgs field of SGLang 0.5.23"),
    Rule("extra-arg-no-flag", "error", "a ServerArgs field without a command-line flag (the launcher cannot pass "
         "it)"),
    Rule("extra-arg-secret", "error", "an argument that holds a secret (it would be on argv and in the JSON)"),
    Rule("extra-arg-value", "error", "a value the flag does not accept (type, choices, a leading `-`)"),
    Rule("kv-over-tcp", "warning", "the KV hand-off runs over TCP (~1.8 GB/s) on real engines; the line says what "
         "it adds to TTFT for `pdnode_kv_prompt_tokens`"),
    Rule("disagg-setting-range", "error", "a disaggregation setting (`pdnode_disagg_*`, "
         "`pdnode_decode_allocation_policy`) is one SGLang accepts"),
    Rule("disagg-environment-owned", "error", "`pdnode_engine_environment` does not set a variable a "
         "`pdnode_disagg_*` setting owns"),
    Rule("disagg-setting-same-everywhere", "error", "`disaggregation_decode_allocation_policy` and "
         "`disaggregation_enable_kv_checksum` are the same on every prefill and decode of the layout (SGLang's help "
         "asks for both roles; one process cannot check its peers)"),
    Rule("disagg-kv-layout-same", "error", "`page_size` and `kv_cache_dtype` are the same on every prefill and "
         "decode of the layout, or set on none (the decode refuses a different KV layout at its first request: "
         "SGLang's disaggregation/common/conn.py)"),
    Rule("disagg-context-length-same", "error", "`context_length` is the same on every prefill and decode of the "
         "layout, or set on none (a request one side admits and the other refuses hangs its decode: "
         "InferenceX#2257)"),
    Rule("disagg-prefill-dp-replicas", "error", "no prefill of plain DP replicas (`dp_size` > 1 without DP "
         "attention): SGLang 0.5.23 fails the hand-offs of every replica but the first (sglang#29725)"),
    Rule("disagg-attn-tp-divides", "error", "on a non-MLA model, a prefill's and a decode's attention TP "
         "(tp_size / attn_dp_size) divide one another (SGLang maps KV heads between them by integer division)"),
    Rule("disagg-attn-tp-block-scaled-kv", "error", "on a non-MLA model with the block-scaled KV cache "
         "(`kv_cache_dtype: mxfp8`), every prefill and decode has the same attention TP (SGLang 0.5.23 does not "
         "slice the KV's block scales between sizes and fails the first hand-off)"),
    Rule("disagg-hicache-hisparse", "error", "no decode with `enable_hisparse` beside a prefill with "
         "`enable_hierarchical_cache` (the pair hangs: sglang#26092)"),
    # --- SGLang's own validation of each engine's ServerArgs (pdnode check; pdnode.core.rules.sglang_judge)
    Rule("sglang-rejects", "error", "SGLang's own validation (argparse, resolve_once, check_server_args) refuses an "
         "instance's rendered ServerArgs; the line carries SGLang's reason"),
    Rule("sglang-could-not-judge", "warning", "SGLang on this machine could not judge an instance's ServerArgs (a "
         "rule that depends on the GPU generation, or the validator failed); the deploy's on-host check judges it"),
    Rule("sglang-validation-not-run", "warning", "no validator environment with the plan's SGLang release on this "
         "machine: only pdnode's own rules were applied (scripts/sglang-validator builds it)"),
    # --- arguments that open a door (pdnode.core.rules.guards; docs/security.md)
    Rule("exposing-arg", "error", "an engine or router argument that opens a listener beyond loopback, serves "
         "without the API key, runs uploaded code, routes to workers the plan does not list, or sends data or "
         "loads weights over the network (`decoupled_spec_bind_endpoint`, `otlp_traces_endpoint` off loopback, "
         "`pdnode_model_load_format: remote`, `mini_lb`, `enable_mesh`, `mesh_*`, `enable_wasm`, ...) unless "
         "`pdnode_allow_exposing_args` names it"),
    Rule("exposing-arg-allowed", "warning", "such an argument, allowed by `pdnode_allow_exposing_args`"),
    Rule("exposing-allow-known", "error", "a `pdnode_allow_exposing_args` entry names an argument the plan refuses "
         "as opening a door"),
    # --- ports
    Rule("port-range", "error", "a port is unprivileged (1024-65535; an instance with DP attention also needs "
         "port+233..+239)"),
    # --- several hosts (pdnode.core.plan.cluster)
    Rule("host-known", "error", "an instance's `hosts` and `pdnode_router_node` name hosts of the inventory"),
    Rule("hosts-unique", "error", "an instance's `hosts` names each host once (one node rank per host)"),
    Rule("host-in-layout", "error", "the host being deployed runs an instance or the router of the layout"),
    Rule("node-address-required", "error", "every host of a layout spanning hosts has `pdnode_node_address`"),
    Rule("node-address-ip", "error", "`pdnode_node_address` is an IP address other hosts reach (not loopback, "
         "not a wildcard)"),
    Rule("node-address-unique", "error", "no two hosts of a layout share an address"),
    Rule("layout-same-on-every-host", "error", "every host of a layout has the same instances, router host, "
         "prefix, model name, engine and transfer backend"),
    Rule("multi-host-api-key", "error", "a layout spanning hosts sets `pdnode_api_key_file` (workers then listen "
         "beyond loopback)"),
    Rule("dist-init-port-spanning-only", "error", "`dist_init_port` is set only on an instance spanning hosts"),
    Rule("spanning-without-dp-replicas", "error", "an instance spanning hosts has no `dp_size` replicas (list "
         "each replica as an instance)"),
    Rule("port-collision", "error", "no two listeners of the node share a port (DP-attention ranges included)"),
    Rule("dp-replica-port-draw", "warning", "on a layout with DP replicas (`dp_size` above 1 without attention DP), "
         "no listener of the plan lies in 22000-29999, where SGLang draws each replica's NCCL port at every start"),
    Rule("router-port-not-30000", "warning", "the router on 30000, SGLang's default server port, is easy to "
         "collide with"),
    # --- KV transfer
    Rule("transfer-backend-supported", "error", "`pdnode_transfer_backend` is mooncake, mooncake_tcp or nixl"),
    Rule("ib-devices-need-rdma-backend", "error", "`pdnode_ib_devices` only with a backend that uses them "
         "(mooncake, nixl)"),
    Rule("ib-device-key-gpu-id", "error", "a `pdnode_ib_devices` key is a physical GPU id"),
    Rule("ib-device-name", "error", "a `pdnode_ib_devices` value is an RDMA device name or a comma list of them"),
    Rule("ib-devices-cover-gpus", "error", "`pdnode_ib_devices` maps every GPU the instances use"),
    Rule("kv-environment-owned", "error", "`pdnode_engine_environment` does not set a variable the plan renders "
         "for the layout's KV path (`MC_INTRANODE_NVLINK` and `SGLANG_MOONCAKE_CUSTOM_MEM_POOL` on the NVLink path, "
         "`MC_FORCE_HCA` on the RDMA path, `SGLANG_HOST_IP` on a layout over several hosts): the plan's value would "
         "replace it unseen"),
    Rule("kv-environment-contradicts", "error", "no Mooncake or SGLang variable in `pdnode_engine_environment` makes "
         "the engines run another KV transport or memory pool than the plan's path (`MC_FORCE_TCP` under NVLink or "
         "RDMA, `MC_FORCE_MNNVL`, `MC_INTRANODE_NVLINK` off the NVLink path, `MC_USE_TENT`, a "
         "`SGLANG_MOONCAKE_CUSTOM_MEM_POOL` type off the NVLink path, a NIC filter or topology file against "
         "`pdnode_ib_devices`, ...): `explain`, the verify floor and the planner would describe something else "
         "than what runs (docs/kv-path.md)"),
    Rule("kv-environment-surprising", "warning", "a Mooncake or SGLang variable in `pdnode_engine_environment` "
         "does nothing on the plan's KV path (an RDMA setting under NVLink, `MOONCAKE_PROTOCOL`, `MC_TCP_BIND_ADDRESS`, a Mooncake variable with the nixl "
         "backend, ...) or steers it where pdnode checks nothing (a NIC filter or topology file without "
         "`pdnode_ib_devices`, an advertised address on one host)"),
    Rule("environment-presence-switch", "warning", "a Mooncake switch Mooncake tests for presence only "
         "(`MC_FORCE_TCP`, ...) is written as if it turned it off (`0`, `false`, empty): any value turns it on; "
         "only where `kv-environment-*` does not already judge the variable on the plan's path"),
    # --- the router
    Rule("router-package-known", "error", "`pdnode_router_package` is sglang-router or smg"),
    Rule("router-smg-cache-aware", "error", "not smg 1.13 with the cache_aware policy and several prefills or "
         "decodes: one dead instance fails requests and can take the node down until the router's health checks "
         "drop it (docs/smg.md)"),
    Rule("router-policy-known", "error", "`pdnode_router_policy` is a PD policy of sglang-router 0.3.2"),
    Rule("router-dp-aware-broken", "error", "`dp_aware` is broken in PD mode in sglang-router 0.3.2"),
    Rule("router-arg-owned", "error", "a router argument the plan sets itself (workers, host, ports, policy, ...)"),
    Rule("router-arg-name", "error", "a `pdnode_router_extra_args` key is an argument name"),
    Rule("router-arg-dashes", "error", "router arguments are spelled with underscores"),
    Rule("router-arg-unknown", "error", "not an argument of sglang-router 0.3.2"),
    Rule("router-arg-secret", "error", "a router argument that holds a secret"),
    Rule("router-arg-value", "error", "a value the router flag does not accept"),
    Rule("router-arg-refused", "error", "the router package the plan installs refuses the router's arguments: "
         "pdnode's launcher check and the package's own parser and pre-start steps, asked by `pdnode check` on the "
         "plan's router argv (one line per refused `pdnode_router_extra_args` entry)"),
    Rule("router-judge-unavailable", "warning", "the router's own validation could not be asked about "
         "`pdnode_router_extra_args` (the controller lacks the release the plan installs)"),
    Rule("router-metrics-loopback", "warning", "router metrics bound beyond loopback are reachable from other "
         "hosts"),
    # --- capacity (pdnode_model_weights_gb / pdnode_model_controller_path)
    Rule("capacity-weights-gb", "error", "`pdnode_model_weights_gb` is a positive number"),
    Rule("capacity-model-dir", "error", "`pdnode_model_controller_path` holds a readable config.json and "
         "safetensors index"),
    Rule("capacity-weights-fit", "error", "each GPU of an instance holds weights/`tp_size` with room left for the "
         "KV cache"),
    Rule("capacity-gpus-for-all", "error", "the instances at their smallest fitting `tp_size` fit the host's GPUs "
         "together"),
    Rule("capacity-gpu-known", "warning", "`pdnode_gpu_model` is in the GPU table (otherwise the weights are not "
         "checked)"),
)
BY_ID: dict[str, Rule] = {r.id: r for r in RULES}
