#!/usr/bin/env python3
"""Does CUDA initialise on every GPU? Prints one JSON line; needs only libcuda (ctypes).

cuInit, cuDeviceGetCount, then per device its name and PCI bus id and (unless
--no-context) a primary context retained and released again. CUDA_VISIBLE_DEVICES is
removed first so every GPU is seen. Exit status 0 even on failure: the verdict is the
JSON (judged by pdnode.core.host.preflight), not the exit code.
"""
import ctypes
import json
import os
import sys


def main() -> None:
    os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    out = {"ok": False, "device_count": None, "driver_version": None, "devices": []}
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        out["error"] = f"cannot load libcuda.so.1: {exc}"
        print(json.dumps(out))
        return

    def err(rc: int) -> str:
        s = ctypes.c_char_p()
        cuda.cuGetErrorString(rc, ctypes.byref(s))
        return f"{rc} {s.value.decode() if s.value else ''}".strip()

    rc = cuda.cuInit(0)
    if rc != 0:
        out["error"] = f"cuInit: {err(rc)}"
        print(json.dumps(out))
        return
    ver, n = ctypes.c_int(0), ctypes.c_int(0)
    cuda.cuDriverGetVersion(ctypes.byref(ver))
    out["driver_version"] = ver.value
    rc = cuda.cuDeviceGetCount(ctypes.byref(n))
    if rc != 0:
        out["error"] = f"cuDeviceGetCount: {err(rc)}"
        print(json.dumps(out))
        return
    out["device_count"] = n.value
    contexts = "--no-context" not in sys.argv
    for i in range(n.value):
        dev = ctypes.c_int(0)
        d = {"ordinal": i, "ok": False}
        rc = cuda.cuDeviceGet(ctypes.byref(dev), i)
        if rc != 0:
            d["error"] = f"cuDeviceGet: {err(rc)}"
            out["devices"].append(d)
            continue
        name = ctypes.create_string_buffer(256)
        bus = ctypes.create_string_buffer(64)
        cuda.cuDeviceGetName(name, 256, dev)
        cuda.cuDeviceGetPCIBusId(bus, 64, dev)
        d["name"], d["pci_bus_id"] = name.value.decode(), bus.value.decode().lower()
        if contexts:
            ctx = ctypes.c_void_p()
            rc = cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)
            if rc != 0:
                d["error"] = f"cuDevicePrimaryCtxRetain: {err(rc)}"
                out["devices"].append(d)
                continue
            cuda.cuDevicePrimaryCtxRelease(dev)
        d["ok"] = True
        out["devices"].append(d)
    out["ok"] = all(d["ok"] for d in out["devices"])
    print(json.dumps(out))


if __name__ == "__main__":
    main()
