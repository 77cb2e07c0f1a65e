# SPDX-License-Identifier: Apache-2.0
"""`sie-sidecar run` as an operator meets it (issue 32): a NATS URL that is no NATS URL, an unknown
boolean word, a secret on the command line and a broken NATS login each stop start-up at once with
exit code 2 and one line naming the variable (never the secret); a misspelt `SIE_*` variable gets
one warning naming the variable meant."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sie_sidecar.tools.localhost import free_port

BASE = {
    "SIE_NATS_URL": "nats://127.0.0.1:1",
    "SIE_POOL": "default",
    "SIE_BUNDLE": "default",
    "SIE_MACHINE_PROFILE": "l4",
}
SECRET = "s3cret-0xFEEDFACE"


def run(env: dict[str, str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SIE_")}
    return subprocess.run(
        [sys.executable, "-m", "sie_sidecar", "run", *args],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.mark.parametrize(
    ("env", "args", "line"),
    [
        ({"SIE_NATS_URL": "http://x"}, (), "SIE_NATS_URL (--nats-url): 'http://x': http:// is not a NATS scheme"),
        ({"SIE_NATS_URL": "not a url"}, (), "SIE_NATS_URL (--nats-url): 'not a url' is not a URL"),
        ({}, ("--nats-url", "http://x"), "SIE_NATS_URL (--nats-url): 'http://x'"),
        ({"SIE_METRICS_ENABLED": "maybe"}, (), "SIE_METRICS_ENABLED: expected 1, true, yes or on (on)"),
        ({"SIE_POOL_ADMISSION_ENABLED": "maybe"}, (), "SIE_POOL_ADMISSION_ENABLED (--pool-admission-enabled):"),
        ({}, ("--gateway-api-key", SECRET), "--gateway-api-key is refused: secrets are read from the environment"),
        ({}, (f"--config-service-token={SECRET}",), "(set SIE_CONFIG_SERVICE_TOKEN)"),
        ({"SIE_NATS_TOKEN": SECRET, "SIE_NATS_USER": "u", "SIE_NATS_PASSWORD": "p"}, (), "set one NATS login"),
        ({"SIE_NATS_CREDS_FILE": "/no/such.creds"}, (), "SIE_NATS_CREDS_FILE: cannot read /no/such.creds"),
        ({"SIE_NATS_NKEY_SEED_FILE": "/"}, (), "SIE_NATS_NKEY_SEED_FILE: cannot read /: not a regular file"),
        ({"SIE_NATS_TLS_KEY_FILE": "/k.pem"}, (), "SIE_NATS_TLS_CERT_FILE and SIE_NATS_TLS_KEY_FILE must be set"),
    ],
)
def test_refused_at_once_with_exit_2_and_one_line(env: dict[str, str], args: tuple[str, ...], line: str) -> None:
    started = time.monotonic()
    result = run({**BASE, **env}, *args)
    assert result.returncode == 2, result.stderr
    assert time.monotonic() - started < 30  # no connect attempt, no retry
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sie-sidecar: ") and line in lines[0], lines
    assert SECRET not in result.stderr + result.stdout


def test_a_misspelt_variable_gets_one_warning_at_start(tmp_path: Path) -> None:
    env = {
        **BASE,
        "SIE_NATS_URL": f"nats://127.0.0.1:{free_port()}",
        "SIE_NATS_CONNECT_TIMEOUT_S": "1",
        "SIE_IPC_SOCKET_PATH": str(tmp_path / "none.sock"),
        "SIE_WORKER_PROBE_PORT": str(free_port()),
        "SIE_MAX_DELIVERY": "5",
    }
    result = run(env)
    assert result.returncode == 1  # it starts (then finds no NATS): a warning, not a refusal
    records = [json.loads(line) for line in result.stderr.splitlines() if line.startswith("{")]
    mentions = [r for r in records if "SIE_MAX_DELIVERY" in str(r.get("msg", ""))]
    assert len(mentions) == 1, records
    assert mentions[0]["level"] == "warning"
    assert mentions[0]["msg"] == (
        "SIE_MAX_DELIVERY is not a variable sie-sidecar reads: it is ignored; did you mean SIE_MAX_DELIVER?"
    )
