"""Per-host runbooks (pdnode.commands.runbooks): rendered from templates/runbooks/ with each host's
real units, ports and paths; no key content; a page per alert of the rules template;
shell commands that name only units the plan (or the monitoring role) has; the CLI writes
a host's directory whole or not at all."""

from __future__ import annotations

import copy
import re
import secrets
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from pdnode.core.plan import monitoring
from pdnode.commands import runbooks
from pdnode.commands.cli import main
from pdnode.core.inventory.read import inventory_variables, load_inventory
from pdnode.core.plan.build import build_plan

ROOT = Path(__file__).resolve().parents[1]
INVENTORIES = ["gpu01", "gpu01-2p1d", "demo"]
SH_BLOCK = re.compile(r"^```sh\n(.*?)^```", re.MULTILINE | re.DOTALL)
UNIT_TOKEN = re.compile(r"[A-Za-z0-9][\w.@-]*\.(?:service|target|timer)\b")
SYSTEMCTL_VERBS = {"start", "stop", "restart", "status", "show", "is-active", "reload", "kill"}


def plan_of(inventory: Path | str, host: str | None = None) -> dict:
    hv = load_inventory(inventory, host)
    return build_plan(hv.variables, hv.host).as_dict()


@pytest.fixture(scope="module", params=INVENTORIES)
def rendered(request):
    plan = plan_of(ROOT / "inventories" / request.param)
    return plan, runbooks.render_runbooks(plan, f"inventories/{request.param}")


def sh_blocks(text: str) -> list[str]:
    return [line for block in SH_BLOCK.findall(text) for line in block.splitlines() if line.strip()]


def host_units(plan: dict) -> set[str]:
    """The units the plan runs on its host: its services, and the per-pair probe's beside the router."""
    probe = monitoring.pair_probe(plan)
    return {s["unit"] for s in plan["services"].values()} | ({probe["service"], probe["timer"]} if probe else set())


def unit_references(line: str) -> tuple[set[str], set[str]]:
    """(units, journal identifiers) a shell line names: every *.service/*.target token,
    every argument of `systemctl VERB` and of `journalctl -u/--unit` (a bare name there is a
    unit too: systemd adds .service), and every `--identifier` value."""
    units = set(UNIT_TOKEN.findall(line))
    idents = set()
    for command in re.split(r"[|;]|&&", line):
        words = command.split()
        if words[:1] == ["sudo"]:
            words = words[1:]
        if not words:
            continue
        if words[0] == "systemctl" and len(words) > 1 and words[1] in SYSTEMCTL_VERBS:
            args = words[2:]
            skip = False
            for w in args:
                if skip:
                    skip = False
                elif w in ("-p", "--property"):
                    skip = True
                elif not w.startswith("-") and not w.startswith("#"):
                    units.add(w if w.endswith((".service", ".target", ".timer")) else w + ".service")
                elif w.startswith("#"):
                    break
        if words[0] == "journalctl":
            for flag, value in zip(words, words[1:]):
                if flag in ("-u", "--unit"):
                    units.add(value if value.endswith((".service", ".target", ".timer")) else value + ".service")
                if flag in ("-t", "--identifier"):
                    idents.add(value)
    return units, idents


def test_overview_names_every_unit_port_and_config_path(rendered):
    plan, files = rendered
    readme = files["README.md"]
    for s in plan["services"].values():
        for value in (s["unit"], s["config"], s["env_file"]):
            assert value in readme, f"{value} missing from README.md of {plan['host']}"
    missing = [f"{name}={port}" for name, port in plan["ports"].items() if f"| {port} |" not in readme]
    assert not missing, f"ports missing from the port table: {missing}"
    assert plan["install"]["target"] in readme
    for key in ("api_key_path", "admin_key_path", "config_dir", "venv"):
        assert plan["install"][key] in readme


def test_each_instance_has_its_own_commands(rendered):
    plan, files = rendered
    start_stop, not_serving = files["start-stop.md"], files["node-not-serving.md"]
    for s in plan["services"].values():
        assert f"sudo systemctl restart {s['unit']}" in start_stop
        ident = s["unit"].removesuffix(".service")
        assert f"journalctl -u {s['unit']} --identifier {ident}" in not_serving
        if s["role"] in ("prefill", "decode"):
            assert f"{s['url']}/health" in not_serving
        if s["role"] == "prefill":
            assert f"127.0.0.1:{s['bootstrap_port']}/health" in not_serving
    router = plan["services"]["router"]
    assert f"{router['url']}/readiness" in not_serving
    # The admin key goes through a pipe into curl's stdin (-H @-), never onto argv.
    workers = [l for l in sh_blocks(not_serving) if "/workers" in l]
    assert workers and all(f"sed 's/^/Authorization: Bearer /' {plan['install']['admin_key_path']} | curl" in l
                           and "-H @-" in l for l in workers), workers


