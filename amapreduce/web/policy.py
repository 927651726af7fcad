"""URL policy: which addresses a crawl (or a model steering one) may reach.

Why this exists: a page or a model can hand the crawler any URL, including ones that point at
the machine itself, the LAN or a cloud metadata service that hands out credentials. Every URL,
and every redirect hop, goes through `UrlPolicy.check`, which resolves the host and checks every
address it resolves to. Odd spellings (`0x7f000001`, `2130706433`, `127.1`, `[::1]`,
`[::ffff:127.0.0.1]`) are normalised before the check, so they cannot slip through.

The check returns the addresses it approved; `fetch` pins each connection to them, so a second
DNS answer cannot steer the socket elsewhere (DNS rebinding).
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Callable, Sequence
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator

from amapreduce.errors import RunError, ToolCallRefused
from amapreduce.settings import normalize_domains

__all__ = [
    "METADATA_ADDRESSES",
    "METADATA_HOSTS",
    "CheckedUrl",
    "Resolver",
    "UrlPolicy",
    "UrlRefused",
    "address_problem",
    "parse_ip_literal",
    "system_resolver",
]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolver = Callable[[str, int], list[str]]
"""(host, port) -> the addresses the host resolves to, as strings."""

METADATA_ADDRESSES: frozenset[IPAddress] = frozenset(
    ipaddress.ip_address(a)
    for a in (
        "169.254.169.254",  # AWS, GCP, Azure, OpenStack, DigitalOcean ...
        "169.254.170.2",  # AWS ECS task metadata
        "169.254.169.253",  # AWS DNS / time
        "100.100.100.200",  # Alibaba Cloud
        "192.0.0.192",  # Oracle Cloud (legacy)
        "fd00:ec2::254",  # AWS IMDS over IPv6
    )
)
METADATA_HOSTS: frozenset[str] = frozenset(
    {"metadata.google.internal", "metadata.goog", "metadata", "instance-data", "instance-data.ec2.internal"}
)
_SHARED = ipaddress.ip_network("100.64.0.0/10")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_LEGACY_V4 = re.compile(r"^(0x[0-9a-f]+|[0-9]+)(\.(0x[0-9a-f]+|[0-9]+)){0,3}$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class UrlRefused(ToolCallRefused):
    """The URL policy refuses a URL; the message says why and what to do instead."""


class CheckedUrl(BaseModel):
    """A URL that passed the policy, with the addresses that were checked."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str
    host: str
    port: int
    addresses: tuple[str, ...]


def system_resolver(host: str, port: int) -> list[str]:
    """Resolve `host` with the operating system, returning every address (IPv4 and IPv6).

    Raises:
        RunError: the name does not resolve (offline, or no such host).
    """
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise RunError(
            f"cannot resolve host `{host}`: {exc}. Check the URL, or your network connection.",
            host=host,
            outage=True,  # the host's crawl breaker counts it (`web.service`)
        ) from exc
    return sorted({str(info[4][0]).split("%", 1)[0] for info in infos})


def parse_ip_literal(host: str) -> IPAddress | None:
    """Return the address a host string spells directly, or None for a real host name.

    Accepts dotted quads, IPv6 (with or without brackets or a zone id), and the legacy IPv4
    forms that `inet_aton` and browsers accept: `0x7f000001`, `2130706433`, `0177.0.0.1`, `127.1`.
    """
    text = host.strip().lower().strip("[]").split("%", 1)[0].rstrip(".")
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        pass
    if _LEGACY_V4.match(text):
        try:
            return ipaddress.IPv4Address(socket.inet_aton(text))
        except OSError:
            return None
    return None


def _embedded_v4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one tunnels to (mapped, 6to4, Teredo, NAT64), if any."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip.teredo is not None:
        return ip.teredo[1]
    if ip in _NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def address_problem(ip: IPAddress) -> tuple[str, bool] | None:
    """Why an address may not be reached, or None when it is public.

    Returns:
        (reason, is_metadata): `is_metadata` marks addresses refused even with
        `allow_private_urls`.
    """
    if isinstance(ip, ipaddress.IPv6Address):
        inner = _embedded_v4(ip)
        if inner is not None:
            # The packet goes to the embedded IPv4 address, so that address decides.
            found = address_problem(inner)
            return None if found is None else (f"{found[0]} {inner} embedded in", found[1])
    if ip in METADATA_ADDRESSES:
        return ("a cloud metadata address", True)
    checks: Sequence[tuple[bool, str]] = (
        (ip.is_unspecified, "an unspecified address"),
        (ip.is_loopback, "a loopback address"),
        (ip.is_link_local, "a link-local address"),
        (isinstance(ip, ipaddress.IPv4Address) and ip in _SHARED, "a shared (carrier-grade NAT) address"),
        (ip.is_multicast, "a multicast address"),
        (ip.is_private, "a private address"),
        (ip.is_reserved, "a reserved address"),
        (not ip.is_global, "a non-public address"),
    )
    for hit, reason in checks:
        if hit:
            return (reason, False)
    return None


