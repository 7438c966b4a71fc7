"""Hostile and careless inventory values (issue 9, item 2): every value that reaches a
unit, an environment file, a command line or a path is held to a strict pattern, one
line per problem naming the variable, the value, the rule and the fix.

Each case starts from inventories/gpu01 (valid) and changes a few variables or instance
keys (tests/planvars.py: ``"prefill[0]": {...}`` patches an instance entry).
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from planvars import changed

from pdnode.core.rules import argtable
from pdnode.core.plan.build import PlanError, build_plan
from pdnode.node import releases

ROOT = Path(__file__).resolve().parents[1]
# root's ~/.ssh as the OS names it (a hostile place for the deploy to chown)
ROOT_SSH = os.path.join(pwd.getpwuid(0).pw_dir, ".ssh")
GPU01 = ROOT / "inventories" / "gpu01"
INJECT = "8M\nExecStartPre=+/bin/touch /run/pwned"


def _problems(base, changes):
    try:
        build_plan(changed(base, changes))
    except PlanError as exc:
        return [str(p) for p in exc.problems]
    return []


# The cases written for sglang-router 0.3.2's parser and messages (smg is the default).
R032 = {"pdnode_router_package": "sglang-router"}
# (changes, the one problem line starts with ...)
REFUSED = [
    pytest.param({"pdnode_service_user": "%u"}, "pdnode_service_user='%u': must be a POSIX system user name", id="user_specifier"),
    pytest.param({"pdnode_service_user": "0"}, "pdnode_service_user='0': must be a POSIX system user name", id="user_numeric"),
    pytest.param({"pdnode_service_user": "Sglang"}, "pdnode_service_user='Sglang': must be", id="user_upper"),
    pytest.param({"pdnode_service_user": "a" * 33}, "pdnode_service_user='aaaa", id="user_long"),
    pytest.param({"pdnode_service_user": "sg lang"}, "pdnode_service_user='sg lang': must be", id="user_space"),
    pytest.param({"pdnode_service_prefix": "x$(id>&2)"}, "pdnode_service_prefix='x$(id>&2)': must be a-z first", id="prefix_shell"),
    pytest.param({"pdnode_service_prefix": "sglang pd"}, "pdnode_service_prefix='sglang pd': must be", id="prefix_space"),
    pytest.param({"pdnode_service_prefix": "pd%i"}, "pdnode_service_prefix='pd%i': must be", id="prefix_percent"),
    pytest.param({"pdnode_service_prefix": "p" * 41}, "pdnode_service_prefix='pppp", id="prefix_long"),
    pytest.param({"pdnode_service_prefix": "pd-"}, "pdnode_service_prefix='pd-': must be", id="prefix_dash_end"),
    pytest.param({"pdnode_install_root": "/opt/x$(id>&2)"}, "pdnode_install_root='/opt/x$(id>&2)': may contain only", id="root_shell"),
    pytest.param({"pdnode_install_root": "/opt/sglang pd"}, "pdnode_install_root='/opt/sglang pd': may contain only", id="root_space"),
    pytest.param({"pdnode_install_root": "/opt/sglang/../../etc"}, "pdnode_install_root='/opt/sglang/../../etc': is not a normalized path", id="root_dotdot"),
    pytest.param({"pdnode_install_root": "/opt/" + "a" * 2_000_000}, "pdnode_install_root='/opt/aaaa", id="root_2mb"),
    pytest.param({"pdnode_install_root": "/opt"}, "pdnode_install_root='/opt': is a system directory", id="root_opt"),
    pytest.param({"pdnode_install_root": "/usr/local"}, "pdnode_install_root='/usr/local': is a system directory", id="root_usr_local"),
    pytest.param({"pdnode_config_dir": "/etc"}, "pdnode_config_dir='/etc': is a system directory", id="config_etc"),
    pytest.param({"pdnode_config_dir": "/"}, "pdnode_config_dir='/': is a system directory", id="config_root"),
    pytest.param({"pdnode_config_dir": "/tmp"}, "pdnode_config_dir='/tmp': is a system directory", id="config_tmp"),
    pytest.param({"pdnode_config_dir": "/tmp/sglang-pd"}, "pdnode_config_dir='/tmp/sglang-pd': is a system directory", id="config_under_tmp"),
    pytest.param({"pdnode_config_dir": "/etc/sglang%pd"}, "pdnode_config_dir='/etc/sglang%pd': may contain only", id="config_percent"),
    pytest.param({"pdnode_config_dir": "/etc/sglang-pd/"}, "pdnode_config_dir='/etc/sglang-pd/': is not a normalized path", id="config_slash"),
    pytest.param({"pdnode_model_path": "/models/My Model"}, "pdnode_model_path='/models/My Model': may contain only", id="model_space"),
    pytest.param({"pdnode_model_path": "/models/../etc/shadow"}, "pdnode_model_path='/models/../etc/shadow': is not a normalized", id="model_dotdot"),
    pytest.param({"pdnode_model_served_name": "m\nExecStartPre=+/bin/touch /run/pwned"},
                 "pdnode_model_served_name='m\\nExecStartPre=+/bin/touch /run/pwned': contains a control character", id="served_newline"),
    pytest.param({"pdnode_model_served_name": "x%H"}, "pdnode_model_served_name='x%H': must be a letter or digit first", id="served_percent"),
    pytest.param({"pdnode_model_served_name": "my model"}, "pdnode_model_served_name='my model': must be", id="served_space"),
    pytest.param({"pdnode_model_served_name": "m" * 129}, "pdnode_model_served_name='mmmm", id="served_long"),
    pytest.param({"pdnode_model_served_name": "org/m:fp8"}, "pdnode_model_served_name='org/m:fp8': must be a letter or digit first", id="served_colon"),
    pytest.param({"pdnode_gpu_model": "NVIDIA H200\x1b[2J"}, "pdnode_gpu_model='NVIDIA H200\\x1b[2J': contains a control character", id="gpu_escape"),
    pytest.param({"pdnode_gpu_model": "NVIDIA;H200"}, "pdnode_gpu_model='NVIDIA;H200': must be a GPU name", id="gpu_semicolon"),
    pytest.param({"pdnode_engine_environment": {"sglang_x": "1"}}, "pdnode_engine_environment.sglang_x='1': the variable name must be", id="env_lower"),
    pytest.param({"pdnode_engine_environment": {"A B": 1}}, "'pdnode_engine_environment.A B'=1: the variable name must be", id="env_space_name"),
    pytest.param({"pdnode_engine_environment": {"X": "a\nY=b"}}, "pdnode_engine_environment.X='a\\nY=b': contains a control character", id="env_newline"),
    pytest.param({"pdnode_engine_environment": {"X": "$HOME"}}, "pdnode_engine_environment.X='$HOME': may contain only", id="env_dollar"),
    pytest.param({"pdnode_engine_environment": {"X": '"quoted"'}}, "pdnode_engine_environment.X='\"quoted\"': may contain only", id="env_quote"),
    pytest.param({"pdnode_engine_environment": {"X": "a b"}}, "pdnode_engine_environment.X='a b': may contain only", id="env_space"),
    pytest.param({"pdnode_engine_environment": {"X": [1]}}, "pdnode_engine_environment.X=[1]: must be a string", id="env_list"),
    pytest.param({"prefill[0]": {"extra_args": {"lora_paths": ["a", "--host", "0.0.0.0", "--api-key", "KEY"]}}},
                 "pdnode_prefill_instances[0].extra_args.lora_paths=['a', '--host', '0.0.0.0', '--api-key', 'KEY']: item '--host': "
                 "a value may not start with '-'", id="extra_list_flags"),
    pytest.param({"decode[0]": {"extra_args": {"moe_a2a_backend": "bogus"}}},
                 "pdnode_decode_instances[0].extra_args.moe_a2a_backend='bogus': --moe-a2a-backend accepts only", id="extra_choices"),
    pytest.param({"prefill[0]": {"extra_args": {"chunked_prefill_size": "abc"}}},
                 "pdnode_prefill_instances[0].extra_args.chunked_prefill_size='abc': --chunked-prefill-size takes an integer", id="extra_int"),
    pytest.param({"prefill[0]": {"extra_args": {"chunked_prefill_size": True}}},
                 "pdnode_prefill_instances[0].extra_args.chunked_prefill_size=True: --chunked-prefill-size takes a value", id="extra_bool_for_int"),
    pytest.param({"prefill[0]": {"extra_args": {"watchdog_timeout": "-5"}}},
                 "pdnode_prefill_instances[0].extra_args.watchdog_timeout='-5': --watchdog-timeout takes a number", id="extra_float"),
    pytest.param({"prefill[0]": {"extra_args": {"admin_api_key": "S3CRET"}}},
                 "pdnode_prefill_instances[0].extra_args.admin_api_key='<hidden>': holds a secret", id="extra_secret"),
    pytest.param({"prefill[0]": {"extra_args": {"enable_metrics_for_all_schedulers": "yes"}}},
                 "pdnode_prefill_instances[0].extra_args.enable_metrics_for_all_schedulers='yes': --enable-metrics-for-all-schedulers is an on/off flag",
                 id="extra_flag"),
    pytest.param({"prefill[0]": {"extra_args": {"dtype": "--x"}}}, "pdnode_prefill_instances[0].extra_args.dtype='--x': a value may not start with '-'", id="extra_dash_choice"),
    pytest.param({"pdnode_model_load_format": "bogus"}, "pdnode_model_load_format='bogus': --load-format accepts only", id="load_format"),
    pytest.param({"pdnode_router_extra_args": {"api-key": "SECRET"}},
                 "pdnode_router_extra_args.api-key='<hidden>': holds a secret", id="router_dash_secret"),
    pytest.param({"pdnode_router_extra_args": {"control_plane_api_keys": ["SECRET"]}},
                 "pdnode_router_extra_args.control_plane_api_keys='<hidden>': holds a secret", id="router_secret"),
    pytest.param({"pdnode_router_extra_args": {"oracle_password": "SECRET"}},
                 "pdnode_router_extra_args.oracle_password='<hidden>': holds a secret", id="router_password"),
    pytest.param({"pdnode_router_extra_args": {"retry-max-retries": 3}},
                 "pdnode_router_extra_args.retry-max-retries=3: is spelled with dashes; the plan takes sglang-router's "
                 "underscored names. Fix: write retry_max_retries.", id="router_dash"),
    pytest.param({**R032, "pdnode_router_extra_args": {"no_such_option": 1}},
                 "pdnode_router_extra_args.no_such_option=1: is not an argument of sglang-router 0.3.2", id="router_unknown"),
    pytest.param({"pdnode_router_extra_args": {"retry_max_retries": "many"}},
                 "pdnode_router_extra_args.retry_max_retries='many': --retry-max-retries takes an integer", id="router_int"),
    pytest.param({"pdnode_router_extra_args": {"log_level": "loud"}},
                 "pdnode_router_extra_args.log_level='loud': --log-level accepts only debug, error, info, warn", id="router_choice"),
    pytest.param({"pdnode_router_extra_args": {"log_dir": "--api-key"}},
                 "pdnode_router_extra_args.log_dir='--api-key': a value may not start with '-'", id="router_dash_value"),
    pytest.param({"pdnode_ib_devices": {**{i: f"mlx5_{i}" for i in range(1, 8)}, "0\n": "mlx5_0"}},
                 "pdnode_ib_devices='0\\n': contains a control character", id="ib_key_newline"),
    pytest.param({"pdnode_router_host": "0.0.0.0 --api-key x"}, "pdnode_router_host='0.0.0.0 --api-key x': must be an IP address or a DNS name", id="router_host"),
    pytest.param({"pdnode_router_metrics_host": "-h"}, "pdnode_router_metrics_host='-h': must be an IP address or a DNS name", id="metrics_host"),
    pytest.param({"pdnode_sglang_version": "0.5.23 --index-url x"}, "pdnode_sglang_version='0.5.23 --index-url x': must be a release number", id="version"),
    pytest.param({"pdnode_wheelhouse": "-r evil"}, "pdnode_wheelhouse='-r evil': must be a controller path", id="wheelhouse"),
    pytest.param({"pdnode_api_key_file": "keys/a key"}, "pdnode_api_key_file='keys/a key': must be a controller path", id="key_file"),
    pytest.param({"pdnode_verify_reference_prompt": "q" * 4001}, "pdnode_verify_reference_prompt='qqqq", id="prompt_long"),
    pytest.param({"pdnode_verify_reference_answer": "Paris\n"}, "pdnode_verify_reference_answer='Paris\\n': contains a control character", id="answer_newline"),
    pytest.param({"pdnode_sim_startup_s": float("nan")}, "pdnode_sim_startup_s=nan: is not a finite number", id="nan"),
    pytest.param({"pd_services_limit_memlock": INJECT},
                 "pd_services_limit_memlock='8M\\nExecStartPre=+/bin/touch /run/pwned': must be a number", id="role_memlock"),
    pytest.param({"pd_services_ready_timeout_s": "60 --x"}, "pd_services_ready_timeout_s='60 --x': must be", id="role_timeout"),
    pytest.param({"pd_services_watchdog_s": "60\nUser=root"}, "pd_services_watchdog_s='60\\nUser=root': must be",
                 id="role_watchdog"),
    pytest.param({"pdnode_x\ny": 1}, "'pdnode_x\\ny'=1: is not a variable this bundle knows", id="unknown_name_newline"),
    # instance keys: the name becomes a unit and file name, ports and GPU ids reach argv
    pytest.param({"prefill[0]": {"name": "a/../../etc"}},
                 "pdnode_prefill_instances[0].name='a/../../etc': must be 1-12 characters a-z 0-9", id="name_path"),
    pytest.param({"prefill[0]": {"name": "%i"}}, "pdnode_prefill_instances[0].name='%i': must be", id="name_specifier"),
    pytest.param({"decode[0]": {"name": "d\nExecStartPre=+/bin/touch /run/pwned"}},
                 "pdnode_decode_instances[0].name='d\\nExecStartPre=+/bin/touch /run/pwned': contains a control "
                 "character", id="name_newline"),
    pytest.param({"prefill[0]": {"port": "30000 --x"}}, "pdnode_prefill_instances[0].port='30000 --x': must be an "
                 "integer", id="port_text"),
    pytest.param({"prefill[0]": {"gpus": ["0", "1", "2", "3"]}},
                 "pdnode_prefill_instances[0].gpus=['0', '1', '2', '3']: must be a list of integers", id="gpus_text"),
    pytest.param({"prefill[0]": {"extra_args": {"chunked_prefill_size\nx": 1}}},
                 "pdnode_prefill_instances[0].extra_args='chunked_prefill_size\\nx': contains a control character",
                 id="extra_key_newline"),
]

SMG = {"pdnode_router_package": "smg"}
# Issue 17, section 7: what the router would refuse, or what opens a door (all accepted
# before). The router's own verdicts come from the installed package (pdnode.core.rules.router_judge);
# the doors are pdnode.guards' (docs/security.md, "What opens a door").
ROUTER_REFUSES = [
    pytest.param({**R032, "pdnode_router_extra_args": {"jwt_issuer": "https://idp.example"}},
                 "pdnode_router_extra_args.jwt_issuer='https://idp.example': sglang-router 0.3.2 refuses it: jwt_issuer "
                 "must not be in the router JSON", id="router_jwt_issuer"),
    pytest.param({**R032, "pdnode_router_extra_args": {"postgres_db_url": "postgres://pd:SECRET@db.example/pd"}},
                 "pdnode_router_extra_args.postgres_db_url='postgres://<hidden>@db.example/pd': sglang-router 0.3.2 "
                 "refuses it: postgres_db_url must not be in the router JSON", id="router_postgres_url"),
    pytest.param({**R032, "pdnode_router_extra_args": {"redis_url": "redis://:SECRET@cache.example:6379/0"}},
                 "pdnode_router_extra_args.redis_url='redis://<hidden>@cache.example:6379/0': sglang-router 0.3.2 "
                 "refuses it: redis_url must not be in the router JSON", id="router_redis_url"),
    pytest.param({**SMG, "pdnode_router_extra_args": {"jwt_issuer": "https://idp.example"}},
                 "pdnode_router_extra_args.jwt_issuer='https://idp.example': smg 1.13.0 refuses it", id="smg_jwt_issuer"),
    # the package's own parser and pre-start steps, not a table of pdnode's
    pytest.param({**R032, "pdnode_router_extra_args": {"retry_max_retries": -5}},
                 "pdnode_router_extra_args.retry_max_retries=-5: sglang-router 0.3.2 refuses it: OverflowError",
                 id="router_negative_retries"),
    pytest.param({**R032, "pdnode_router_extra_args": {"history_backend": "redis"}},
                 "pdnode_router_extra_args.history_backend='redis': sglang-router 0.3.2 refuses it: TypeError",
                 id="router_history_without_url"),
    pytest.param({**SMG, "pdnode_router_extra_args": {"history_backend": "redis"}},
                 "pdnode_router_extra_args.history_backend='redis': smg 1.13.0 refuses it: TypeError",
                 id="smg_history_without_url"),
]
DOORS = [
    pytest.param({**R032, "pdnode_router_extra_args": {"mini_lb": True}},
                 "pdnode_router_extra_args.mini_lb=True: opens a door: replaces the router with sglang-router's Python "
                 "mini load balancer, which checks neither the API key nor the admin key", id="router_mini_lb"),
    pytest.param({**SMG, "pdnode_router_extra_args": {"enable_mesh": True}},
                 "pdnode_router_extra_args.enable_mesh=True: opens a door: turns on smg's mesh", id="smg_enable_mesh"),
    pytest.param({**SMG, "pdnode_router_extra_args": {"mesh_host": "0.0.0.0"}},
                 "pdnode_router_extra_args.mesh_host='0.0.0.0': opens a door: configures smg's mesh", id="smg_mesh_host"),
    pytest.param({**SMG, "pdnode_router_extra_args": {"enable_wasm": True}},
                 "pdnode_router_extra_args.enable_wasm=True: opens a door: lets smg run WebAssembly", id="smg_enable_wasm"),
    pytest.param({"pdnode_router_extra_args": {"otlp_traces_endpoint": "collector.example:4317"}},
                 "pdnode_router_extra_args.otlp_traces_endpoint='collector.example:4317': opens a door: exports",
                 id="router_otlp"),
    pytest.param({"prefill[0]": {"extra_args": {"decoupled_spec_bind_endpoint": "tcp://0.0.0.0:5555"}}},
                 "pdnode_prefill_instances[0].extra_args.decoupled_spec_bind_endpoint='tcp://0.0.0.0:5555': opens a "
                 "door: binds a ZMQ listener", id="engine_decoupled_spec_bind"),
    pytest.param({"prefill[0]": {"extra_args": {"otlp_traces_endpoint": "http://otel:SECRET@collector.example:4317"}}},
                 "pdnode_prefill_instances[0].extra_args.otlp_traces_endpoint='http://<hidden>@collector.example:4317'"
                 ": opens a door: exports request traces to another host", id="engine_otlp"),
    pytest.param({"pdnode_model_load_format": "remote"},
                 "pdnode_model_load_format='remote': opens a door: loads the weights from a remote store",
                 id="load_format_remote"),
    pytest.param({"pdnode_model_load_format": "remote_instance"},
                 "pdnode_model_load_format='remote_instance': opens a door: loads the weights from another running "
                 "instance", id="load_format_remote_instance"),
    pytest.param({"decode[0]": {"extra_args": {"remote_instance_weight_loader_seed_instance_ip": "10.0.0.5"}}},
                 "pdnode_decode_instances[0].extra_args.remote_instance_weight_loader_seed_instance_ip='10.0.0.5': "
                 "opens a door", id="engine_remote_weights_seed"),
    pytest.param({"prefill[0]": {"extra_args": {"remote_instance_weight_loader_start_seed_via_transfer_engine": True}}},
                 "pdnode_prefill_instances[0].extra_args.remote_instance_weight_loader_start_seed_via_transfer_engine="
                 "True: opens a door: serves this instance's weights", id="engine_weights_seed_server"),
    pytest.param({"prefill[0]": {"extra_args": {"kv_events_config": '{"publisher": "zmq"}'}}},
                 "pdnode_prefill_instances[0].extra_args.kv_events_config='{\"publisher\": \"zmq\"}': opens a door: "
                 "publishes KV-cache events", id="engine_kv_events_wildcard"),
    pytest.param({"decode[0]": {"extra_args": {"grpc_mode": True}}},
                 "pdnode_decode_instances[0].extra_args.grpc_mode=True: opens a door: serves SGLang's gRPC API, which "
                 "checks no API key", id="engine_grpc"),
    pytest.param({"prefill[0]": {"extra_args": {"tool_server": "demo"}}},
                 "pdnode_prefill_instances[0].extra_args.tool_server='demo': opens a door", id="engine_tool_server"),
    pytest.param({"pdnode_allow_exposing_args": ["otlp_endpoint"]},
                 "pdnode_allow_exposing_args[0]='otlp_endpoint': is not an argument the plan refuses as opening a door",
                 id="allow_unknown_name"),
]
REFUSED.extend(ROUTER_REFUSES + DOORS)
# Issue 17, section 4: no value into a command line. Python's ip_address takes any text
# after an IPv6 zone id's '%'; such a host reached the router unit's ExecStartPost
# unquoted, where a lone ';' starts a new command and '+' runs it as root.
ZONE_PAYLOAD = '::%a --help ; +sh -c "id > pwned" ; echo x'
EXEC_VALUES = [
    pytest.param({"pdnode_router_host": ZONE_PAYLOAD}, f"pdnode_router_host={ZONE_PAYLOAD!r}: is an address with an "
                 "IPv6 zone id", id="router_host_zone_payload"),
    pytest.param({"pdnode_router_host": "fe80::1%eth0"}, "pdnode_router_host='fe80::1%eth0': is an address with an "
                 "IPv6 zone id", id="router_host_zone"),
    pytest.param({"pdnode_router_metrics_host": "::1%lo ; +/bin/sh -c id"},
                 "pdnode_router_metrics_host='::1%lo ; +/bin/sh -c id': is an address with an IPv6 zone id",
                 id="metrics_host_zone"),
    pytest.param({"pdnode_worker_host": "::1%a ; +\\x2fbin\\x2fsh"},
                 "pdnode_worker_host='::1%a ; +\\\\x2fbin\\\\x2fsh': is an address with an IPv6 zone id",
                 id="worker_host_zone"),
    pytest.param({"pdnode_worker_host": "-h"}, "pdnode_worker_host='-h': must be an IP address or a DNS name",
                 id="worker_host_option"),
    pytest.param({"pdnode_node_address": "fe80::2%$(id)"},
                 "pdnode_node_address='fe80::2%$(id)': is an address with an IPv6 zone id", id="node_address_zone"),
]
# Issue 17, section 5: role values that reach root (pip's virtualenv_command, a file root
# writes, directories root creates and the service user owns).
ROLE_VALUES = [
    pytest.param({"sglang_python": "sh -c 'touch /tmp/pwned' x"},
                 "sglang_python=\"sh -c 'touch /tmp/pwned' x\": must be python3 or python3.N", id="sglang_python_shell"),
    pytest.param({"mooncake_python": "sh -c 'touch /tmp/pwned' x"},
                 "mooncake_python=\"sh -c 'touch /tmp/pwned' x\": must be python3", id="mooncake_python_shell"),
    pytest.param({"sglang_python": "python3 -I"}, "sglang_python='python3 -I': must be", id="sglang_python_option"),
    pytest.param({"rdma_limits_file": "/etc/sudoers"}, "rdma_limits_file='/etc/sudoers': must be a .conf file directly "
                 "in /etc/security/limits.d", id="rdma_limits_sudoers"),
    pytest.param({"rdma_limits_file": "/etc/security/limits.d/../../sudoers.d/x.conf"},
                 "rdma_limits_file='/etc/security/limits.d/../../sudoers.d/x.conf': must be", id="rdma_limits_dotdot"),
    pytest.param({"rdma_packages": ["rdma-core", "--allow-unauthenticated"]},
                 "rdma_packages[1]='--allow-unauthenticated': must list Debian package names", id="rdma_packages_option"),
    pytest.param({"sglang_sim_packages": ["aiohttp", "--index-url=http://mirror.invalid/simple"]},
                 "sglang_sim_packages[1]='--index-url=http://mirror.invalid/simple': must list package names",
                 id="sim_packages_option"),
    pytest.param({"mooncake_system_packages": ["libnuma1 --allow-downgrades"]},
                 "mooncake_system_packages[0]='libnuma1 --allow-downgrades': must list Debian package names",
                 id="mooncake_packages_option"),
    pytest.param({"mooncake_wheelhouse_dest": "/etc/cron.hourly"},
                 "mooncake_wheelhouse_dest='/etc/cron.hourly': must be an absolute, normalized host path",
                 id="wheelhouse_dest_cron"),
    pytest.param({"mooncake_versions": {"cuda12": "0.3.13 --pre"}},
                 "mooncake_versions.cuda12='0.3.13 --pre': must map each build to a release number", id="mooncake_versions"),
    pytest.param({"nvidia_driver_extra_packages": ["--allow-unauthenticated"]},
                 "nvidia_driver_extra_packages[0]='--allow-unauthenticated': must list Debian package names",
                 id="nvidia_packages_option"),
    pytest.param({"monitoring_dcgm_exporter_listen_address": "127.0.0.1:9400 -r x"},
                 "monitoring_dcgm_exporter_listen_address='127.0.0.1:9400 -r x': must be HOST:PORT", id="dcgm_listen"),
    pytest.param({"pd_services_device_policy": "maybe"}, "pd_services_device_policy='maybe': must be true or false",
                 id="device_policy_text"),
    *[pytest.param({name: path}, f"{name}='{path}': is a system directory or lies in one", id=f"{name[7:]}_{label}")
      for name, path, label in [
          ("pdnode_config_dir", "/etc/systemd/system", "systemd"), ("pdnode_install_root", "/usr/local/bin", "usr_bin"),
          ("pdnode_install_root", "/usr/local/sglang-pd", "usr_local"), ("pdnode_config_dir", ROOT_SSH, "root_ssh"),
          ("pdnode_config_dir", "/home/ops/.ssh", "home_ssh"), ("pdnode_install_root", "/home/ops", "home"),
          ("pdnode_config_dir", "/etc/cron.hourly", "cron_hourly"), ("pdnode_config_dir", "/etc/cron.weekly/x", "cron"),
          ("pdnode_config_dir", "/etc/sudoers.d", "sudoers_d"), ("pdnode_install_root", "/var/spool/cron", "spool"),
          ("pdnode_install_root", "/boot/efi", "boot"), ("pdnode_config_dir", "/etc/ssh/sshd_config.d", "ssh"),
          ("pdnode_config_dir", "/etc/security/limits.d", "security"), ("pdnode_install_root", "/var/lib/systemd", "var_lib"),
          ("pdnode_install_root", "/proc/self", "proc"), ("pdnode_install_root", "/sys/kernel", "sys"),
          ("pdnode_install_root", "/dev/shm", "dev"), ("pdnode_config_dir", "/etc/pam.d", "pam")]],
]
REFUSED.extend(EXEC_VALUES + ROLE_VALUES)



@pytest.mark.parametrize(("changes", "start"), REFUSED)
def test_hostile_value_is_refused_with_one_line(gpu01_vars, changes, start):
    problems = _problems(gpu01_vars, changes)
    assert len(problems) == 1, problems
    line = problems[0]
    assert line.startswith(start), line
    assert "\n" not in line and "\x1b" not in line and ". Fix: " in line
    assert len(line) < 1000  # a 2 MB value is shortened, not printed
    assert "SECRET" not in line and "S3CRET" not in line  # secrets are not echoed


ACCEPTED = [
    pytest.param({"pdnode_model_served_name": "org/Model-Name_v1.5-fp8"}, id="served_realistic"),
    pytest.param({"pdnode_service_user": "_sglang-pd1"}, id="user"),
    pytest.param({"pdnode_service_prefix": "pd-node2"}, id="prefix"),
    pytest.param({"pdnode_install_root": "/srv/ai/sglang-pd", "pdnode_config_dir": "/etc/sglang-pd.d"}, id="paths"),
    pytest.param({"pdnode_model_path": "/models/Qwen2.5-7B-Instruct"}, id="model_path"),
    pytest.param({"pdnode_engine_environment": {"SGLANG_DISAGGREGATION_QUEUE_SIZE": 8,
                                                "MC_TCP_BIND_ADDRESS": "10.0.0.1", "NCCL_IB_HCA": "mlx5_0,mlx5_1",
                                                "MC_TE_METRIC": True}}, id="environment"),
    pytest.param({"prefill[0]": {"extra_args": {"chunked_prefill_size": 8192, "watchdog_timeout": 600,
                                                "dtype": "bfloat16", "enable_metrics_for_all_schedulers": True,
                                                "json_model_override_args": {"a": 1}}}}, id="extra_args"),
    pytest.param({"prefill[0]": {"name": "a"}, "decode[0]": {"name": "d2"}}, id="instance_names"),
    pytest.param({"decode[0]": {"extra_args": {"moe_a2a_backend": "none"}}}, id="extra_choice"),
    pytest.param({"pdnode_router_extra_args": {"retry_max_retries": 3, "log_level": "info",
                                               "request_timeout_secs": 600}}, id="router_extra"),
    pytest.param({"pdnode_router_host": "node1.example.net", "pdnode_router_metrics_host": "::1"}, id="hosts"),
    pytest.param({"pdnode_gpu_model": "NVIDIA A100-SXM4-80GB"}, id="gpu_model"),
    pytest.param({"pd_services_limit_memlock": "8M", "pd_services_limit_nofile": "infinity",
                  "pd_services_ready_timeout_s": 60, "rdma_memlock_limit": 65536}, id="role_values"),
    pytest.param({"pdnode_mooncake_version": "0.3.13.post1", "pdnode_wheelhouse": "../wheels/x86_64"}, id="versions"),
    # on loopback or local IPC nothing opens beyond the host
    pytest.param({"prefill[0]": {"extra_args": {"otlp_traces_endpoint": "localhost:4317",
                                                "decoupled_spec_bind_endpoint": "tcp://127.0.0.1:5555",
                                                "kv_events_config": '{"publisher": "zmq", "endpoint": "ipc:///run/kv"}'}},
                  "decode[0]": {"extra_args": {"decoupled_spec_connect_endpoints": ["tcp://[::1]:5555"]}}},
                 id="loopback_endpoints"),
    pytest.param({"pdnode_router_extra_args": {"history_backend": "memory", "retry_max_retries": 3}},
                 id="router_extra_the_router_accepts"),
]


ACCEPTED.extend([
    # issue 17: what stays accepted beside the refused values
    pytest.param({"pdnode_router_host": "::", "pdnode_router_metrics_host": "::1", "pdnode_worker_host": "::1",
                  "pdnode_node_address": "fd00::11"}, id="ipv6_without_zone"),
    pytest.param({"pdnode_install_root": "/opt/sglang-pd", "pdnode_config_dir": "/etc/sglang-pd"}, id="default_paths"),
    pytest.param({"pdnode_install_root": "/var/lib/sglang-pd/releases", "pdnode_config_dir": "/home/ops/sglang-pd"},
                 id="paths_under_parents"),
    pytest.param({"sglang_python": "/usr/bin/python3.11", "mooncake_python": "python3",
                  "rdma_limits_file": "/etc/security/limits.d/91-sglang.conf", "rdma_packages": ["rdma-core", "perftest"],
                  "sglang_sim_packages": ["aiohttp", "prometheus-client==0.21.1"],
                  "mooncake_versions": {"cuda12": "0.3.13.post1", "cuda13": "0.3.14"},
                  "mooncake_wheelhouse_dest": "/opt/sglang-pd/wheelhouse-mooncake", "pd_services_device_policy": True},
                 id="role_values_issue_17"),
])


@pytest.mark.parametrize("changes", ACCEPTED)
def test_realistic_values_pass(gpu01_vars, changes):
    assert _problems(gpu01_vars, changes) == []


@pytest.mark.parametrize(("changes", "lines"), [
    pytest.param({**SMG, "pdnode_router_extra_args": {"enable_mesh": True, "mesh_host": "10.0.0.1"},
                  "pdnode_allow_exposing_args": ["enable_mesh", "mesh_*"]}, 2, id="smg_mesh"),
    pytest.param({"prefill[0]": {"extra_args": {"otlp_traces_endpoint": "collector.example:4317"}},
                  "decode[0]": {"extra_args": {"otlp_traces_endpoint": "collector.example:4317"}},
                  "pdnode_allow_exposing_args": ["otlp_traces_endpoint"]}, 2, id="otlp"),
    pytest.param({"pdnode_model_load_format": "remote_instance", "pdnode_allow_exposing_args": ["load_format"]}, 1,
                 id="load_format"),
])
def test_an_allowed_door_passes_with_a_warning_each(gpu01_vars, changes, lines):
    plan = build_plan(changed(gpu01_vars, changes))
    warned = [str(w) for w in plan.warnings if w.rule_id == "exposing-arg-allowed"]
    assert len(warned) == lines and all("opens a door" in w and "allowed by pdnode_allow_exposing_args" in w
                                        for w in warned), warned


# Issue 17, section 6: pdnode_api_key_file is copied to every node, owned by the service
# user; only a file holding exactly one key passes. The content is never echoed.
NOT_ONE_KEY = {
    "ssh_private_key": (b"-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmUSECRET\n"
                        b"-----END OPENSSH PRIVATE KEY-----\n", "holds a private key or a certificate (PEM)"),
    "aws_credentials": (b"[default]\naws_access_key_id = AKIASECRET\naws_secret_access_key = SECRETSECRET\n",
                        "holds 3 lines"),
    "two_keys": (b"SECRET-one-0123456789\nSECRET-two-0123456789\n", "holds 2 lines"),
    "short": (b"SECRET12\n", "holds a key of 8 characters; a key has at least 16"),
    "space": (b"SECRET key 0123456789\n", "holds a character that is not printable ASCII or a space"),
    "non_ascii": ("SECRET-0123456789-\u00e9\n".encode(), "holds a character that is not printable ASCII"),
    "empty": (b"", "is empty"),
    "long": (b"SECRET" * 1000, "holds 6000 characters; a key has at most 4096"),
}


def _key_problems(gpu01_vars, path) -> list[str]:
    return _problems(gpu01_vars, {"pdnode_api_key_file": str(path)})


@pytest.mark.parametrize("name", sorted(NOT_ONE_KEY))
def test_a_key_file_that_is_not_one_key_is_one_line_without_its_content(gpu01_vars, tmp_path, name):
    content, why = NOT_ONE_KEY[name]
    f = tmp_path / "key"
    f.write_bytes(content)
    (line,) = _key_problems(gpu01_vars, f)
    assert line.startswith(f"pdnode_api_key_file='{f}': {why}"), line
    assert "SECRET" not in line and "AKIA" not in line and "its content is not shown" in line, line


def test_a_private_key_named_by_a_relative_path_is_refused(gpu01_vars, tmp_path):
    """`../../../home/ops/.ssh/id_ed25519`: relative to the repository root, as the deploy reads it."""
    key = tmp_path / "home" / "ops" / ".ssh" / "id_ed25519"
    key.parent.mkdir(parents=True)
    key.write_bytes(NOT_ONE_KEY["ssh_private_key"][0])
    rel = os.path.relpath(key, ROOT)
    assert rel.startswith("../")
    (line,) = _key_problems(gpu01_vars, rel)
    assert line.startswith(f"pdnode_api_key_file='{rel}': holds a private key"), line


def test_a_key_file_that_is_not_a_file_is_refused_without_waiting(gpu01_vars, tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # opened without blocking: a FIFO planted there must not hang the check
    assert "is not a regular file" in _key_problems(gpu01_vars, fifo)[0]
    assert "is not a regular file" in _key_problems(gpu01_vars, tmp_path)[0]


@pytest.mark.parametrize("content", [b"0123456789abcdef", b"pd-" + b"a1" * 32 + b"\n", b"K3y!~\\x41'\"q%2F+/&=0123\r\n"])
def test_a_file_holding_one_key_passes(gpu01_vars, tmp_path, content):
    f = tmp_path / "key"
    f.write_bytes(content)
    assert _key_problems(gpu01_vars, f) == []


def test_a_key_file_not_there_yet_is_the_deploys_to_report(gpu01_vars, tmp_path):
    # inventories are checked where the keys are not; the role asserts it before writing
    assert _key_problems(gpu01_vars, tmp_path / "absent") == []


def test_the_router_verdict_is_cached_by_what_was_asked(gpu01_vars, tmp_path, monkeypatch):
    """The package is asked once per router JSON: a second check reads the verdict."""
    from pdnode.node import router_launch

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    v = changed(gpu01_vars, {"pdnode_router_extra_args": {"retry_max_retries": -5}})
    first = _problems(v, {})
    assert len(first) == 1 and "refuses it: OverflowError" in first[0]
    cached = list((tmp_path / "pdnode" / "router-verdicts").iterdir())
    assert len(cached) == 1 and oct(cached[0].parent.stat().st_mode & 0o777) == "0o700"

    def not_asked(*args, **kwargs):
        raise AssertionError("the package was asked again")
    monkeypatch.setattr(router_launch, "judge", not_asked)
    assert _problems(v, {}) == first
    # another value is another question (and this one the router accepts)
    monkeypatch.undo()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert _problems(gpu01_vars, {"pdnode_router_extra_args": {"retry_max_retries": 5}}) == []
    assert len(list((tmp_path / "pdnode" / "router-verdicts").iterdir())) == 2


def test_router_argument_table_is_the_installed_router():
    """src/pdnode/data/routerargs-0.3.2.json is sglang-router's own parser (in .venv)."""
    from importlib.metadata import version

    # not a skip: sglang-router is pinned in .venv, which scripts/setup makes
    try:
        import sglang_router  # noqa: F401
    except ImportError as exc:
        raise AssertionError(f"{exc}: sglang-router is missing; run scripts/setup (it installs .venv)") from None

    assert version("sglang-router") == "0.3.2"
    committed = json.loads((ROOT / "src/pdnode/data/routerargs-0.3.2.json").read_text())
    assert committed["args"] == json.loads(argtable.dump(argtable.router_table(), ""))["args"], (
        "regenerate: .venv/bin/python -m pdnode.core.rules.argtable router > src/pdnode/data/routerargs-0.3.2.json")


