"""One TLS context per process for kb's HTTP clients.

httpx makes a new ssl.SSLContext for each client and loads the whole CA
file into it: 26 to 33 ms of CPU each time on this machine (httpx 0.29,
certifi). kb made a client for each Ollama call (each embedding batch, each
look at its models), two contexts for each guarded fetch client, and one
for each client of the gate, the translator and the captioner (the openai
and groq SDKs take an httpx client: `http_client=DefaultHttpxClient(verify=
tls_context())` keeps the SDK's defaults). With one context per process, a
new Ollama, gate or translator client costs 0.2 ms, not 26 to 33 ms.

The context is the one that httpx makes by default: the same trust store
(certifi, or SSL_CERT_FILE and SSL_CERT_DIR with trust_env), the same
checks of names and certificates. An SSLContext is safe to share between
threads and clients; no code of kb changes it after it is made.
"""

from __future__ import annotations

import functools
import ssl

import httpx


@functools.cache
def tls_context(*, trust_env: bool = True) -> ssl.SSLContext:
    """httpx's default context, made once per process for each `trust_env`."""
    return httpx.create_ssl_context(trust_env=trust_env)