def _domain_matches(host: str, literal: IPAddress | None, domains: Sequence[str]) -> bool:
    """Whether a host is on a list: names match a domain or its subdomains; an IP-literal host
    matches only an entry spelling the same address (so `example.com` never admits an IP)."""
    if literal is not None:
        return any(parse_ip_literal(d) == literal for d in domains)
    return any(host == d or host.endswith("." + d) for d in domains)


class UrlPolicy(BaseModel):
    """Which URLs may be fetched.

    Deny beats allow; an empty `allowed_domains` allows every public host. Cloud metadata
    addresses and host names are refused whatever the settings say.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    allow_private_urls: bool = False
    """Allow loopback, private, link-local ... addresses (tests, intranet crawls)."""
    allowed_domains: tuple[str, ...] = Field(default=())
    """When not empty, only these domains and their subdomains may be fetched."""
    denied_domains: tuple[str, ...] = Field(default=())
    """These domains and their subdomains are never fetched."""

    @field_validator("allowed_domains", "denied_domains", mode="before")
    @classmethod
    def _normalize_domains(cls, value: object) -> tuple[str, ...]:
        return normalize_domains(value)

    def check(self, url: str, resolver: Resolver | None = None) -> CheckedUrl:
        """Check one URL (one redirect hop) and return it with its checked addresses.

        Raises:
            UrlRefused: the scheme, host, domain or any resolved address is not allowed.
            RunError: the host does not resolve.
        """
        if _CONTROL.search(url.strip()):
            raise UrlRefused(f"refused URL {url!r}: it contains a control character. "
                             "Percent-encode it or copy the URL again.")
        try:
            # urlsplit itself raises ValueError on a malformed host such as `http://[::1/`.
            parts = urlsplit(url.strip())
            scheme = parts.scheme.lower()
            raw_host = parts.hostname
            port = parts.port or (443 if scheme == "https" else 80)
        except ValueError as exc:
            raise UrlRefused(f"refused URL {url!r}: {exc}. Check the URL.") from None
        if scheme not in ("http", "https"):
            raise UrlRefused(
                f"refused URL {url!r}: scheme `{scheme or '(none)'}` is not allowed. "
                "Use an http:// or https:// URL."
            )
        if not raw_host:
            raise UrlRefused(f"refused URL {url!r}: it has no host. Give a full http(s) URL.")
        if parts.username is not None or parts.password is not None:
            raise UrlRefused(f"refused URL {url!r}: credentials in URLs are not allowed. Remove `user@`.")
        host = raw_host.lower().rstrip(".")
        literal = parse_ip_literal(host)
        if literal is None:
            self._check_name(url, host)
            addresses = (resolver or system_resolver)(host, port)
            if not addresses:
                raise RunError(f"cannot resolve host `{host}`: no addresses. Check the URL.", host=host)
        else:
            self._check_lists(url, host, literal)
            addresses = [str(literal)]
        for text in addresses:
            ip = parse_ip_literal(text)
            if ip is None:
                raise UrlRefused(f"refused URL {url!r}: resolver returned an unreadable address {text!r}.")
            problem = address_problem(ip)
            if problem is None:
                continue
            reason, is_metadata = problem
            if is_metadata or not self.allow_private_urls:
                hint = (
                    "Metadata services are never reachable."
                    if is_metadata
                    else "Only public addresses may be crawled (set allow_private_urls for local servers)."
                )
                raise UrlRefused(f"refused URL {url!r}: host `{host}` is {reason} ({ip}). {hint}")
        return CheckedUrl(url=url, host=host, port=port, addresses=tuple(addresses))

    def _check_name(self, url: str, host: str) -> None:
        if host in METADATA_HOSTS:
            raise UrlRefused(f"refused URL {url!r}: `{host}` is a cloud metadata host. It is never reachable.")
        if (host == "localhost" or host.endswith(".localhost")) and not self.allow_private_urls:
            raise UrlRefused(
                f"refused URL {url!r}: `{host}` is the local machine. "
                "Only public hosts may be crawled (set allow_private_urls for local servers)."
            )
        self._check_lists(url, host, None)

    def _check_lists(self, url: str, host: str, literal: IPAddress | None) -> None:
        if _domain_matches(host, literal, self.denied_domains):
            raise UrlRefused(f"refused URL {url!r}: domain `{host}` is on the deny list. Use another source.")
        if self.allowed_domains and not _domain_matches(host, literal, self.allowed_domains):
            what = "address" if literal is not None else "domain"
            raise UrlRefused(
                f"refused URL {url!r}: {what} `{host}` is not on the allow list "
                f"({', '.join(self.allowed_domains)}). Use a URL from an allowed domain."
            )
