"""One key for one web address: `normalize_url()`.

The key joins a bookmark's link to the document that the link points to, so
the same page seen through different spellings of its address must give the
same key. The key is never fetched: the documents stage fetches the
expanded URL as X gave it. So a rule here may drop parts that a server needs
(for example the order of query parameters), as long as two addresses with
the same key show the same page.

Rules, in order:
 1. Remove spaces around the address. An address without a scheme or a host
    is not a web address: ValueError.
 2. Lowercase the scheme and the host. Both are case-insensitive (RFC 3986
    section 6.2.2.1); the path is not, so the path keeps its case.
 3. Remove a trailing dot of the host ("example.com." is "example.com").
 4. Remove the default port: 80 for http, 443 for https.
 5. Write every X host (x.com, twitter.com, their www. and mobile. names) as
    https://x.com. Reason: t.co expands to both names for the same post (the
    captures hold http://x.com/i/article/... and https://twitter.com/i/...).
 6. Remove the fragment (#...). The browser does not send it to the server.
 7. Remove tracking parameters (TRACKING_PARAMS and every utm_*). They name
    the campaign that shared the link, not the page.
 8. Sort the remaining query parameters. Order does not change the page on
    the sites that we know, and a sorted order makes one key.
 9. Remove trailing slashes of the path; the root path "/" becomes "".
    Reason: "https://site.app/" and "https://site.app" occur for the same
    page in one post of the captures.
"""

from __future__ import annotations

from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

# Query parameters that only say who shared the link or which ad it came
# from. utm_* parameters are removed by prefix (rule 7).
TRACKING_PARAMS = frozenset({
    "fbclid",      # Facebook click id
    "gclid",       # Google Ads click id
    "dclid",       # Google Display click id
    "gbraid",      # Google Ads, iOS
    "wbraid",      # Google Ads, web-to-app
    "msclkid",     # Microsoft Ads click id
    "yclid",       # Yandex click id
    "twclid",      # X Ads click id
    "igshid",      # Instagram share id
    "mc_cid",      # Mailchimp campaign id
    "mc_eid",      # Mailchimp subscriber id
    "_hsenc",      # HubSpot
    "_hsmi",       # HubSpot
    "ref_src",     # X share source (ref_src=twsrc^tfw)
    "ref_url",     # X embed source page
})
TRACKING_PREFIXES = ("utm_",)

X_HOSTS = frozenset({
    "x.com", "www.x.com", "mobile.x.com",
    "twitter.com", "www.twitter.com", "mobile.twitter.com",
})
DEFAULT_PORTS = {"http": 80, "https": 443}


def is_tracking_param(name: str) -> bool:
    lowered = name.lower()
    return lowered in TRACKING_PARAMS or lowered.startswith(TRACKING_PREFIXES)


def normalize_url(url: str) -> str:
    """The key of a web address. See the module docstring for each rule."""
    parts = urlsplit(url.strip())
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").rstrip(".")  # .hostname is lowercase already
    if not scheme or not host:
        raise ValueError(f"{url!r} is not an absolute web address (no scheme or no host)")
    try:
        port = parts.port
    except ValueError as exc:  # a port that is not a number
        raise ValueError(f"{url!r} has a bad port ({exc})") from exc

    if host in X_HOSTS:
        scheme, host, port = "https", "x.com", None
    if port is not None and port == DEFAULT_PORTS.get(scheme):
        port = None

    netloc = host if port is None else f"{host}:{port}"
    if parts.username is not None:
        userinfo = parts.username + (f":{parts.password}" if parts.password is not None else "")
        netloc = f"{userinfo}@{netloc}"

    query_pairs = [
        (name, value)
        for name, value in parse_qsl(parts.query, keep_blank_values=True)
        if not is_tracking_param(name)
    ]
    query = urlencode(sorted(query_pairs), doseq=True)
    path = parts.path.rstrip("/")
    return urlunsplit((scheme, netloc, path, query, ""))


def url_host(url: str) -> str:
    """The host of an address, lowercase, without port (for `links.host`)."""
    return (urlsplit(normalize_url(url)).hostname or "").lower()
