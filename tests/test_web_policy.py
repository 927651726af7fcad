"""URL policy: every spelling of a private or metadata address is refused."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from amapreduce.errors import RunError
from amapreduce.settings import load_settings
from amapreduce.web.policy import UrlPolicy, UrlRefused, address_problem, parse_ip_literal
from amapreduce.web.service import WebService

PUBLIC = lambda host, port: ["93.184.216.34"]  # noqa: E731  (a fake resolver: every name is public)


@pytest.mark.parametrize("url", [
    "http://127.0.0.1/", "http://0x7f000001/", "http://0x7F.0.0.1/", "http://2130706433/", "http://127.1/",
    "http://0177.0.0.1/", "http://017700000001/", "http://[::1]/", "http://[0:0:0:0:0:0:0:1]/",
    "http://[::ffff:127.0.0.1]/", "http://[::ffff:7f00:1]/", "http://[2002:7f00:1::]/", "http://[64:ff9b::7f00:1]/",
    "http://10.0.0.1/", "http://172.16.5.4/", "http://192.168.0.1/", "http://169.254.1.1/", "http://[fe80::1%25eth0]/",
    "http://100.64.0.1/", "http://224.0.0.1/", "http://240.0.0.1/", "http://0.0.0.0/", "http://0/", "http://[::]/",
    "http://[fc00::1]/", "http://localhost/", "http://api.localhost:8080/", "http://127.0.0.1./",
    "https://127.0.0.1:8443/x?y=1",
])
def test_private_spellings_are_refused_by_default(url: str) -> None:
    with pytest.raises(UrlRefused, match="refused URL"):
        UrlPolicy().check(url, PUBLIC)


@pytest.mark.parametrize("url", [
    "http://169.254.169.254/latest/meta-data/", "http://[::ffff:169.254.169.254]/", "http://0xa9fea9fe/",
    "http://2852039166/", "http://[fd00:ec2::254]/", "http://100.100.100.200/", "http://metadata.google.internal/",
    "http://METADATA.GOOGLE.INTERNAL./", "http://169.254.170.2/v2/credentials",
])
def test_cloud_metadata_is_refused_even_with_private_urls(url: str) -> None:
    with pytest.raises(UrlRefused, match="metadata"):
        UrlPolicy(allow_private_urls=True).check(url, PUBLIC)


def test_name_resolving_to_metadata_is_refused_even_with_private_urls() -> None:
    with pytest.raises(UrlRefused, match="metadata"):
        UrlPolicy(allow_private_urls=True).check("http://sneaky.example/", lambda h, p: ["169.254.169.254"])


def test_every_resolved_address_is_checked() -> None:
    with pytest.raises(UrlRefused, match="private"):
        UrlPolicy().check("http://mixed.example/", lambda h, p: ["8.8.8.8", "192.168.1.20"])


@pytest.mark.parametrize("url", ["http://127.0.0.1:8000/", "http://[::1]/", "http://localhost/", "http://10.1.1.1/"])
def test_private_allowed_when_set(url: str) -> None:
    checked = UrlPolicy(allow_private_urls=True).check(url, lambda h, p: ["127.0.0.1"])
    assert checked.addresses


def test_public_url_passes_with_its_addresses() -> None:
    checked = UrlPolicy().check("https://Example.COM/path", PUBLIC)
    assert (checked.host, checked.port, checked.addresses) == ("example.com", 443, ("93.184.216.34",))


@pytest.mark.parametrize("url", ["ftp://example.com/", "file:///etc/passwd", "javascript:alert(1)", "example.com",
                                 "http:///nohost", "http://user:pw@example.com/", "http://[::1/", "http://[::1]x/",
                                 "http://example.com:99999/", "http://example.com/a\x01b"])
def test_bad_schemes_hosts_and_credentials(url: str) -> None:
    with pytest.raises(UrlRefused):
        UrlPolicy().check(url, PUBLIC)


def test_domain_lists() -> None:
    policy = UrlPolicy(allowed_domains=("example.org",), denied_domains=("bad.example.org",))
    assert policy.check("http://www.example.org/", PUBLIC).host == "www.example.org"
    with pytest.raises(UrlRefused, match="deny list"):
        policy.check("http://x.bad.example.org/", PUBLIC)
    with pytest.raises(UrlRefused, match="allow list"):
        policy.check("http://example.com/", PUBLIC)
    with pytest.raises(UrlRefused, match="allow list"):
        policy.check("http://notexample.org/", PUBLIC)  # suffix match is on label boundaries


def test_malformed_url_is_refused_with_one_line_not_a_value_error() -> None:
    with pytest.raises(UrlRefused, match=r"refused URL 'http://\[::1/': Invalid IPv6 URL\. Check the URL\."):
        UrlPolicy().check("http://[::1/", PUBLIC)


def test_domain_lists_apply_to_ip_literal_hosts() -> None:
    allow = UrlPolicy(allowed_domains=("example.com",))
    for url in ("http://93.184.216.34/", "http://0x5db8d822/", "http://[2606:2800:220:1::]/"):
        with pytest.raises(UrlRefused, match="address .* is not on the allow list"):
            allow.check(url, PUBLIC)
    assert allow.check("http://www.example.com/", PUBLIC).host == "www.example.com"
    listed = UrlPolicy(allowed_domains=("example.com", "93.184.216.34"))
    assert listed.check("http://1572395042/", PUBLIC).addresses == ("93.184.216.34",)  # any spelling of it
    with pytest.raises(UrlRefused, match="deny list"):
        UrlPolicy(denied_domains=("93.184.216.34",)).check("http://93.184.216.34/", PUBLIC)
    with pytest.raises(UrlRefused, match="deny list"):  # deny beats allow
        UrlPolicy(allowed_domains=("93.184.216.34",), denied_domains=("93.184.216.34",)).check(
            "http://93.184.216.34/", PUBLIC)


def test_domain_lists_are_normalised() -> None:
    policy = UrlPolicy(allowed_domains=" Example.ORG, *.wiki.test ,, .news.test. ", denied_domains=["BAD.example.org"])
    assert policy.allowed_domains == ("example.org", "wiki.test", "news.test")
    assert policy.denied_domains == ("bad.example.org",)
    assert policy.check("http://en.wiki.test/", PUBLIC).host == "en.wiki.test"
    with pytest.raises(UrlRefused, match="deny list"):
        policy.check("http://bad.example.org/", PUBLIC)


def test_domain_lists_come_from_settings_and_the_environment(tmp_path: Path) -> None:
    settings = load_settings({"AMAPREDUCE_ALLOWED_DOMAINS": "example.org, wiki.test",
                              "AMAPREDUCE_DENIED_DOMAINS": "bad.example.org",
                              "AMAPREDUCE_CACHE_DIR": str(tmp_path)})
    assert settings.allowed_domains == ("example.org", "wiki.test")
    policy = WebService.from_settings(settings, backend="ddgs").policy
    assert (policy.allowed_domains, policy.denied_domains) == (("example.org", "wiki.test"), ("bad.example.org",))
    assert load_settings({}).allowed_domains == ()


def test_unresolvable_host_is_a_run_error() -> None:
    def fail(host: str, port: int) -> list[str]:
        raise RunError(f"cannot resolve host `{host}`")

    with pytest.raises(RunError, match="cannot resolve"):
        UrlPolicy().check("http://nowhere.invalid/", fail)


def test_parse_ip_literal_leaves_names_alone() -> None:
    assert parse_ip_literal("cafe") is None
    assert parse_ip_literal("example.com") is None
    assert parse_ip_literal("123.example.com") is None
    assert parse_ip_literal("0x7f.1") == ipaddress.ip_address("127.0.0.1")


@given(st.integers(min_value=0, max_value=2**32 - 1))
def test_every_ipv4_spelling_agrees_with_the_dotted_form(value: int) -> None:
    ip = ipaddress.IPv4Address(value)
    dotted = address_problem(ip)
    for spelling in (str(value), hex(value), f"[::ffff:{ip}]"):
        parsed = parse_ip_literal(spelling)
        assert parsed is not None
        assert (address_problem(parsed) is None) == (dotted is None)