def test_restart_coupling_follows_the_plan(rendered):
    plan, files = rendered
    text = files["start-stop.md"]
    bound = [s for s in plan["services"].values() if s.get("bound_to")]
    if bound:
        prefill = next(s for s in plan["services"].values() if s["upholds"])
        assert f"Coupled: {prefill['id']} is the node's one prefill" in text
        for d in bound:
            assert f"Coupled: bound to `{d['bound_to']}`" in text
    else:
        assert "Coupled" not in text
        assert text.count("Not coupled") == sum(s["role"] in ("prefill", "decode") for s in plan["services"].values())


def test_every_alert_of_the_rules_template_has_a_page(rendered):
    plan, files = rendered
    template = yaml.safe_load(monitoring.TEMPLATE.read_text())
    names = [r["alert"] for g in template["groups"] for r in g["rules"] if "alert" in r]
    assert len(names) >= 10
    pages = {name.removeprefix("alerts/").removesuffix(".md") for name in files if name.startswith("alerts/")}
    assert pages == set(names)
    active = set(monitoring.alert_names(monitoring.alert_rules(plan)))
    for name in names:
        page = files[f"alerts/{name}.md"]
        assert f"alert {name} fired" in page
        assert f"](alerts/{name}.md)" in files["README.md"]
        # Marked inactive exactly when this host's rules file lacks the rule.
        assert ("Not active on this host" in page) == (name not in active), name
    # The demo (stand-in engine) has no GPU alerts; gpu01 has every alert.
    if plan["install"]["engine"] == "sim":
        assert {"PdGpuXid", "PdGpuEccError", "PdGpuMetricsMissing"} <= set(names) - active
    else:
        assert active == set(names)


def test_alert_pages_map_labels_to_this_hosts_services(rendered):
    plan, files = rendered
    engines = [s for s in plan["services"].values() if s["role"] in ("prefill", "decode")]
    bootstrap = files["alerts/PdBootstrapFailures.md"]
    for s in engines:
        address = s["url"].removeprefix("http://")
        assert f"| {address} | {s['id']} | `{s['unit']}` |" in bootstrap
    worker = files["alerts/PdWorkerUnhealthy.md"]
    for s in engines:
        assert f"| {s['url']} | {s['id']} | `{s['unit']}` |" in worker
    xid = files["alerts/PdGpuXid.md"]
    for s in engines:
        for g in s["gpus"]:
            assert f"| {g} | {s['id']} | `{s['unit']}` |" in xid
    down = files["alerts/PdTargetDown.md"]
    router = plan["services"]["router"]
    assert router["metrics_url"].removeprefix("http://").removesuffix("/metrics") in down


def test_shell_commands_name_only_units_of_the_plan(rendered):
    plan, files = rendered
    plan_units = host_units(plan)
    allowed = plan_units | {plan["install"]["target"]} | set(runbooks.EXPORTER_UNITS.values())
    idents = {u.removesuffix(".service") for u in plan_units}
    seen: set[str] = set()
    bad = []
    for name, text in files.items():
        for line in sh_blocks(text):
            units, ids = unit_references(line)
            seen |= units
            bad += [f"{name}: {u} in `{line}`" for u in units - allowed]
            bad += [f"{name}: identifier {i} in `{line}`" for i in ids - idents]
    assert not bad, "\n".join(bad)
    assert plan_units <= seen, f"units never in a command: {plan_units - seen}"
    if not monitoring.gpu_host(plan):
        assert runbooks.EXPORTER_UNITS["dcgm"] not in seen


def test_the_unit_parser_catches_a_unit_the_plan_lacks():
    """The check above would pass vacuously if the parser found nothing."""
    assert unit_references("sudo systemctl restart sglang-pd-prefill") == ({"sglang-pd-prefill.service"}, set())
    assert unit_references("journalctl -u foo --identifier bar -n 5 | grep x")[0] == {"foo.service"}
    assert unit_references("journalctl -u foo --identifier bar -n 5")[1] == {"bar"}
    assert unit_references("systemctl show a.service b.service -p Id,NRestarts") == ({"a.service", "b.service"}, set())


