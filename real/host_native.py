"""Building and loading the fused host kernels' C++ library (real/host_fused.cpp).

This module owns one thing: turning real/host_fused.cpp into a loaded shared library, once
per process, or saying why it could not. real/host_fused.py calls `library()` on the
first fused kernel call (never at import) and falls back to torch's ops when it is None.

- Compiler: `$ZFBENCH_CXX`, else `g++` on PATH (GCC's OpenMP: the library then shares
  torch's own libgomp, which torch loaded first under the same soname).
- Flags: -O3 -march=native (the library runs where it is built; the cache key names the
  CPU), -ffp-contract=off (no fma the source does not write: the bits are torch's),
  -fno-math-errno (vector sqrt), -fopenmp. A compiler that rejects -march=native gets a
  second try without it.
- Cache: `$ZFBENCH_CACHE_DIR`, else `$XDG_CACHE_HOME/zfbench`, else `~/.cache/zfbench`;
  under it `host_kernels/<key>/libzf_host.so`, the key a hash of the source, the flags,
  the compiler's version and the CPU (model and ISA flags), so a cache shared by machines
  never hands one a library built for another. Written to a temporary name and renamed,
  so processes building at once (ranks) do not read a half-written file.
- Plain C ABI through ctypes, no torch headers: a build takes about a second (g++ 12,
  2 cores), not the minute a torch extension's headers take. ctypes releases the GIL
  during each call.
- `$ZFBENCH_HOST_KERNELS=torch` turns the library off (torch's ops everywhere).

`status()` says what happened: {"path": "cpp" | "torch", "library", "built_s" (seconds of
the build this process ran, None when cached), "reason" (why not, for "torch")}.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from zfbench.core.provenance import cpuinfo

SOURCE = Path(__file__).with_name("host_fused.cpp")
LIB_NAME = "libzf_host.so"
ABI_VERSION = 7
FLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-fno-math-errno", "-fopenmp",
         "-fPIC", "-shared", "-std=c++17")
BUILD_TIMEOUT_S = 300
ENV_SWITCH = "ZFBENCH_HOST_KERNELS"

_lock = threading.Lock()
_state: dict = {}


def cache_root() -> Path:
    """Where built libraries are kept (see the module docstring)."""
    if os.environ.get("ZFBENCH_CACHE_DIR"):
        return Path(os.environ["ZFBENCH_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "zfbench"


def _cpu_fingerprint() -> str:
    """The CPU's model and full ISA flag list (what -march=native compiles for)."""
    model, flags = cpuinfo()
    return f"{platform.machine()}|{model}|{' '.join(flags)}"


def compiler() -> str | None:
    return os.environ.get("ZFBENCH_CXX") or shutil.which("g++")


def _version(cxx: str) -> str:
    try:
        out = subprocess.run([cxx, "-dumpfullversion", "-dumpversion"], capture_output=True,
                             text=True, timeout=30)
        return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "?"


def _key(cxx: str, flags: tuple[str, ...]) -> str:
    digest = hashlib.sha256()
    for part in (SOURCE.read_bytes(), repr(flags).encode(), cxx.encode(),
                 _version(cxx).encode(), _cpu_fingerprint().encode(), str(ABI_VERSION).encode()):
        digest.update(part)
        digest.update(b"\0")
    return digest.hexdigest()[:20]


def _compile(cxx: str, flags: tuple[str, ...], out: Path) -> str | None:
    """Compile into `out` (atomically); None on success, else the compiler's complaint."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    cmd = [cxx, *flags, str(SOURCE), "-o", str(tmp)]
    try:
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError) as err:
        return f"{type(err).__name__}: {err}"
    if run.returncode != 0:
        tmp.unlink(missing_ok=True)
        lines = (run.stderr or run.stdout).strip().splitlines()
        return lines[0] if lines else f"{cxx} exited {run.returncode}"
    os.replace(tmp, out)
    return None


def _compile_once(cxx: str, flags: tuple[str, ...], out: Path) -> str | None:
    """`_compile` under a lock file beside `out`: processes starting at once (ranks) wait
    for the first one's build instead of each compiling."""
    import fcntl  # POSIX only: the build runs on Linux alone

    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        handle = open(out.with_name(".lock"), "w")
    except OSError as err:
        return f"cache {out.parent}: {err}"
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        if out.is_file():
            return None
        return _compile(cxx, flags, out)


def _declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    vp, i32, i64, f64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_double
    lib.zf_abi_version.argtypes, lib.zf_abi_version.restype = [], i32
    lib.zf_adamw.argtypes = [vp, vp, vp, vp, vp, i32, i32, i64, f64, f64, f64, f64, f64, f64,
                             i32, i64]
    lib.zf_adamw.restype = None
    lib.zf_adamw_segments.argtypes = [vp, vp, i64, f64, f64, f64, f64, f64, f64, f64, i32,
                                      i64]
    lib.zf_adamw_segments.restype = None
    lib.zf_accumulate.argtypes = [vp, vp, i32, f64, i32, i64, i32, i64, i64]
    lib.zf_accumulate.restype = None
    lib.zf_convert.argtypes = [vp, vp, i32, i32, i64, i32, i64, i64]
    lib.zf_convert.restype = None
    lib.zf_words.argtypes = [vp, vp, i32, i64, i32, i64, i64]
    lib.zf_words.restype = i32
    lib.zf_sumsq.argtypes = [vp, i64, i64, i32, i64]
    lib.zf_sumsq.restype = f64
    if lib.zf_abi_version() != ABI_VERSION:
        raise OSError(f"ABI {lib.zf_abi_version()} != {ABI_VERSION}")
    return lib


def _build_and_load() -> tuple[ctypes.CDLL | None, dict]:
    if os.environ.get(ENV_SWITCH, "").strip().lower() == "torch":
        return None, {"path": "torch", "reason": f"${ENV_SWITCH}=torch"}
    if not sys.platform.startswith("linux"):
        return None, {"path": "torch", "reason": f"no build on {sys.platform}"}
    cxx = compiler()
    if cxx is None:
        return None, {"path": "torch", "reason": "no C++ compiler (g++) on PATH"}
    errors = []
    for flags in (FLAGS, tuple(f for f in FLAGS if f != "-march=native")):
        path = cache_root() / "host_kernels" / _key(cxx, flags) / LIB_NAME
        built_s = None
        if not path.is_file():
            start = time.perf_counter()
            err = _compile_once(cxx, flags, path)
            if err is not None:
                errors.append(err)
                continue
            built_s = time.perf_counter() - start
        try:
            lib = _declare(ctypes.CDLL(str(path)))
        except OSError as err:
            errors.append(f"loading {path}: {err}")
            continue
        return lib, {"path": "cpp", "library": str(path), "built_s": built_s,
                     "flags": " ".join(flags)}
    return None, {"path": "torch", "reason": "; ".join(errors)}


def library() -> ctypes.CDLL | None:
    """The loaded library (built on the first call of the process), or None."""
    with _lock:
        if "lib" not in _state:
            lib, info = _build_and_load()
            _state["lib"], _state["info"] = lib, info
        return _state["lib"]


def reject(reason: str) -> None:
    """Stop using the library in this process (e.g. its bits differ from torch's here)."""
    with _lock:
        _state["lib"] = None
        _state["info"] = {**_state.get("info", {}), "path": "torch", "reason": reason}


def status() -> dict:
    """What `library()` did (builds it first if no kernel asked yet)."""
    library()
    return dict(_state["info"])
