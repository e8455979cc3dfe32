"""Print the CPU capability PyTorch dispatches to, and check it is the one ATEN_CPU_CAPABILITY asked for.

    ATEN_CPU_CAPABILITY=avx2 python scripts/cpu_capability.py

``make test-portable`` runs it before each simulated CPU, so a log shows which kernels the notebooks
ran on. PyTorch quietly uses the best capability it has when the one asked for is not available
(AVX2 on an Arm Mac, say); then this exits 1, since that run would prove nothing.
"""

from __future__ import annotations

import os
import sys

import torch


def main() -> int:
    got = torch.backends.cpu.get_cpu_capability()
    asked = os.environ.get("ATEN_CPU_CAPABILITY", "")
    threads = torch.get_num_threads()
    print(
        f"torch CPU capability: {got} (ATEN_CPU_CAPABILITY={asked or 'unset'}), {threads} thread(s), "
        f"oneDNN ISA limit: {os.environ.get('ONEDNN_MAX_CPU_ISA', 'unset')}"
    )
    if asked and got.lower() != asked.lower():
        print(f"this CPU cannot simulate '{asked}': PyTorch runs '{got}' kernels instead", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
