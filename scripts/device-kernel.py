#!/usr/bin/env python3
"""A real CUDA kernel with nothing but the driver (libcuda) and Python: spins every SM of
CUDA_VISIBLE_DEVICES' first GPU for SECONDS (default 10), so NVML's utilisation has work to see.
Used by scripts/device-check.sh; no toolkit, no framework needed."""
import ctypes
import sys
import time

PTX = b"""
.version 7.0
.target sm_70
.address_size 64
.visible .entry spin(.param .u64 n, .param .u64 out) {
  .reg .u64 %r<6>;
  .reg .pred %p;
  ld.param.u64 %r1, [n];
  ld.param.u64 %r3, [out];
  mov.u64 %r2, 0;
  mov.u64 %r4, 1;
LOOP:
  mad.lo.u64 %r4, %r4, 6364136223846793005, 1442695040888963407;
  add.u64 %r2, %r2, 1;
  setp.lt.u64 %p, %r2, %r1;
  @%p bra LOOP;
  st.global.u64 [%r3], %r4;
  ret;
}
\0"""


def main() -> None:
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 10.0
    cuda = ctypes.CDLL("libcuda.so.1")

    def ck(code: int, what: str) -> None:
        if code != 0:
            sys.exit(f"device-kernel: {what} failed with CUDA error {code}")

    ck(cuda.cuInit(0), "cuInit")
    dev = ctypes.c_int()
    ck(cuda.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
    ctx = ctypes.c_void_p()
    ck(cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev), "cuCtxCreate")
    module = ctypes.c_void_p()
    ck(cuda.cuModuleLoadData(ctypes.byref(module), ctypes.c_char_p(PTX)), "cuModuleLoadData")
    spin = ctypes.c_void_p()
    ck(cuda.cuModuleGetFunction(ctypes.byref(spin), module, b"spin"), "cuModuleGetFunction")
    out = ctypes.c_uint64()
    ck(cuda.cuMemAlloc_v2(ctypes.byref(out), 8), "cuMemAlloc")
    n = ctypes.c_uint64(50_000_000)
    args = (ctypes.c_void_p * 2)(
        ctypes.cast(ctypes.byref(n), ctypes.c_void_p), ctypes.cast(ctypes.byref(out), ctypes.c_void_p)
    )
    launches = 0
    end = time.time() + seconds
    while time.time() < end:
        ck(cuda.cuLaunchKernel(spin, 264, 1, 1, 256, 1, 1, 0, None, args, None), "cuLaunchKernel")
        ck(cuda.cuCtxSynchronize(), "cuCtxSynchronize")
        launches += 1
    print(f"device-kernel: {launches} launches in {seconds:.0f} s")


if __name__ == "__main__":
    main()