def test_every_owned_router_argument_exists_in_the_table():
    """The plan's own router arguments are real ones (a rename would otherwise pass)."""
    from pdnode.core.plan.build import OWNED_ROUTER_ARGS

    table = argtable.load(argtable.ROUTER_TABLE)
    assert sorted(set(OWNED_ROUTER_ARGS) - set(table)) == []


def test_every_owned_server_argument_exists_in_the_table():
    """The plan writes these itself; each must be a real flag of SGLang 0.5.23 (a rename
    in SGLang would otherwise pass the plan and fail at start)."""
    from pdnode.core.rules.instances import OWNED_SERVER_ARGS

    table = argtable.load(argtable.SGLANG_TABLE)
    assert sorted(set(OWNED_SERVER_ARGS) - set(table)) == []


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "pdnode.commands.cli", *args], check=False, capture_output=True, text=True,
                          cwd=ROOT, timeout=30)


def _inventory_with(tmp_path, content: bytes) -> Path:
    inv = tmp_path / "inv"
    shutil.copytree(GPU01, inv)
    (inv / "group_vars" / "all" / "zz-extra.yml").write_bytes(content)
    return inv


def test_cli_non_utf8_var_file_exits_2_with_one_line(tmp_path):
    inv = _inventory_with(tmp_path, b"---\npdnode_model_served_name: caf\xe9\n")
    r = _cli("check", str(inv))
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "zz-extra.yml: not UTF-8 text (byte 0xe9" in lines[0], r.stderr


