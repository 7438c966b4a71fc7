#!/usr/bin/env python3
"""Move bytes between two Mooncake transfer engines on this host and report the speed.

Two processes, as prefill and decode would be: a target that registers a buffer, and an
initiator that registers a source buffer, writes it into the target with
transfer_sync_write, reads it back with transfer_sync_read and compares. Metadata is
exchanged peer to peer (P2PHANDSHAKE); the protocol is tcp by default (rdma on a host
with NICs). Prints one JSON line; exit 0 when the data arrived intact, 1 when not, 2
when the engine could not be started.

GPU mode (--src-gpu/--dst-gpu): the buffers are GPU memory (torch allocates them, as
SGLang's KV pool is), the initiator's on the prefill's GPU and the target's on the
decode's, registered with Mooncake under their cuda:N location; --intranode-nvlink sets
MC_INTRANODE_NVLINK=1 in both processes (Mooncake's intra-node NVLink transport: CUDA
IPC, whatever the protocol). --peer-copy adds a torch copy between the same GPUs: the
link's ceiling.

  mooncake_loopback_check.py [--bytes N] [--iterations K] [--protocol tcp|rdma]
                             [--host 127.0.0.1] [--device-name mlx5_0]
                             [--src-gpu P --dst-gpu D [--intranode-nvlink] [--peer-copy]]
"""
import argparse
import ctypes
import json
import multiprocessing as mp
import os
import sys
import time


def _engine(host: str, protocol: str, device: str):
    from mooncake.engine import TransferEngine  # imported in the child: the engine is per process

    te = TransferEngine()
    rc = te.initialize(host, "P2PHANDSHAKE", protocol, device)
    if rc != 0:
        raise RuntimeError(f"TransferEngine.initialize({host!r}, P2PHANDSHAKE, {protocol!r}) returned {rc}")
    return te


