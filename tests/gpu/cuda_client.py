"""A CUDA client, run as a claim's container would run: with the claim's CDI environment.

Prints one JSON object: the memory it could allocate (``--try-gib`` sizes, each ``ok`` or the
error's first line) and the streaming multiprocessors one kernel of many blocks ran on (each
block reads its ``%smid``), through CuPy where importable, else PyTorch (memory only; the SM
count then comes from the device attribute). Never imported by the suite: it runs in a child
process, so each claim gets a CUDA context of its own, as each container does.
"""

import argparse
import json
import sys
from typing import Any

_SMID = r"""
extern "C" __global__ void smid(unsigned int *out) {
    unsigned int id;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
    if (threadIdx.x == 0) out[blockIdx.x] = id;
    // Long enough that every resident block overlaps the others: the SMs used are the SMs allowed.
    long long start = clock64();
    while (clock64() - start < 2000000) {}
}
"""


def _cupy(sizes: list[int]) -> dict[str, Any]:
    import cupy  # type: ignore[import-not-found]

    out: dict[str, Any] = {"via": "cupy", "alloc": {}}
    for gib in sizes:
        try:
            block = cupy.cuda.alloc(gib << 30)
            del block
            out["alloc"][str(gib)] = "ok"
        except Exception as error:
            out["alloc"][str(gib)] = str(error).splitlines()[0][:160]
    device = cupy.cuda.Device(0)
    out["sm_attribute"] = device.attributes["MultiProcessorCount"]
    blocks = 4096
    ids = cupy.zeros(blocks, dtype=cupy.uint32)
    kernel = cupy.RawKernel(_SMID, "smid")
    kernel((blocks,), (32,), (ids,))
    cupy.cuda.runtime.deviceSynchronize()
    out["sms_used"] = len(set(ids.get().tolist()))
    return out


def _torch(sizes: list[int]) -> dict[str, Any]:
    import torch  # type: ignore[import-not-found]

    out: dict[str, Any] = {"via": "torch", "alloc": {}}
    for gib in sizes:
        try:
            block = torch.empty(gib << 30, dtype=torch.uint8, device="cuda")
            del block
            torch.cuda.empty_cache()
            out["alloc"][str(gib)] = "ok"
        except Exception as error:
            out["alloc"][str(gib)] = str(error).splitlines()[0][:160]
    out["sm_attribute"] = torch.cuda.get_device_properties(0).multi_processor_count
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--try-gib", type=int, nargs="+", default=[])
    args = parser.parse_args()
    try:
        result = _cupy(args.try_gib)
    except ImportError:
        result = _torch(args.try_gib)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