def test_cli_refuses_the_issue_reproductions(tmp_path):
    """The values of issue 9 item 2 (all accepted before): exit 1, one line each."""
    inv = _inventory_with(tmp_path, (
        b"---\npd_services_limit_memlock: \"8M\\nExecStartPre=+/bin/touch /run/pwned\"\n"
        b"pdnode_service_user: '%u'\npdnode_config_dir: /etc\n"
        b"pdnode_model_served_name: \"m\\nExecStartPre=+/bin/touch /run/pwned\"\n"
        b"pdnode_router_extra_args: {api-key: SECRET}\n"
        b"pdnode_prefill_instances:\n"
        b"  - {gpus: [0, 1, 2, 3], extra_args: {lora_paths: [a, --host, 0.0.0.0, --api-key, KEY]}}\n"
        b"pdnode_decode_instances:\n"
        b"  - gpus: [4, 5, 6, 7]\n    attn_dp_size: 4\n"
        b"    extra_args: {moe_a2a_backend: bogus, chunked_prefill_size: abc}\n"))
    r = _cli("check", str(inv))
    assert r.returncode == 1, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert "8 problems" in lines[0], r.stderr
    assert len(lines) == 9 and "SECRET" not in r.stderr and "Traceback" not in r.stderr


def test_cli_refuses_the_issue_17_reproductions(tmp_path):
    """Issue 17 sections 6 and 7 in one inventory: exit 1, one line per value, no secret.
    The router is asked only once everything else holds, so its verdict is a second run."""
    key = tmp_path / "id_ed25519"
    key.write_bytes(NOT_ONE_KEY["ssh_private_key"][0])
    inv = _inventory_with(tmp_path, (
        f"---\npdnode_api_key_file: {key}\n"
        "pdnode_router_package: sglang-router\n"
        "pdnode_router_extra_args: {mini_lb: true}\n"
        "pdnode_model_load_format: remote\n"
        "pdnode_prefill_instances:\n"
        "  - gpus: [0, 1, 2, 3]\n"
        "    extra_args: {decoupled_spec_bind_endpoint: 'tcp://0.0.0.0:5555',\n"
        "                 otlp_traces_endpoint: 'http://otel:SECRET@collector.example:4317'}\n").encode())
    r = _cli("check", str(inv))
    assert r.returncode == 1, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert "5 problems" in lines[0] and len(lines) == 6, r.stderr
    assert "SECRET" not in r.stderr and "Traceback" not in r.stderr
    (inv / "group_vars" / "all" / "zz-extra.yml").write_text(
        "---\npdnode_router_package: sglang-router\n"
        "pdnode_router_extra_args: {jwt_issuer: 'https://idp.example', postgres_db_url: "
        "'postgres://pd:SECRET@db.example/pd', retry_max_retries: -5}\n")
    r = _cli("check", str(inv))
    assert r.returncode == 1, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert "3 problems" in lines[0] and len(lines) == 4 and all("sglang-router 0.3.2 refuses it" in x for x in lines[1:])
    assert "SECRET" not in r.stderr and "Traceback" not in r.stderr


