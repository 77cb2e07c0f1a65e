# SPDX-License-Identifier: Apache-2.0
"""The scheduler's room: per-model batch forming, the adaptive controller, the device clock for just-in-time
dispatch, the pull quantum, cost functions and controller traces."""
