# SPDX-License-Identifier: Apache-2.0
"""The backend over the Unix socket: the client, the typed responses, and the request-body builders."""
