"""CI: build hf_cascade's CPU kernels and fail where this machine should have built them.

A machine should build them when it runs Linux on x86_64 or aarch64 with a C++ compiler on its PATH (what CI's
machines have). There a failed build is an error, not a fallback: otherwise the kernels' tests would all skip and
the run stay green. The integer argmax screen needs AVX512-VNNI: where the CPU has it, the build must include it.
"""

from __future__ import annotations

import platform
import shutil
import sys
import warnings
from pathlib import Path


def cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    return {
        flag
        for line in text.splitlines()
        if line.startswith(("flags", "Features"))
        for flag in line.split(":", 1)[1].split()
    }


def main() -> int:
    from hf_cascade.backends.cpu.panel import extension, march

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ext = extension()
    compiler = shutil.which("c++") or shutil.which("g++")
    expected = platform.system() == "Linux" and platform.machine() in ("x86_64", "aarch64") and compiler is not None
    print(f"CPU kernels built: {ext is not None} (expected here: {expected}; compiler: {compiler})")
    if ext is None:
        for w in caught:
            print(f"  {w.message}")
        if expected:
            print("ERROR: the CPU kernels failed to build on a machine that builds them", file=sys.stderr)
            return 1
        return 0
    has_vnni = "avx512_vnni" in cpu_flags()
    built_vnni = hasattr(ext, "panel_screen_vnni")
    print(f"integer argmax screen built: {built_vnni} (CPU has AVX512-VNNI: {has_vnni})")
    if has_vnni and not built_vnni and march() == "native":
        print("ERROR: this CPU has AVX512-VNNI but the kernel was built without the integer screen", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
