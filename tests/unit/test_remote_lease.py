"""The push lease: one writer per workspace history (``store.remote._lease``).

The claims fallback runs against the real server (``rclone serve s3`` 1.75 ignores
``If-None-Match``, which ``probe_conditional`` must find); the conditional path runs on
``DirBackend``, whose conditional create is honoured like AWS S3's."""

from __future__ import annotations

import json
import time

import pytest
from remotekit import cli, s3  # noqa: F401  (s3: the fixture)

from rewindfs.store._errors import BadRemoteUrl, LeaseHeld
from rewindfs.store.remote import (DirBackend, Lease, RemoteConfig, open_backend, parse_url,
                                   probe_conditional)


def _two(backend, conditional):
    return (Lease(backend, "origin", "w1", "store-a", conditional=conditional),
            Lease(backend, "origin", "w1", "store-b", conditional=conditional))


def _refuses_the_second_and_names_the_first(backend, conditional):
    a, b = _two(backend, conditional)
    with a:
        with pytest.raises(LeaseHeld) as info:
            b.acquire()
        assert "store-a" in info.value.message and info.value.code == "lease-held"
    with b:                                            # released: the other may take it
        with pytest.raises(LeaseHeld):
            Lease(backend, "origin", "w1", "store-c", conditional=conditional).acquire()
    Lease(backend, "origin", "w2", "store-c", conditional=conditional).acquire().release()


def test_the_real_server_ignores_conditional_writes_and_the_claims_hold(s3):
    backend = open_backend(RemoteConfig("origin", s3.url(), s3.endpoint))
    assert probe_conditional(backend) is False
    assert backend.list("probe/") == []                 # the probe cleaned up
    _refuses_the_second_and_names_the_first(backend, conditional=False)


def test_conditional_create_refuses_the_second(tmp_path):
    backend = DirBackend(tmp_path)
    assert probe_conditional(backend) is True
    _refuses_the_second_and_names_the_first(backend, conditional=True)


@pytest.mark.parametrize("conditional", [True, False])
def test_an_expired_lease_is_taken_over(tmp_path, conditional):
    backend = DirBackend(tmp_path)
    a, b = _two(backend, conditional)
    a.ttl_s = -1                                       # written already expired
    a.acquire()
    b.acquire()                                        # no refusal: a's lease ran out
    assert json.loads(backend.get("ws/w1/lease" if conditional else
                                  f"ws/w1/claims/{b.token}"))["store"] == "store-b"
    b.release()


@pytest.mark.parametrize("conditional", [True, False])
def test_our_own_lease_from_a_push_that_died_is_not_a_refusal(tmp_path, conditional):
    backend = DirBackend(tmp_path)
    dead = Lease(backend, "origin", "w1", "store-a", conditional=conditional)
    body = json.loads(dead._body())
    body.update(pid=2 ** 22 + 12345)                   # a pid that is not running
    key = "ws/w1/lease" if conditional else "ws/w1/claims/old"
    backend.put(key, json.dumps(body).encode())
    again = Lease(backend, "origin", "w1", "store-a", conditional=conditional).acquire()
    assert again.held
    again.release()
    assert backend.list("ws/w1/") == []


def test_renew_pushes_the_expiry_out(tmp_path):
    backend = DirBackend(tmp_path)
    lease = Lease(backend, "origin", "w1", "store-a", conditional=True, ttl_s=2).acquire()
    first = json.loads(backend.get("ws/w1/lease"))["expires"]
    lease.expires = time.time()                          # as if half of it had run out
    lease.renew()
    assert json.loads(backend.get("ws/w1/lease"))["expires"] > first
    lease.release()


@pytest.mark.parametrize("url", ["http://x/y", "s3://", "s3://Bad_Bucket/p", "s3://bkt/a/../b",
                                 "s3://bkt//x"])
def test_bad_urls_are_refused(url):
    with pytest.raises(BadRemoteUrl):
        parse_url(url)


