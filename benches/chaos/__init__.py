# SPDX-License-Identifier: Apache-2.0
"""Chaos rig (issue 15): a 3-node nats-server cluster, 3 sidecar + backend pods on one pool, an open-loop
gateway stand-in, and faults injected under load; every item is counted.

Modules, one job each: `procs` (child processes in their own groups, always cleaned up), `cluster`
(the nats-server cluster), `backend` (the reference null backend with a graceful-restart signal),
`pods` (sidecar + backend pairs), `load` (open-loop publisher and per-item reply collector), `count`
(the end-of-scenario accounting), `scenarios` (each fault as a function), `run` (the command line).

Run: `python -m benches.chaos.run --items 5000 --scenario all` (or `make chaos`).
"""