def test_cli_refuses_the_issue_17_section_4_and_5_reproductions(tmp_path):
    """Issue 17 sections 4 and 5, as the issue wrote them (all accepted before): exit 1,
    one line per value, nothing else; then the hardening switch alone: exit 0, one warning."""
    inv = _inventory_with(tmp_path, (
        b"---\n"
        b"pdnode_router_host: '::%a --help ; +sh -c \"id > pwned\" ; echo x'\n"
        b"pdnode_router_metrics_host: '::1%lo ; +/bin/sh'\n"
        b"pdnode_worker_host: '::1%lo ; +/bin/sh'\n"
        b"pdnode_node_address: 'fe80::2%eth0 ; +/bin/sh'\n"
        b"sglang_python: \"sh -c 'touch /tmp/pwned' x\"\n"
        b"mooncake_python: \"sh -c 'touch /tmp/pwned' x\"\n"
        b"rdma_limits_file: /etc/sudoers\n"
        b"pdnode_config_dir: /etc/systemd/system\n"
        b"pdnode_install_root: /usr/local/bin\n"))
    r = _cli("check", str(inv))
    assert r.returncode == 1, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert "9 problems" in lines[0] and len(lines) == 10, r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""
    (inv / "group_vars" / "all" / "zz-extra.yml").write_text("---\npd_services_device_policy: false\n")
    r = _cli("check", str(inv))
    assert r.returncode == 0, r.stdout + r.stderr
    warned = [x for x in r.stderr.splitlines() if "pd_services_device_policy" in x]
    assert len(warned) == 1 and warned[0].startswith("warning: pd_services_device_policy=False: turns off"), r.stderr


