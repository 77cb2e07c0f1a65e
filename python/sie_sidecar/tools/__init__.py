# SPDX-License-Identifier: Apache-2.0
"""User-facing commands around the runtime (load generator, demo, tour, replay, progress bar, loopback
helpers). Nothing in the runtime's rooms imports from here."""
