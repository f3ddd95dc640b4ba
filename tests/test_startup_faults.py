"""Startup faults that are configuration mistakes, not outages: each is one error line naming what
to fix and exit status 2, at once, instead of a wait until ``--state-store-outage-deadline`` (300 s)
or an error that does not say which file is wrong (issue 17, fault 4).

Real parts: the console entry point as a subprocess, a private ``redis-server`` with a password,
and PEM files made by ``openssl`` (``tests/data/tls``)."""
from __future__ import annotations

import shutil
import subprocess
import tempfile
import time

import pytest

from tests.harness.cli import QWEN3, REPO, cli, one_error_line
from worker.tlsfiles import check_tls_files
from worker.transport.broker import free_port, wait_for_port

TLS = REPO / "tests" / "data" / "tls"
KAFKA_FLAGS = ("--ssl-cafile", "--ssl-certfile", "--ssl-keyfile")
RUN = ("run", "--tokenizer", QWEN3, "--bootstrap-servers", "127.0.0.1:1", "--num-threads", "1")


@pytest.fixture
def redis_with_password():
    """A private redis-server on a free port whose default user needs the password ``s3cret``."""
    if shutil.which("redis-server") is None:
        pytest.fail("redis-server is needed (apt-get install redis-server)")
    port = free_port()
    workdir = tempfile.mkdtemp(prefix="auth-redis-")
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", workdir, "--requirepass", "s3cret"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_for_port("127.0.0.1", port, 10, proc)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.kill()
        proc.wait(10)
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.mark.parametrize("extra,needle", [
    (("--redis-password", "wrong"), "invalid username-password pair"),  # WRONGPASS
    ((), "AuthenticationError"),                                           # none given, the server needs one
    (("--redis-username", "nobody", "--redis-password", "s3cret"), "invalid username-password pair"),
], ids=["wrong-password", "no-password", "unknown-user"])
def test_refused_redis_credentials_fail_at_once(redis_with_password, extra, needle):
    """Redis refusing the login is one line naming the credential flags and exit 2 within
    seconds, although the state-store outage deadline is the default 300 s."""
    t0 = time.monotonic()
    p = cli(*RUN, "--stream-state", "redis", "--redis-url", redis_with_password, *extra, timeout=120)
    took = time.monotonic() - t0
    line = one_error_line(p, "redis refused the credentials", "--redis-password", redis_with_password)
    assert needle in line, line
    assert "s3cret" not in line and "wrong" not in line, "a password is never logged"
    assert took < 60, f"took {took:.0f} s: waited as for an outage"


def test_the_right_password_is_not_refused(redis_with_password):
    """Control: with the right password the start goes past Redis (and then stops at the
    unreachable broker, the next dependency)."""
    p = cli(*RUN, "--stream-state", "redis", "--redis-url", redis_with_password, "--redis-password", "s3cret",
            timeout=120)
    assert p.returncode == 2 and "Kafka broker unreachable" in p.stderr.strip().splitlines()[-1], p.stderr
    assert "redis refused" not in p.stderr


@pytest.mark.parametrize("flags,needles", [
    (("--ssl-cafile", "missing-ca.pem"), ("--ssl-cafile", "missing-ca.pem", "cannot read")),
    (("--ssl-cafile", str(TLS / "client.key")), ("--ssl-cafile", "client.key", "not a PEM CA bundle")),
    (("--ssl-certfile", str(TLS / "client.pem"), "--ssl-keyfile", str(TLS / "other.key")),
     ("--ssl-certfile", "client.pem", "--ssl-keyfile", "other.key", "KEY_VALUES_MISMATCH")),
    (("--ssl-certfile", str(TLS / "client.pem"), "--ssl-keyfile", "missing.key"),
     ("--ssl-keyfile", "missing.key", "cannot read")),
    (("--ssl-certfile", str(TLS / "client.pem"), "--ssl-keyfile", str(TLS / "ca.pem")),
     ("--ssl-keyfile", "ca.pem", "not a PEM private key")),
], ids=["ca-missing", "ca-not-pem", "key-mismatch", "key-missing", "key-not-a-key"])
def test_a_bad_kafka_tls_file_is_named(flags, needles):
    p = cli(*RUN, "--stream-state", "memory", "--security-protocol", "SSL", *flags)
    one_error_line(p, "bad configuration", *needles)


@pytest.mark.parametrize("flags,needles", [
    (("--redis-tls-key", str(TLS / "other.key"), "--redis-tls-cert", str(TLS / "client.pem")),
     ("--redis-tls-cert", "--redis-tls-key", "other.key")),
    (("--redis-tls-ca", "nowhere/ca.pem"), ("--redis-tls-ca", "nowhere/ca.pem")),
], ids=["key-mismatch", "ca-missing"])
def test_a_bad_redis_tls_file_is_named(flags, needles):
    p = cli(*RUN, "--stream-state", "redis", "--redis-url", "rediss://127.0.0.1:1/0", *flags)
    one_error_line(p, "bad configuration", *needles)


def test_good_tls_files_load():
    check_tls_files(str(TLS / "ca.pem"), str(TLS / "client.pem"), str(TLS / "client.key"), flags=KAFKA_FLAGS)
    check_tls_files(str(TLS / "ca.pem"), None, None, flags=KAFKA_FLAGS)
    check_tls_files(None, None, None, flags=KAFKA_FLAGS)
    with pytest.raises(ValueError, match="--ssl-keyfile .* needs --ssl-certfile"):
        check_tls_files(None, None, str(TLS / "client.key"), flags=KAFKA_FLAGS)


def test_an_unreachable_redis_at_start_is_waited_for_as_the_readme_says():
    """docs/configuration.md ("Configuration") and docs/delivery.md ("Delivery guarantees") tell one
    story: Redis not answering at start is waited for up to ``--state-store-outage-deadline``, then
    one line and exit 2 (issue 16, operator defect 3: Configuration used to call it a one-line
    startup error)."""
    text = (REPO / "docs" / "configuration.md").read_text()
    config = text[text.index("**Startup errors**"):text.index("`--help` works whatever the environment holds")]
    listed = config[:config.index(") are one line")]
    assert "Redis" not in listed.replace("credentials Redis refuses", ""), listed
    assert "unreachable Redis" in config and "--state-store-outage-deadline" in config, config
    assert "At startup it waits for Redis the same way" in (REPO / "docs" / "delivery.md").read_text()
    port = free_port()  # nothing listens there
    t0 = time.monotonic()
    p = cli(*RUN, "--stream-state", "redis", "--redis-url", f"redis://127.0.0.1:{port}/0", "--redis-timeout", "1",
            "--state-store-outage-deadline", "4", timeout=120)
    took = time.monotonic() - t0
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    errors = [ln for ln in p.stderr.splitlines() if " ERROR " in ln]
    assert len(errors) == 1 and f"127.0.0.1:{port}" in errors[0] and "giving up" in errors[0], p.stderr
    assert "waiting for it" in p.stderr  # the one warning when the wait starts
    assert took >= 4, f"exited after {took:.1f} s, before the 4 s deadline: {p.stderr}"