ROLE_CASES = {
    "pd_services": (
        {"pd_services_limit_memlock": "infinity", "pd_services_limit_nofile": 1048576,
         "pd_services_ready_timeout_s": 1800, "pd_services_watchdog_s": 0},
        {"memlock_inject": {"pd_services_limit_memlock": INJECT},
         "memlock_unit": {"pd_services_limit_memlock": "8MB"},
         "memlock_newline": {"pd_services_limit_memlock": "8M\n"},
         "nofile_inject": {"pd_services_limit_nofile": "1024\nUser=root"},
         "timeout_arg": {"pd_services_ready_timeout_s": "60 --x"},
         "timeout_zero": {"pd_services_ready_timeout_s": 0},
         "watchdog_inject": {"pd_services_watchdog_s": "60\nUser=root"},
         "key_file_option": {"pd_services_api_key_file": "--src=/etc/shadow"}}),
    "rdma": (
        {"rdma_memlock_users": ["sglang", "@rdma"], "rdma_memlock_limit": "unlimited"},
        {"users_inject": {"rdma_memlock_users": ["sglang\n*"]},
         "users_space": {"rdma_memlock_users": ["sglang hard"]},
         "limit_inject": {"rdma_memlock_limit": "unlimited\n* hard nofile 1"},
         # issue 17, section 5: a file root writes, packages apt installs
         "limits_sudoers": {"rdma_limits_file": "/etc/sudoers"},
         "limits_unit": {"rdma_limits_file": "/etc/systemd/system/x.conf"},
         "packages_option": {"rdma_packages": ["rdma-core", "--allow-unauthenticated"]}}),
    # issue 17, section 5: pip's virtualenv_command, pip and apt names, paths root writes
    "sglang": (
        # the release's values are required (the playbooks pass the plan's): the good ones here
        {"sglang_python": "/usr/bin/python3.11", "sglang_sim_packages": ["aiohttp"],
         "sglang_venv": "/opt/sglang-pd/venvs/test-release", "sglang_router_venv": "/opt/sglang-pd/venvs/test-router",
         "sglang_version": releases.SGLANG, "sglang_router_requirement": f"smg=={releases.SMG}",
         "sglang_mooncake_version": releases.MOONCAKE},
        {"python_shell": {"sglang_python": "sh -c 'touch /tmp/pwned' x"},
         "python_option": {"sglang_python": "python3 -I"},
         "sim_package_option": {"sglang_sim_packages": ["aiohttp", "--index-url=http://mirror.invalid/simple"]},
         "system_package_option": {"sglang_sim_system_packages": ["libnuma1", "-oAPT::x=1"]},
         "venv_system": {"sglang_venv": "/usr/local/bin"},
         "root_cron": {"sglang_install_root": "/etc/cron.hourly"},
         "version_option": {"sglang_version": "0.5.23 --pre"},
         "requirement_url": {"sglang_router_requirement": "sglang-router @ https://x.invalid/a.whl"},
         "wheelhouse_option": {"sglang_wheelhouse": "-r evil"}}),
    "mooncake": (
        {"mooncake_python": "python3.12", "mooncake_stack_cuda": "13"},
        {"python_shell": {"mooncake_python": "sh -c 'touch /tmp/pwned' x"},
         "stack_cuda": {"mooncake_stack_cuda": "13; x"},
         "versions_option": {"mooncake_versions": {"non-cuda": "0.3.13 --pre", "cuda12": "0.3.13.post1",
                                                   "cuda13": "0.3.14"}},
         "venv_ssh": {"mooncake_venv": ROOT_SSH},
         "dest_cron": {"mooncake_wheelhouse_dest": "/etc/cron.hourly"},
         "packages_option": {"mooncake_system_packages": ["--allow-downgrades"]}}),
    # the wheelhouse both install roles unpack: a controller path, a host directory root empties
    "wheelhouse": (
        {"wheelhouse_src": "wheels/x86_64", "wheelhouse_dest": "/opt/sglang-pd/wheelhouse"},
        {"src_option": {"wheelhouse_src": "-r evil"},
         "dest_cron": {"wheelhouse_dest": "/etc/cron.hourly"},
         "dest_dotdot": {"wheelhouse_dest": "/opt/sglang-pd/../../etc"}}),
    "nvidia_driver": (
        {"nvidia_driver_version": "580.159.04", "nvidia_driver_repo_base_url": "https://mirror.example/cuda/repos",
         "nvidia_driver_repo_key_name": "3bf863cc.pub", "nvidia_driver_extra_packages": ["datacenter-gpu-manager"]},
        {"version_option": {"nvidia_driver_version": "580 -o Debug::pkgProblemResolver=1"},
         "url_field": {"nvidia_driver_repo_base_url": "https://mirror.example/repos\nTrusted: yes"},
         "url_space": {"nvidia_driver_repo_base_url": "https://mirror.example/a b"},
         "key_path": {"nvidia_driver_repo_key_name": "../../key"},
         "package_option": {"nvidia_driver_extra_packages": ["--allow-unauthenticated"]},
         "key_file_newline": {"nvidia_driver_repo_key_file": "keys/cuda.pub\nTrusted: yes"}}),
}


