"""Who reaches each endpoint of the real sglang-router 0.3.2 (the table in docs/security.md).

    .venv/bin/python tests/verify/router_endpoints.py [OUT_DIR]

Starts a stand-in node four times (router: no key; client key; client key + control-plane
admin key; admin key only) and calls every route of the router's source (server.rs
build_app at the 0.3.2 release) without a key, with the client key and with the admin
key. 401 = refused by the key check; any other status = the request reached the handler
(422/400: it then refused the empty probe body). Not a test: tests/verify/test_router_admin.py
asserts the rows that matter. Prints the statuses and writes OUT_DIR/router-endpoints.json.
"""
import json
import os
import sys
import tempfile
REPO = __import__("pathlib").Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests/standin"))
sys.path.insert(0, str(REPO / "src"))
from node import request, standin_node  # noqa: E402 - after the path set-up

OUT = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="router-endpoints-")
CLIENT = "sk-client-1234"
ADMIN = "adm-secret-5678"
EPS = [
 ("GET","/liveness",None),("GET","/readiness",None),("GET","/health",None),("GET","/health_generate",None),
 ("GET","/engine_metrics",None),("GET","/v1/models",None),("GET","/get_model_info",None),("GET","/get_server_info",None),
 ("GET","/model_info",None),("GET","/server_info",None),
 ("POST","/generate",{"text":"hi","sampling_params":{"max_new_tokens":2}}),
 ("POST","/v1/chat/completions",{"model":"fake-model","messages":[{"role":"user","content":"hi"}],"max_tokens":2}),
 ("POST","/v1/completions",{"model":"fake-model","prompt":"hi","max_tokens":2}),
 ("POST","/rerank",{}),("POST","/v1/rerank",{}),("POST","/v1/responses",{}),("POST","/v1/embeddings",{}),("POST","/v1/classify",{}),
 ("GET","/v1/responses/x",None),("POST","/v1/responses/x/cancel",None),("DELETE","/v1/responses/x",None),("GET","/v1/responses/x/input_items",None),
 ("POST","/v1/conversations",{}),("GET","/v1/conversations/x",None),("POST","/v1/conversations/x",{}),("DELETE","/v1/conversations/x",None),
 ("GET","/v1/conversations/x/items",None),("POST","/v1/conversations/x/items",{}),("GET","/v1/conversations/x/items/y",None),("DELETE","/v1/conversations/x/items/y",None),
 ("POST","/v1/tokenize",{}),("POST","/v1/detokenize",{}),
 ("POST","/flush_cache",None),("GET","/get_loads",None),("POST","/parse/function_call",{}),("POST","/parse/reasoning",{}),
 ("POST","/wasm",{}),("GET","/wasm",None),("DELETE","/wasm/x",None),
 ("POST","/v1/tokenizers",{}),("GET","/v1/tokenizers",None),("GET","/v1/tokenizers/x",None),("DELETE","/v1/tokenizers/x",None),("GET","/v1/tokenizers/x/status",None),
 ("GET","/workers",None),("POST","/workers",{}),("GET","/workers/x",None),("PUT","/workers/x",{}),("DELETE","/workers/x",None),
 ("GET","/ha/status",None),("GET","/ha/health",None),("GET","/ha/workers",None),("GET","/ha/workers/x",None),("GET","/ha/policies",None),
 ("GET","/ha/policies/x",None),("GET","/ha/config/x",None),("POST","/ha/config",{}),("POST","/ha/rate-limit",{}),("GET","/ha/rate-limit",None),
 ("GET","/ha/rate-limit/stats",None),("POST","/ha/shutdown",None),
 ("GET","/nonexistent",None),
]
def run(label, api_key, admin):
    ra = ["--control-plane-api-keys", f"pdnode-admin:pdnode admin:admin:{ADMIN}"] if admin else []
    out = {}
    with standin_node(os.path.join(OUT, f"node-{label}"), api_key=api_key, router_args=ra) as n:
        for m,p,b in EPS:
            row = {}
            for who, key in (("none",None),("client",CLIENT),("admin",ADMIN)):
                h = {"Authorization": f"Bearer {key}"} if key else {}
                try:
                    r = request(m, n.router_url+p, b, headers=h, timeout=10)
                    row[who] = r.status
                except Exception as e:
                    row[who] = type(e).__name__
            out[f"{m} {p}"] = row
        m = request("GET", f"http://127.0.0.1:{n.ports['router_metrics']}/anything", timeout=5).status
        out["metrics-listener GET /anything"] = {"none": m}
        w = request("GET", n.router_url+"/workers", headers={"Authorization": f"Bearer {ADMIN if admin else CLIENT}"}).text[:800]
        out["_workers_body"] = w
    return out
res = {}
for label, ak, ad in (("nokey",None,False),("client",CLIENT,False),("client+admin",CLIENT,True),("adminonly",None,True)):
    res[label] = run(label.replace("+","_"), ak, ad)
json.dump(res, open(os.path.join(OUT, "router-endpoints.json"), "w"), indent=1)
for label, out in res.items():
    print("==", label)
    for k,v in out.items():
        print(f"  {k:45s} {v}")
