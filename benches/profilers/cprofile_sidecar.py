#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Stand-in for py-spy in `e2e_throughput.py --py-spy PATH`: runs the sidecar under cProfile instead.

e2e_throughput starts `PATH record ... -o PROFILE -- python -m sie_sidecar run` for its profiled
round. This takes the command after `--`, runs `sie_sidecar` in this process under `cProfile`, and
writes the stats when the sidecar returns (it drains on the bench's SIGINT) to `$CPROFILE_OUT`
(default `/tmp/sidecar.prof`). cProfile counts every call exactly, which is what "Python calls
per batch" needs; its times are wall time with the profiler's overhead.

    python benches/e2e_throughput.py --items 30000 --rounds 1 --half-load-s 0 \\
        --py-spy benches/profilers/cprofile_sidecar.py
    python benches/profilers/calls_per_batch.py /tmp/sidecar.prof --batches 469
"""

from __future__ import annotations

import cProfile
import os
import runpy
import sys


def main() -> None:
    args = sys.argv[1:]
    command = args[args.index("--") + 1 :]  # python -m sie_sidecar run ...
    if command[1:3] != ["-m", "sie_sidecar"]:
        raise SystemExit(f"expected `python -m sie_sidecar ...` after --, got {command}")
    if os.path.abspath(sys.executable) != os.path.abspath(command[0]):
        # Started through the shebang: run again with the interpreter the bench chose (its venv).
        os.execv(command[0], [command[0], __file__, *args])
    sys.argv = ["sie_sidecar", *command[3:]]
    profile = cProfile.Profile()
    profile.enable()
    try:
        runpy.run_module("sie_sidecar", run_name="__main__")
    except SystemExit:
        pass
    finally:
        profile.disable()
        profile.dump_stats(os.environ.get("CPROFILE_OUT", "/tmp/sidecar.prof"))


if __name__ == "__main__":
    main()