@pytest.mark.parametrize("role", sorted(ROLE_CASES))
def test_the_role_refuses_an_injection_in_its_own_values(tmp_path, role):
    """roles/<role>/tasks/validate.yml: the role's own variables (not pdnode_*) are
    checked before anything is written. One local run, one inventory host per case."""
    ansible = Path(sys.executable).parent / "ansible-playbook"
    if not ansible.exists():
        pytest.fail("ansible-playbook is not beside this Python (run the suite with .venv/bin/python)")
    good, cases = ROLE_CASES[role]
    hosts = {name: {"ansible_connection": "local", "ansible_python_interpreter": sys.executable, **good, **bad}
             for name, bad in {"ok": {}, **cases}.items()}
    (tmp_path / "hosts.json").write_text(json.dumps({"all": {"hosts": hosts}}))
    # include_role: the role's defaults apply below the hosts' values, as in a play
    (tmp_path / "p.yml").write_text(
        "- hosts: all\n  gather_facts: false\n  tasks:\n"
        f"    - ansible.builtin.include_role: {{name: {ROOT}/roles/{role}, tasks_from: validate.yml}}\n")
    env = {"PATH": f"{ansible.parent}:/usr/bin:/bin", "HOME": str(tmp_path), "ANSIBLE_STDOUT_CALLBACK": "json",
           "ANSIBLE_LOCALHOST_WARNING": "0", "ANSIBLE_FILTER_PLUGINS": str(ROOT / "plugins" / "filter")}
    r = subprocess.run([str(ansible), "-i", str(tmp_path / "hosts.json"), str(tmp_path / "p.yml")],
                       check=False, capture_output=True, text=True, env=env, timeout=300)
    report = json.loads(r.stdout)
    failed = {}
    for task in report["plays"][0]["tasks"]:
        for host, result in task["hosts"].items():
            if result.get("failed"):
                # a loop's result holds one result per item: the failed items' messages
                msgs = [x.get("msg", "") for x in result.get("results", [])
                        if x.get("failed") or x.get("evaluated_to") is False] or [result.get("msg", "")]
                failed[host] = next(m for m in msgs if m)
    assert sorted(failed) == sorted(cases), failed
    for host, msg in failed.items():
        name = next(iter(cases[host]))
        assert msg.startswith(f"{name} must") and "\n" not in msg and "fix:" in msg, msg


def test_a_string_from_the_command_line_is_told_how_to_pass_json(gpu01_vars):
    """`ansible-playbook -e pdnode_fast_path=false` hands the plan the string 'false'."""
    (line,) = _problems(gpu01_vars, {"pdnode_fast_path": "false"})
    assert line.startswith("pdnode_fast_path='false': must be true or false"), line
    assert """-e '{"pdnode_fast_path": ...}'""" in line
    (typed,) = _problems(gpu01_vars, {"pdnode_fast_path": [1]})
    assert "-e '{" not in typed  # not a string: no command-line hint