def _buffer(size: int, fill: int | None = None, gpu: int | None = None):
    """(keep-alive object, address, location) of a buffer in host memory or on a GPU."""
    if gpu is not None:
        import torch

        torch.cuda.set_device(gpu)
        if fill is None:
            buf = torch.zeros(size, dtype=torch.uint8, device=f"cuda:{gpu}")
        else:
            buf = ((torch.arange(size, dtype=torch.int64, device=f"cuda:{gpu}") * 31 + fill) % 256).to(torch.uint8)
        torch.cuda.synchronize(gpu)
        return buf, buf.data_ptr(), f"cuda:{gpu}"
    buf = (ctypes.c_ubyte * size)()
    if fill is not None:
        pattern = bytes((i * 31 + fill) & 0xFF for i in range(256))
        ctypes.memmove(buf, pattern * (size // 256) + pattern[: size % 256], size)
    return buf, ctypes.addressof(buf), "cpu:0"


def _same(a, b) -> bool:
    if hasattr(a, "equal"):  # torch tensors, maybe on different GPUs
        return bool(a.cpu().equal(b.cpu()))
    return bytes(a) == bytes(b)


def _target(conn, args) -> None:
    try:
        te = _engine(args.host, args.protocol, args.device_name)
        buf, addr, where = _buffer(args.bytes, gpu=args.dst_gpu)
        rc = te.register_memory(addr, args.bytes, where)
        if rc != 0:
            raise RuntimeError(f"register_memory returned {rc}")
        conn.send({"session": f"{args.host}:{te.get_rpc_port()}", "addr": addr})
        conn.recv()  # wait until the initiator is done
        te.unregister_memory(addr)
        del buf
    except Exception as exc:  # reported to the parent, which prints the verdict
        conn.send({"error": f"target: {exc}"})


def _initiator(conn, args, session: str, remote: int) -> None:
    try:
        te = _engine(args.host, args.protocol, args.device_name)
        src, src_addr, where = _buffer(args.bytes, fill=7, gpu=args.src_gpu)
        back, back_addr, _ = _buffer(args.bytes, gpu=args.src_gpu)
        for addr in (src_addr, back_addr):
            rc = te.register_memory(addr, args.bytes, where)
            if rc != 0:
                raise RuntimeError(f"register_memory returned {rc}")
        writes = []
        for _ in range(args.iterations):
            t0 = time.perf_counter()
            rc = te.transfer_sync_write(session, src_addr, remote, args.bytes)
            writes.append(time.perf_counter() - t0)
            if rc != 0:
                raise RuntimeError(f"transfer_sync_write returned {rc}")
        t0 = time.perf_counter()
        rc = te.transfer_sync_read(session, back_addr, remote, args.bytes)
        read_s = time.perf_counter() - t0
        if rc != 0:
            raise RuntimeError(f"transfer_sync_read returned {rc}")
        intact = _same(src, back)
        best = min(writes)
        conn.send({
            "intact": intact,
            "write_gb_s_best": args.bytes / best / 1e9,
            "write_gb_s_mean": args.bytes * len(writes) / sum(writes) / 1e9,
            "read_gb_s": args.bytes / read_s / 1e9,
            "write_seconds": [round(w, 6) for w in writes],
        })
    except Exception as exc:
        conn.send({"error": f"initiator: {exc}"})


def _peer_copy(args) -> float:
    """Best GB/s of a torch copy from the prefill's GPU to the decode's (the link's ceiling)."""
    import torch

    src = torch.ones(args.bytes, dtype=torch.uint8, device=f"cuda:{args.src_gpu}")
    dst = torch.empty(args.bytes, dtype=torch.uint8, device=f"cuda:{args.dst_gpu}")
    best = float("inf")
    for _ in range(args.iterations + 1):  # the first copy sets up peer access
        torch.cuda.synchronize(args.src_gpu)
        t0 = time.perf_counter()
        dst.copy_(src)
        torch.cuda.synchronize(args.dst_gpu)
        best = min(best, time.perf_counter() - t0)
    return args.bytes / best / 1e9


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bytes", type=int, default=64 << 20)
    p.add_argument("--iterations", type=int, default=5)
    p.add_argument("--protocol", default="tcp")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--device-name", default="")
    p.add_argument("--timeout", type=float, default=120.0)
    p.add_argument("--src-gpu", type=int, default=None, help="GPU of the initiator's buffers (the prefill's)")
    p.add_argument("--dst-gpu", type=int, default=None, help="GPU of the target's buffer (the decode's)")
    p.add_argument("--intranode-nvlink", action="store_true",
                   help="MC_INTRANODE_NVLINK=1 in both processes: Mooncake's intra-node NVLink transport")
    p.add_argument("--peer-copy", action="store_true", help="also time a torch copy between the two GPUs")
    args = p.parse_args()
    if (args.src_gpu is None) != (args.dst_gpu is None):
        p.error("--src-gpu and --dst-gpu go together")
    if args.intranode_nvlink and args.src_gpu is None:
        p.error("--intranode-nvlink moves GPU memory: give --src-gpu and --dst-gpu")
    if args.intranode_nvlink:
        os.environ["MC_INTRANODE_NVLINK"] = "1"  # inherited by both spawned processes
    out = {"ok": False, "protocol": args.protocol, "bytes": args.bytes, "iterations": args.iterations,
           "memory": "host" if args.src_gpu is None else f"cuda:{args.src_gpu} -> cuda:{args.dst_gpu}",
           "transport": "intranode_nvlink" if args.intranode_nvlink else args.protocol}
    try:
        import mooncake  # noqa: F401
        from importlib.metadata import packages_distributions, version

        dist = next(iter(packages_distributions().get("mooncake", [])), None)
        out["package"], out["version"] = dist, version(dist) if dist else None
    except Exception as exc:
        out["error"] = f"import mooncake: {exc}"
        print(json.dumps(out))
        return 2
    ctx = mp.get_context("spawn")
    t_parent, t_child = ctx.Pipe()
    target = ctx.Process(target=_target, args=(t_child, args), daemon=True)
    target.start()
    if not t_parent.poll(args.timeout):
        out["error"] = "target did not start in time"
        print(json.dumps(out))
        return 2
    info = t_parent.recv()
    if "error" in info:
        out["error"] = info["error"]
        print(json.dumps(out))
        return 2
    i_parent, i_child = ctx.Pipe()
    init = ctx.Process(target=_initiator, args=(i_child, args, info["session"], info["addr"]), daemon=True)
    init.start()
    result = i_parent.recv() if i_parent.poll(args.timeout) else {"error": "initiator timed out"}
    t_parent.send("done")
    init.join(10)
    target.join(10)
    out.update(result)
    out["ok"] = bool(result.get("intact"))
    if args.peer_copy and args.src_gpu is not None:
        out["peer_copy_gb_s_best"] = _peer_copy(args)
    for key in ("write_gb_s_best", "write_gb_s_mean", "read_gb_s", "peer_copy_gb_s_best"):
        if key in out:
            out[key] = round(out[key], 3)
    print(json.dumps(out))
    return 0 if out["ok"] else (2 if "error" in out and "intact" not in out else 1)


if __name__ == "__main__":
    sys.exit(main())