@pytest.mark.parametrize("url, says", [
    ("s3://b/p", "'b'"), ("s3://ab", "'ab'"), ("s3://Bad_Bucket/p", "'Bad_Bucket'"),
    ("s3://" + "x" * 64, "3 to 63")])
def test_a_bucket_name_s3_refuses_is_named_as_the_problem(url, says):
    """``s3://b/p`` was refused with "expected s3://BUCKET or s3://BUCKET/PREFIX" — the
    very form the person wrote: the bucket name is what S3 does not take, so say so."""
    with pytest.raises(BadRemoteUrl) as exc:
        parse_url(url)
    assert says in str(exc.value) and "bucket" in str(exc.value), str(exc.value)
    assert "expected s3://BUCKET" not in str(exc.value)


@pytest.mark.parametrize("endpoint", ["notaurl", "ftp://host", "http://", "localhost:9000"])
def test_an_endpoint_that_is_not_an_http_url_is_a_usage_error(tmp_path, capsys, endpoint):
    """``remote add --endpoint notaurl`` ended in "could not run: ValueError: Invalid
    endpoint" (botocore's words, exit 2); it is the person's input: a usage error that
    names it, and no remote is added."""
    store = tmp_path / "store"
    code, recs = cli(capsys, "--store", store, "remote", "add", "o", "s3://bkt/p",
                     "--endpoint", endpoint)
    (err,) = [r for r in recs if r["type"] == "error"]
    assert code == 3 and err["code"] == "bad-remote-url", recs
    assert endpoint in err["message"] and "http" in err["message"], err
    code, recs = cli(capsys, "--store", store, "remote", "list")
    assert code == 0 and not [r for r in recs if r["type"] == "remote"], recs


def test_no_credentials_is_named_with_where_they_come_from(tmp_path, capsys, monkeypatch):
    """With no AWS credentials anywhere, ``remote add`` said "could not be reached or
    refused the request: delete probe/…: Unable to locate credentials; run the command
    again to resume" — running it again changes nothing.  Say what is missing and where
    rewindfs looks for it; no remote is added."""
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                "AWS_PROFILE", "AWS_DEFAULT_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    store = tmp_path / "store"
    code, recs = cli(capsys, "--store", store, "remote", "add", "o", "s3://bkt/p",
                     "--endpoint", "http://127.0.0.1:9")
    (err,) = [r for r in recs if r["type"] == "error"]
    assert code == 2 and err["code"] == "remote-no-credentials", recs
    assert "AWS_ACCESS_KEY_ID" in err["message"] and "again" not in err["message"], err
    code, recs = cli(capsys, "--store", store, "remote", "list")
    assert code == 0 and not [r for r in recs if r["type"] == "remote"], recs


def test_good_urls_parse():
    assert parse_url("s3://bkt") == ("bkt", "")
    assert parse_url("s3://my.bucket-1/team/agents/") == ("my.bucket-1", "team/agents")


@pytest.mark.parametrize("name", ["", "bad name", "x\ny", "../x", ".hidden", "a/b", "x" * 65])
def test_a_bad_remote_name_is_named_before_anything_is_asked(tmp_path, capsys, monkeypatch,
                                                             name):
    """``remote add 'bad name' s3://bkt/p`` first asked the server (without credentials:
    "Remote bad name: no AWS credentials were found"), and with credentials it probed
    the bucket before refusing the name as a "Bad remote URL 'bad name'" — the name is
    no URL.  As ``git remote add`` does, the name is checked first and named as the
    problem (``bad-remote-name``, exit 3); nothing is asked of the server (no endpoint
    listens here) and no remote is added."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "y")
    store = tmp_path / "store"
    code, recs = cli(capsys, "--store", store, "remote", "add", name, "s3://bkt/p",
                     "--endpoint", "http://127.0.0.1:9")
    (err,) = [r for r in recs if r["type"] == "error"]
    assert code == 3 and err["code"] == "bad-remote-name", recs
    assert "URL" not in err["message"] and "letters, digits" in err["message"], err
    assert not store.exists()
