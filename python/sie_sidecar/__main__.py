# SPDX-License-Identifier: Apache-2.0
"""`python -m sie_sidecar` is the `sie-sidecar` command."""

from .cli import main

raise SystemExit(main())
