"""Startup faults that are configuration mistakes, not outages: each is one error line naming what
to fix and exit status 2, at once, instead of a wait until ``--state-store-outage-deadline`` (300 s)
or an error that does not say which file is wrong (issue 17, fault 4).

Real parts: the console entry point as a subprocess, a private ``redis-server`` with a password,
and PEM files made by ``openssl`` (``tests/data/tls``)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.harness.cli import QWEN3, REPO, cli, one_error_line
from worker.cli import parse_args
from worker.secretfiles import MAX_SECRET_BYTES, secret
from worker.tlsfiles import check_tls_files
from worker.transport.broker import free_port, wait_for_port
from worker.transport.settings import security_kwargs

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


# ------------------------------------------------------------- passwords from files (issue 23) ----
def test_the_redis_password_file_is_read_and_not_in_argv(redis_with_password, tmp_path):
    """``--redis-password-file`` (a mounted Secret: one trailing line break) logs in, and the
    password is nowhere in the worker's command line (what ``ps`` shows every user) nor its log."""
    f = tmp_path / "redis-password"
    f.write_text("s3cret\n")
    argv = (*RUN, "--stream-state", "redis", "--redis-url", redis_with_password, "--redis-password-file", str(f))
    assert not any("s3cret" in a for a in argv)
    p = cli(*argv, timeout=120)
    assert p.returncode == 2 and "Kafka broker unreachable" in p.stderr.strip().splitlines()[-1], p.stderr
    assert "redis refused" not in p.stderr and "s3cret" not in p.stderr + p.stdout
    f.write_text("wrong\n")  # and a wrong one is refused, the line naming the file flag
    p = cli(*argv, timeout=120)
    line = one_error_line(p, "redis refused the credentials", "--redis-password-file")
    assert "wrong" not in line


def test_the_password_file_is_the_one_the_process_holds(redis_with_password, tmp_path):
    """The env form of the file flag works too, and ``/proc/PID/cmdline`` of the running worker
    holds no password (checked while it waits for its broker)."""
    f = tmp_path / "pw"
    f.write_text("s3cret\r\n")
    e = {k: v for k, v in os.environ.items() if not k.startswith("DERENDER_")}
    e |= {"PYTHONPATH": str(REPO), "DERENDER_REDIS_PASSWORD_FILE": str(f)}
    broker_port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "worker.cli", "run", "--tokenizer", QWEN3, "--num-threads", "1",
                             "--bootstrap-servers", f"127.0.0.1:{broker_port}", "--redis-url", redis_with_password,
                             "--metrics-port", "0"],
                            cwd=REPO, env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        # Popen returns once the exec closed the child's close-on-exec pipe, which the kernel does
        # before it fills in the new image's argument area: cmdline reads b"" until then.
        deadline = time.monotonic() + 30
        while not (cmdline := Path(f"/proc/{proc.pid}/cmdline").read_bytes()) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert b"s3cret" not in cmdline and b"--redis-url" in cmdline, cmdline
        out = proc.communicate(timeout=120)[0]
    finally:
        proc.kill()
        proc.wait(10)
    assert "redis refused" not in out and "Kafka broker unreachable" in out, out  # Redis took the password


@pytest.mark.parametrize("content,expected", [("pw\n", "pw"), ("pw\r\n", "pw"), ("pw", "pw"), ("p w\n\n", "p w\n"),
                                              ("  pw  \n", "  pw  ")])
def test_secret_file_content(tmp_path, content, expected):
    f = tmp_path / "s"
    f.write_bytes(content.encode())
    assert secret("--sasl-password", None, str(f)) == expected
    assert secret("--sasl-password", "flag", None) == "flag"
    assert secret("--sasl-password", None, None) is None


@pytest.mark.parametrize("make,needles", [
    (lambda f: None, ("--sasl-password-file", "cannot read")),
    (lambda f: f.write_text("\n"), ("--sasl-password-file", "empty")),
    (lambda f: f.write_bytes(b"\xff\xfe-hidden\n"), ("--sasl-password-file", "not UTF-8")),
    (lambda f: f.write_text("x" * (MAX_SECRET_BYTES + 1)), ("--sasl-password-file", "larger than")),
], ids=["missing", "empty", "binary", "too-big"])
def test_a_bad_password_file_is_named_not_shown(tmp_path, make, needles):
    f = tmp_path / "sasl"
    make(f)
    with pytest.raises(ValueError) as e:
        secret("--sasl-password", None, str(f))
    for n in (*needles, str(f)):
        assert n in str(e.value)
    assert "hidden" not in str(e.value)


def test_a_password_and_its_file_both_given_is_one_line(tmp_path):
    f = tmp_path / "sasl"
    f.write_text("from-file\n")
    p = cli(*RUN, "--stream-state", "memory", "--security-protocol", "SASL_PLAINTEXT", "--sasl-username", "u",
            "--sasl-password", "given", "--sasl-password-file", str(f))
    line = one_error_line(p, "bad configuration", "--sasl-password and --sasl-password-file both given")
    assert "from-file" not in line and "given" not in line.replace("both given", "")


def test_the_sasl_password_file_reaches_the_kafka_client(tmp_path):
    f = tmp_path / "sasl"
    f.write_text("from-file\n")
    args, _ = parse_args(["run", "--security-protocol", "SASL_SSL", "--sasl-mechanism", "SCRAM-SHA-512",
                          "--sasl-username", "u", "--sasl-password-file", str(f), "--ssl-cafile", str(TLS / "ca.pem")])
    kw = security_kwargs(args)
    assert kw["sasl_plain_password"] == "from-file" and kw["sasl_plain_username"] == "u"
    args, _ = parse_args(["run", "--security-protocol", "SASL_PLAINTEXT", "--sasl-username", "u"])
    with pytest.raises(ValueError, match="--sasl-password-file"):
        security_kwargs(args)
