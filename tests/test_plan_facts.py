"""One definition per fact (issue 20, section 1): the plan names every path, unit name,
CUDA rule, port and threshold default; the playbooks, templates and the verifier read it
and derive none again. Each test here fails when a consumer goes back to its own copy:

- the pd_services role's files rendered from a plan with another prefix, config dir and
  install root hold none of the defaults' names (`sglang-pd`);
- the CUDA major DCGM installs for is the plan's, for branches on both sides of the rule;
- the verify tasks hand the verifier the plan's key paths and interpreter;
- the verifier takes its settings and ports from the plan (values unlike fields.py's
  defaults), and refuses a plan that lacks one instead of completing it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from role_render import render_pd_services_files
from planvars import changed, variables

from pdnode.core.inventory.fields import FIELDS
from pdnode.core.plan.build import build_plan
from pdnode.verify.config import SETTINGS, ConfigError, build_run

ROOT = Path(__file__).resolve().parents[1]
DEFAULTS = {f.name: f.default for f in FIELDS}
OTHER = {"pdnode_service_prefix": "acme-llm", "pdnode_config_dir": "/etc/acme-llm",
         "pdnode_install_root": "/srv/acme-llm", "pdnode_service_user": "acme"}


def _plan(changes: dict[str, Any] | None = None, inventory: str = "demo") -> dict[str, Any]:
    return build_plan(changed(variables(inventory), changes or {}), "node").as_dict()


def test_the_rendered_files_name_only_the_plans_prefix_and_paths(tmp_path):
    assert all(DEFAULTS[k] != v for k, v in OTHER.items())
    plan = _plan({**OTHER, "pdnode_model_path": "/models/demo-moe"})  # the demo's is under /var/lib/sglang-pd-models
    files = render_pd_services_files(plan, tmp_path)
    units = [f for f in files if f["path"].endswith(tuple(f"/{s['unit']}" for s in plan["services"].values()))]
    assert len(units) == len(plan["services"]) and files
    # the per-pair probe's units and files are named after the prefix too
    probe = plan["services"]["router"]["pair_probe"]
    assert {f["path"] for f in files} >= {probe["spec_file"], f"/etc/systemd/system/{probe['service']}",
                                          f"/etc/systemd/system/{probe['timer']}"}
    assert probe["service"].startswith("acme-llm-") and probe["textfile_dir"] == "/var/lib/acme-llm-metrics"
    for f in files:
        text = f["path"] + "\n" + str(f.get("content", ""))
        for default in ("sglang-pd", DEFAULTS["pdnode_config_dir"], DEFAULTS["pdnode_install_root"]):
            assert default not in text, (f["path"], default)
    for f in units:
        assert "StateDirectory=acme-llm\n" in f["content"], f["path"]
    install = plan["install"]
    assert (install["state_directory"], install["home"]) == ("acme-llm", "/var/lib/acme-llm")
    assert install["applied_dir"].endswith("/acme-llm")


def test_no_role_task_template_or_playbook_writes_the_default_prefix():
    """The default prefix lives in fields.py (and the role defaults that document the
    shape); what runs reads the plan."""
    where = [*ROOT.glob("roles/*/tasks/*.yml"), *ROOT.glob("roles/*/templates/*"), *ROOT.glob("roles/*/vars/*.yml"),
             *ROOT.glob("roles/*/handlers/*.yml"), *ROOT.glob("playbooks/**/*.yml"), ROOT / "site.yml"]
    assert len(where) > 40
    hits = [str(p.relative_to(ROOT)) for p in where if "sglang-pd" in p.read_text()]
    assert hits == []


@pytest.mark.parametrize(("branch", "major"), [(570, 12), (575, 12), (580, 13), (590, 13)])
def test_the_cuda_major_of_dcgm_is_the_plans(branch, major):
    plan = _plan({"pdnode_driver_branch": branch})
    assert plan["install"]["cuda_major"] == major
    play = yaml.safe_load((ROOT / "playbooks/monitoring.yml").read_text())[0]
    role = next(r for r in play["roles"] if r["role"] == "pdnode.sglang_pd.monitoring")
    assert role["vars"]["monitoring_dcgm_cuda_major"] == "{{ _pdnode_plan.install.cuda_major }}"


def test_the_verify_tasks_read_the_plans_key_paths_and_interpreter():
    tasks = yaml.safe_load((ROOT / "playbooks/tasks/verify.yml").read_text())
    block = next(t for t in tasks if t.get("name") == "Verify the node against the plan")
    v = block["vars"]
    assert "install.api_key_path" in v["_verify_key_file"]
    assert v["_verify_admin_key_file"] == "{{ _pdnode_plan.install.admin_key_path }}"
    run = next(t for t in block["block"] if t["name"] == "Run the verification on the host")
    assert "+ [_pdnode_plan.install.python, '-m', 'pdnode.verify', " in run["ansible.builtin.command"]["argv"]
    text = (ROOT / "playbooks/tasks/verify.yml").read_text()
    for derived in ("'/api-key'", "'/router-admin-key'", "'/bin/python'", "config_dir ~"):
        assert derived not in text


# Values unlike every default of fields.py, so a verifier default would show.
SETTINGS_OTHER = {"pdnode_verify_prompt_words": 77, "pdnode_verify_max_tokens": 9,
                  "pdnode_verify_burst_requests": 5, "pdnode_verify_burst_concurrency": 3,
                  "pdnode_verify_timeout_s": 13.0, "pdnode_verify_reference_prompt": "Name a colour.",
                  "pdnode_verify_reference_answer": "blue",
                  "pdnode_verify_thresholds": {"ttft_p50_max_s": 7.0}}


def test_the_verifier_reads_every_setting_and_port_from_the_plan():
    assert set(SETTINGS_OTHER) == set(SETTINGS)
    assert all(DEFAULTS[k] != v for k, v in SETTINGS_OTHER.items())
    ports = {"pdnode_router_port": 18123, "pdnode_router_metrics_port": 18124}
    plan = _plan({**SETTINGS_OTHER, **ports})
    run = build_run(plan, env={}, on_node=True)
    s = run.settings
    assert (s.prompt_words, s.max_tokens, s.burst_requests, s.burst_concurrency, s.timeout_s) == (77, 9, 5, 3, 13.0)
    assert (s.reference_prompt, s.reference_answer, s.thresholds) == ("Name a colour.", "blue", {"ttft_p50_max_s": 7.0})
    assert run.targets.router_url.endswith(":18123")
    assert run.targets.router_metrics_url.endswith(":18124/metrics")
    assert [i.router_url for i in run.targets.instances] == [
        plan["services"][i.id]["url"] for i in run.targets.instances]


@pytest.mark.parametrize("setting", SETTINGS)
def test_the_verifier_refuses_a_plan_without_a_setting(setting):
    plan = _plan()
    del plan["settings"][setting]
    with pytest.raises(ConfigError, match=setting):
        build_run(plan, env={}, on_node=True)


@pytest.mark.parametrize(("where", "key"), [("router", "port"), ("router", "prometheus_port"),
                                            ("prefill-0", "url")])
def test_the_verifier_refuses_a_plan_without_a_port(where, key):
    plan = _plan()
    svc = plan["services"][where]
    del (svc["args"] if where == "router" else svc)[key]
    with pytest.raises(ConfigError, match=key):
        build_run(plan, env={}, on_node=True)