def test_exporter_units_are_the_monitoring_roles():
    # the tasks, and the role's vars they take the unit names from
    tasks = "\n".join(p.read_text() for p in (ROOT / "roles" / "monitoring").glob("*/*.yml")
                      if p.parent.name in ("tasks", "vars"))
    for unit in runbooks.EXPORTER_UNITS.values():
        assert unit in tasks, f"{unit} is not a unit roles/monitoring starts"


def copy_inventory(src: str, dst: Path) -> Path:
    shutil.copytree(ROOT / "inventories" / src, dst)  # symlinks followed: a self-contained copy
    return dst


def test_no_key_content_in_any_runbook(tmp_path):
    inv = copy_inventory("gpu01", tmp_path / "inv")
    secret = secrets.token_hex(24)
    key = tmp_path / "api-key"
    key.write_text(secret + "\n")
    key.chmod(0o600)
    (inv / "host_vars").mkdir(exist_ok=True)
    (inv / "host_vars" / "gpu01.yml").write_text(f"pdnode_api_key_file: {key}\n")
    plan = plan_of(inv)
    assert plan["settings"]["pdnode_api_key_file"], "the key file must reach the plan for this test to mean anything"
    assert main(["runbooks", str(inv), "--out", str(tmp_path / "out")]) == 0
    texts = [p.read_text() for p in (tmp_path / "out" / "gpu01").rglob("*.md")]
    assert len(texts) == len(runbooks.PAGES) + len(monitoring.alert_names(yaml.safe_load(monitoring.TEMPLATE.read_text())))
    assert not [t for t in texts if secret in t]
    assert any(plan["install"]["api_key_path"] in t for t in texts)  # the path is named, not the content


