"""The stand-in engine: SGLang 0.5.23's public PD protocol without a GPU.

    python -m pdnode.standin SERVERARGS.json [--api-key-file PATH]

It reads the same JSON ServerArgs file real SGLang gets (keys are ServerArgs field names;
an unknown key is refused like real SGLang refuses an unknown keyword) and speaks SGLang's
HTTP, bootstrap and metrics protocol faithfully enough for the real sglang-router and the
real verification to work against it. The KV cache hand-off from prefill to decode goes
through the real Mooncake transfer engine (TCP, P2P handshake): the bytes really move and are
checked. What it reports (latencies, the KV hand-off's time and speed, its log timings) is
simulated GPU time from each rank's timeline (scheduler.py), so a busy machine reports what
an idle one does. Runs on Python >= 3.11; third-party imports: aiohttp,
prometheus_client, mooncake (transfer engine).

Modules (one job each)
    config.py      ServerArgs JSON + PDNODE_SIM_* / SGLANG_* environment -> Settings
    model.py       the deterministic fake model and its tokenizer
    faults.py      fault injection state
    metrics.py     Prometheus metrics with SGLang's names, labels and buckets
    bootstrap.py   the prefill bootstrap server (/health, PUT/GET /route, ...)
    kv.py          KV pools, Mooncake transfer engine, the P<->D control channel
    engine.py      the request pipeline per role (prefill / decode / unified)
    scheduler.py   one scheduler rank's forward passes: prefill chunks, decode steps
    protocol.py    response bodies: /generate, OpenAI chat and completions, SSE
    http_api.py    the HTTP routes, API-key check, /sim/faults
    app.py         start-up, readiness, shutdown on SIGTERM
    rendezvous.py  an instance spanning hosts: node rank 0's dist-init rendezvous, ranks >= 1 joining it

Capacity model (scheduler.py; docs/planner.md): like SGLang, every scheduler rank (an
attention-DP rank, or a DP replica without attention DP) runs one forward pass at a time.
Prefill passes take waiting prompts up to chunked_prefill_size tokens (ServerArgs; default
8192, SGLang's value for 90-160 GB GPUs; divided by attn_dp_size like SGLang; -1: no
chunking) and last tokens x PREFILL_MS_PER_TOKEN / (GPUs of the rank): prefill scales
linearly with tensor parallelism. A decode step makes one token for each running request
of the rank and lasts DECODE_MS_PER_TOKEN + DECODE_MS_PER_REQUEST x (batch - 1),
whatever the rank's GPU count. A rank runs at most max_running_requests // attn_dp_size
requests (SGLang's split), or PDNODE_SIM_MAX_RUNNING_PER_RANK when max_running_requests
is unset (real SGLang derives it from the rank's KV memory, which the stand-in lacks);
the rest wait in sglang:num_queue_reqs. Unified (non-PD) ranks run waiting prefills
before the next decode step. Each rank keeps its own timeline: a pass starts where the
previous one was due to end, so a busy machine's late wake-ups do not slow the simulated
engine down (scheduler.py).

Simulation knobs (environment variables; invalid values stop the start with exit code 2)
    PDNODE_SIM_PREFILL_MS_PER_TOKEN  prefill compute per prompt token on ONE GPU, ms; a
                                     rank of g GPUs takes 1/g of it (default 0.1)
    PDNODE_SIM_DECODE_MS_PER_TOKEN   decode step of a rank running one request, ms: the
                                     inter-token latency of a lone request (default 20)
    PDNODE_SIM_DECODE_MS_PER_REQUEST what each further running request of the rank adds
                                     to a decode step, ms (default 0.5)
    PDNODE_SIM_MAX_RUNNING_PER_RANK  decode batch limit of one rank when ServerArgs
                                     max_running_requests is unset (default 256)
    PDNODE_SIM_STARTUP_S             seconds of simulated model loading before /health
                                     turns 200 (and, on prefill, before the ranks register
                                     with the bootstrap server) (default 0)
    PDNODE_SIM_KV_BYTES_PER_TOKEN    KV cache bytes per prompt token moved P->D
                                     (default 16384)
    PDNODE_SIM_KV_POOL_MB            size of each side's registered KV pool in MiB; the
                                     pool is an anonymous mapping, touched pages only
                                     (default 256); max_total_num_tokens = pool / bytes
    PDNODE_SIM_KV_GB_S               the KV path's speed the plan rendered, GB/s: each
                                     hand-off takes at least its bytes at this speed
                                     (unset: the path's own figure); the path itself is read from
                                     MC_INTRANODE_NVLINK / MC_FORCE_TCP, as Mooncake does
    PDNODE_SIM_NO_HCA                1: the simulated host has no usable RDMA device; on
                                     the RDMA path the hand-off falls back to TCP (its speed),
                                     logged as Mooncake does ("no HCA detected"); with
                                     MC_FORCE_HCA set (the plan's, on RDMA) the engine
                                     fails its start with Mooncake's "No available RNIC"
    PDNODE_SIM_FAULTS                comma list of faults active from the start
    PDNODE_SIM_SLOW_FACTOR           latency multiplier of the `slow` fault (default 10)
Also honoured, with SGLang's meaning and defaults: SGLANG_DISAGGREGATION_WAITING_TIMEOUT
(300 s), SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT (300 s),
SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL (5 s, min 2),
SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE (2), SGLANG_HOST_IP (the address ranks
advertise when --host is a wildcard), and the failed-session probe (sessions.py):
SGLANG_ENABLE_FAILED_SESSION_PROBE (true), SGLANG_FAILED_SESSION_PROBE_INTERVAL_S (30),
SGLANG_FAILED_SESSION_PROBE_MAX_INTERVAL_S (300), SGLANG_FAILED_SESSION_IDLE_TIMEOUT_S (600).

Faults (PDNODE_SIM_FAULTS at start; at run time `POST /sim/faults {"faults": [...]}`
replaces the set, `GET /sim/faults` shows it; /sim/* answers loopback clients only and
needs the API key like every non-health route; `GET /sim/requests` lists the last
requests answered, `GET /sim/ranks` what each scheduler rank simulated: passes, simulated
seconds, the largest decode batch, the last 64 passes). A fault may carry an argument after ':'.
    slow[:F]          every simulated latency multiplied by F (default PDNODE_SIM_SLOW_FACTOR)
    error500          generation routes answer 500 (the prefill also fails the room, so the
                      paired decode aborts like it does when a real prefill fails)
    wrong_output      the model answers wrongly (reference probes get a wrong answer)
    bootstrap_down    the prefill's bootstrap server stops listening (connections refused)
    transfer_stall    the prefill never sends the KV cache; decode times out after
                      SGLANG_DISAGGREGATION_WAITING_TIMEOUT and aborts the request
    transfer_fail     Mooncake's write to the decode returns -1: the request fails, and the
                      decode's session is blacklisted (every later request for it fails at
                      once) until the failed-session probe lifts it (field failure 4)
    no_metrics        /metrics answers 404 as if --enable-metrics were off
    rename_metric[:OLD=NEW]  metric OLD is exposed as NEW (default
                      sglang:e2e_request_latency_seconds=sglang:request_e2e_latency_seconds)

The fake model (model.py): the answer is a deterministic function of the prompt. Probes in
model.REFERENCE_ANSWERS get their fixed answer ("What is the capital of France? Answer in
one word." -> "Paris"), anything else a deterministic word sequence derived from a hash of
the prompt, 16..64 words long, then EOS (finish_reason "stop"), unless max tokens cut it
("length"). Tokenizer: each run of letters/digits counts one token per started 4
characters, each other non-space character one token; chat messages are flattened with a
fixed template before counting. Output tokens are whole words.
"""

from ..node import releases

__all__ = ["VERSION"]

VERSION = f"{releases.SGLANG}-standin"