def test_cli_writes_every_file_of_every_host_and_replaces_whole(tmp_path, capsys):
    inv = copy_inventory("demo", tmp_path / "inv")
    tree = yaml.safe_load((inv / "hosts.yml").read_text())
    hosts = tree["all"]["children"]["pd_nodes"]["hosts"]
    hosts["second"] = dict(hosts["pdnode-demo"], ansible_host="second")
    (inv / "hosts.yml").write_text(yaml.safe_dump(tree))
    out = tmp_path / "out"
    stale = out / "second" / "stale.md"
    stale.parent.mkdir(parents=True)
    stale.write_text("from an older render\n")
    assert main(["runbooks", str(inv), "--out", str(out)]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in printed] == ["pdnode-demo", "second"]
    for host in ("pdnode-demo", "second"):
        hv = load_inventory(inv, host)  # the demo sets the units' readiness timeout: the pages say it
        role_values = {k: hv.variables[k] for k in runbooks.PD_SERVICES_VALUES if k in hv.variables}
        assert role_values["pd_services_ready_timeout_s"] == 60
        expected = runbooks.render_runbooks(plan_of(inv, host), str(inv), role_values=role_values)
        written = {str(p.relative_to(out / host)): p.read_text() for p in (out / host).rglob("*") if p.is_file()}
        assert written == expected
    assert not stale.exists()
    assert sorted(p.name for p in out.iterdir()) == ["pdnode-demo", "second"]  # no temporary directories left
    # --host renders that host only.
    shutil.rmtree(out)
    assert main(["runbooks", str(inv), "--host", "second", "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["second"]


def test_cli_bad_inventory_is_one_line_and_writes_nothing(tmp_path, capsys):
    inv = copy_inventory("demo", tmp_path / "inv")
    tree = yaml.safe_load((inv / "hosts.yml").read_text())
    hosts = tree["all"]["children"]["pd_nodes"]["hosts"]
    hosts["broken"] = dict(hosts["pdnode-demo"])
    (inv / "hosts.yml").write_text(yaml.safe_dump(tree))
    (inv / "host_vars").mkdir(exist_ok=True)
    (inv / "host_vars" / "broken.yml").write_text("pdnode_router_port: 70000\n")
    out = tmp_path / "out"
    assert main(["runbooks", str(inv), "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1, err
    assert "broken" in err and "pdnode_router_port" in err and "70000" in err
    assert not out.exists()  # the good host is not written either: all or nothing
    assert main(["runbooks", str(tmp_path / "nowhere"), "--out", str(out)]) == 2
    assert len(capsys.readouterr().err.splitlines()) == 1


def test_a_value_that_is_no_unit_name_is_refused_not_printed():
    plan = copy.deepcopy(plan_of(ROOT / "inventories" / "demo"))
    plan["services"]["router"]["unit"] = "x;reboot.service"
    with pytest.raises(runbooks.RunbookError, match=r"services\.router\.unit: 'x;reboot\.service'"):
        runbooks.render_runbooks(plan)


def test_an_inventory_path_with_a_space_is_quoted_in_commands():
    plan = plan_of(ROOT / "inventories" / "demo")
    files = runbooks.render_runbooks(plan, "my inventories/demo")
    lines = [l for l in sh_blocks(files["verify-collect-bench.md"]) if "pdnode check" in l]
    assert lines == [f".venv/bin/pdnode check 'my inventories/demo' --host {plan['host']}"]


def test_an_inventory_without_thresholds_renders_and_says_which_rules_are_absent():
    plan = copy.deepcopy(plan_of(ROOT / "inventories" / "gpu01"))
    plan["settings"]["pdnode_verify_thresholds"] = {}
    files = runbooks.render_runbooks(plan)
    for alert, key in (("PdKvTransferSlow", "kv_transfer_speed_min_gb_s"), ("PdTtftP99High", "ttft_p99_max_s"),
                       ("PdItlP99High", "itl_p99_max_s")):
        assert f"the inventory sets no pdnode_verify_thresholds.{key}" in files[f"alerts/{alert}.md"]
    assert "Not active on this host" not in files["alerts/PdBootstrapFailures.md"]


def test_every_shell_block_is_valid_bash(rendered):
    """Each ```sh block parses (bash -n): quoting of URLs with ? and &, pipes, comments."""
    _, files = rendered
    bash = shutil.which("bash")
    assert bash, "bash is needed to check the runbooks' shell blocks"
    blocks = [(name, block) for name, text in files.items() for block in SH_BLOCK.findall(text)]
    assert len(blocks) > len(files)  # most pages have more than one
    for name, block in blocks:
        result = subprocess.run([bash, "-n"], input=block, capture_output=True, text=True, check=False)
        assert result.returncode == 0, f"{name}: {result.stderr}\n{block}"


# --- a layout over several hosts ------------------------------------------------------------
def layout_renders(peers: dict, inventory: str) -> dict:
    """{host: (plan, files)} for every host of a layout (peers: every host's variables)."""
    out = {}
    for host in peers:
        plan = build_plan(peers[host], host, peers).as_dict()
        out[host] = plan, runbooks.render_runbooks(plan, inventory)
    return out


@pytest.fixture(scope="module")
def pair_renders():
    return layout_renders(inventory_variables(ROOT / "inventories" / "gpu-pair"), "inventories/gpu-pair")


@pytest.fixture(scope="module")
def spanning_renders():
    """gpu-pair with decode-0 at TP 16 over gpu02 and gpu03 (node ranks 0 and 1)."""
    peers = copy.deepcopy(inventory_variables(ROOT / "inventories" / "gpu-pair"))
    peers["gpu03"] = copy.deepcopy(peers["gpu02"])
    peers["gpu03"]["pdnode_node_address"] = "10.20.0.13"
    decode = {"hosts": ["gpu02", "gpu03"], "gpus": list(range(8)), "tp_size": 16, "attn_dp_size": 16,
              "ep_size": 16, "moe_dense_tp_size": 1, "enable_dp_lm_head": True}
    for h in peers:
        peers[h]["pdnode_decode_instances"] = [decode]
    return layout_renders(peers, "inventories/gpu-pair")


def test_each_host_of_a_layout_gets_pages_for_what_runs_on_it(pair_renders):
    (_, f1), (_, f2) = pair_renders["gpu01"], pair_renders["gpu02"]
    for files in (f1, f2):  # the whole layout on every host's overview
        for row in ("| gpu01", "| gpu02", "| prefill-0 | prefill | gpu01 | `http://10.20.0.11:30000` |",
                    "| decode-0 | decode | gpu02 | `http://10.20.0.12:30001` |"):
            assert row in files["README.md"], row
    assert "Clients use the router on gpu02: `http://10.20.0.12:8000`" in f1["README.md"]
    # gpu01 runs the two prefills only: no router unit, port or command there
    assert "sglang-pd-router.service" not in "".join(f1.values())
    assert "| 8000 |" not in f1["README.md"] and "| 30001 |" not in f1["README.md"]
    assert "| 30000 |" in f1["README.md"] and "| 8999 |" in f1["README.md"]
    assert "It runs on gpu02 (`http://10.20.0.12:8000`): that host's runbooks." in f1["start-stop.md"]
    # across hosts nothing is coupled, and the prefills wait out the decodes' heartbeat
    assert "Coupled" not in f1["start-stop.md"] + f2["start-stop.md"]
    assert "prefill-0 11 s, prefill-1 11 s" in f1["README.md"]
    # the router's host checks every worker of the layout at its host's address
    workers = f2["node-not-serving.md"]
    assert "prefill-0 (`http://10.20.0.11:30000`, bootstrap 8998), prefill-1 (`http://10.20.0.11:30010`" in workers
    assert "'prefill-1 %{http_code}\\n' http://10.20.0.11:30010/health    # on gpu01" in workers
    # verify and bench run from the router's host; the verdict covers every host
    for files in (f1, f2):
        assert "pdnode verify inventories/gpu-pair --host gpu02" in files["verify-collect-bench.md"]
        assert "pdnode bench inventories/gpu-pair --host gpu02" in files["verify-collect-bench.md"]
    assert "--limit gpu01 --tags verify" not in "".join(f1.values())


def test_router_alerts_are_active_on_the_routers_host_only(pair_renders):
    (_, f1), (_, f2) = pair_renders["gpu01"], pair_renders["gpu02"]
    for alert in ("PdCircuitOpen", "PdWorkerUnhealthy"):
        elsewhere = f1[f"alerts/{alert}.md"]
        assert "Not active on this host" in elsewhere and "it fires on gpu02" in elsewhere
        assert "The router runs on gpu02, not here" in elsewhere and "```sh" not in elsewhere
        here = f2[f"alerts/{alert}.md"]
        assert "Not active on this host" not in here
        assert "| http://10.20.0.11:30010 | prefill-1 | `sglang-pd-prefill-1.service` | gpu01 |" in here
    # decode's latency alerts fire where the decode runs
    assert "it fires on gpu02" in f1["alerts/PdTtftP99High.md"]
    assert "Not active on this host" not in f2["alerts/PdTtftP99High.md"]
    assert "Not active on this host" not in f1["alerts/PdBootstrapFailures.md"]


def test_a_rank_of_an_instance_spanning_hosts_has_its_own_page(spanning_renders):
    plan, files = spanning_renders["gpu03"]
    assert list(plan["services"]) == ["decode-0"]
    readme = files["README.md"]
    assert "| decode-0 (node rank 1 of 2) |" in readme and "HTTP: dummy /health only" in readme
    assert "| decode-0 | `http://10.20.0.13:30001/health` | - (node rank 0's) |" in readme
    assert "| decode-0 | decode | gpu02, gpu03 |" in readme
    assert "Node rank 1 of 2" in files["start-stop.md"] and "restart the ranks together" in files["start-stop.md"]
    assert "the upgrade playbook refuses such a" in files["upgrade.md"]
    # no metrics of its own: the alert pages' checks leave it out rather than print None
    assert "http://10.20.0.13:30001/metrics" not in "".join(files.values())


@pytest.mark.parametrize("layout", ["pair", "spanning"])
def test_every_page_of_every_host_is_well_formed(layout, pair_renders, spanning_renders):
    """What the one-host checks prove, for each host of a layout: no unset value printed,
    each shell block valid bash, only this host's units in commands, every alert a page."""
    bash = shutil.which("bash")
    assert bash
    renders = pair_renders if layout == "pair" else spanning_renders
    for host, (plan, files) in renders.items():
        own = host_units(plan)
        allowed = own | {plan["install"]["target"]} | set(runbooks.EXPORTER_UNITS.values())
        seen: set[str] = set()
        for name, text in files.items():
            assert "None" not in text, f"{host}/{name}"
            for block in SH_BLOCK.findall(text):
                result = subprocess.run([bash, "-n"], input=block, capture_output=True, text=True, check=False)
                assert result.returncode == 0, f"{host}/{name}: {result.stderr}\n{block}"
            for line in sh_blocks(text):
                units, _ = unit_references(line)
                seen |= units
                assert units <= allowed, f"{host}/{name}: {units - allowed} in `{line}`"
        assert own <= seen, f"{host}: units never in a command: {own - seen}"
        assert sum(n.startswith("alerts/") for n in files) >= 10


def test_cli_writes_a_directory_per_host_of_a_layout(tmp_path, capsys):
    assert main(["runbooks", str(ROOT / "inventories" / "gpu-pair"), "--out", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpu01", "gpu02"]
    # every host gets a page per alert of the template and the same procedure pages
    pages = {host: sorted(str(f.relative_to(tmp_path / host)) for f in (tmp_path / host).rglob("*.md"))
             for host in ("gpu01", "gpu02")}
    assert pages["gpu01"] == pages["gpu02"]
    assert f"gpu02: {len(pages['gpu02'])} runbooks" in capsys.readouterr().out
