"""Access-layer diagnoses for an OpenAI-compatible endpoint (router or a gateway in front).

Pure functions: each takes what was sent and what came back and returns a Finding (or
None when there is nothing to say). The checks in checks.py make the requests for real
and call these; the unit tests call them on captured answers.

- proxy variables that would carry a client's request elsewhere (http_proxy, HTTP_PROXY,
  https_proxy, all_proxy, with no_proxy/NO_PROXY exclusions, as curl, Python urllib,
  requests, httpx and the openai SDK read them);
- 401/403: what was sent (no key, a key with a newline, 'Bearer' missing or doubled, a
  wrong key), shown by length and checksum, never the key itself;
- a base URL that already ends in /v1 (clients append /v1/chat/completions: /v1/v1);
- HTTP 200 whose body has no 'choices' (an error in a 200), empty choices or empty
  content because max_tokens was 0.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import re
from dataclasses import dataclass
from typing import Any
from collections.abc import Mapping
from urllib.parse import urlsplit, urlunsplit

CHAT_PATH = "/v1/chat/completions"


@dataclass(frozen=True)
class Finding:
    problem: str  # what is wrong, with the evidence (one line)
    hint: str  # what to do (one line)


# --- proxies ---------------------------------------------------------------------------
@dataclass(frozen=True)
class ProxyChoice:
    variable: str  # the environment variable that applies, e.g. http_proxy
    value: str  # its value (credentials masked by shown())
    no_proxy_variable: str | None  # the no_proxy variable that was consulted, if set
    no_proxy_value: str

    def shown(self) -> str:
        return f"{self.variable}={mask_url(self.value)}"

    @property
    def scheme(self) -> str:
        v = self.value if "://" in self.value else "http://" + self.value
        return urlsplit(v).scheme.lower()

    @property
    def url(self) -> str:
        return self.value if "://" in self.value else "http://" + self.value


def mask_url(url: str) -> str:
    parts = urlsplit(url if "://" in url else "http://" + url)
    if parts.username or parts.password:
        host = parts.hostname or ""
        if parts.port:
            host += f":{parts.port}"
        user = parts.username or ""
        return urlunsplit((parts.scheme, f"{user}:***@{host}", parts.path, parts.query, parts.fragment))
    return url


def _first(env: Mapping[str, str], names: tuple[str, ...]) -> tuple[str, str] | None:
    for name in names:
        value = env.get(name)
        if value is not None and value.strip():
            return name, value.strip()
    return None


def no_proxy_matches(host: str, port: int | None, no_proxy: str) -> bool:
    """Does a no_proxy value exclude host[:port]? Entries: '*', domain suffixes (with or
    without a leading dot), host:port, IP addresses and CIDR ranges."""
    host = host.strip("[]").lower()
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        ip = None
    for raw in re.split(r"[,\s]+", no_proxy):
        entry = raw.strip().lower()
        if not entry:
            continue
        if entry == "*":
            return True
        entry_port = None
        if entry.count(":") == 1 and not entry.startswith("["):
            entry, _, p = entry.partition(":")
            entry_port = int(p) if p.isdigit() else None
        entry = entry.strip("[]")
        if entry_port is not None and port is not None and entry_port != port:
            continue
        if ip is not None:
            try:
                if "/" in entry and ip in ipaddress.ip_network(entry, strict=False):
                    return True
                if ipaddress.ip_address(entry) == ip:
                    return True
            except ValueError:
                pass
            continue
        entry = entry.lstrip(".")
        if host == entry or host.endswith("." + entry):
            return True
    return False


def proxy_for(url: str, env: Mapping[str, str]) -> ProxyChoice | None:
    """The proxy a client in this environment would use for ``url`` (None: direct)."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    names = {"http": ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"),
             "https": ("https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY")}.get(scheme, ("all_proxy", "ALL_PROXY"))
    found = _first(env, names)
    if found is None:
        return None
    np = _first(env, ("no_proxy", "NO_PROXY"))
    if np and no_proxy_matches(parts.hostname or "", parts.port, np[1]):
        return None
    return ProxyChoice(found[0], found[1], np[0] if np else None, np[1] if np else "")


def proxy_variables_set(env: Mapping[str, str]) -> list[str]:
    names = ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY",
             "no_proxy", "NO_PROXY")
    return [f"{n}={mask_url(env[n]) if 'proxy' in n.lower() and 'no_' not in n.lower() else env[n]}"
            for n in names if env.get(n, "").strip()]


def bypass_hint(host: str, choice: ProxyChoice) -> str:
    entries = [e for e in re.split(r"[,\s]+", choice.no_proxy_value) if e]
    for extra in (host, "localhost", "127.0.0.1"):
        if extra not in entries:
            entries.append(extra)
    value = ",".join(entries)
    return (f"bypass the proxy for this host: export NO_PROXY={value} no_proxy={value} "
            f"(or unset {choice.variable} in this environment)")


def diagnose_proxy(url: str, choice: ProxyChoice | None, direct_status: int | None, direct_error: str | None,
                   via_status: int | None, via_error: str | None, via_body: str = "") -> Finding | None:
    """A proxy applies to ``url``: did going through it break what works directly?"""
    if choice is None:
        return None
    host = urlsplit(url).hostname or ""
    if via_status is None or (direct_status is not None and via_status != direct_status
                               and via_status in (403, 407, 502, 503, 504)):
        what = via_error if via_status is None else f"answered HTTP {via_status}" + (
            f" ({' '.join(via_body.split())[:160]})" if via_body.strip() else "")
        direct = (f"the same request sent directly got HTTP {direct_status}" if direct_status is not None
                  else f"directly it fails too ({direct_error})")
        curl = " (curl ignores upper-case HTTP_PROXY; Python urllib/requests/httpx/openai honour it)" \
            if choice.variable == "HTTP_PROXY" else ""
        return Finding(
            f"{choice.shown()} sends requests for {host} to the proxy{curl}"
            + (f"; {choice.no_proxy_variable}={choice.no_proxy_value!r} does not exclude {host}"
               if choice.no_proxy_variable else "; no_proxy is not set")
            + f"; through the proxy: {what}; {direct}",
            bypass_hint(host, choice),
        )
    return None


# --- API key and Authorization header --------------------------------------------------
def key_fingerprint(secret: str) -> str:
    return f"{len(secret)} chars, sha256 {hashlib.sha256(secret.encode('utf-8', 'replace')).hexdigest()[:12]}"


def describe_header(value: str | None) -> str:
    """What was sent, without the secret: scheme word(s), length and checksum of the rest."""
    if value is None:
        return "no Authorization header"
    words = value.split(" ")
    schemes = []
    while words and words[0].lower() == "bearer":
        schemes.append(words.pop(0))
    token = " ".join(words)
    shape = " ".join(schemes) + (" " if schemes else "") + f"<key: {key_fingerprint(token)}>"
    extras = []
    if "\n" in value or "\r" in value:
        extras.append("contains a line break")
    if token != token.strip():
        extras.append("key has surrounding whitespace")
    return f"Authorization: {shape}" + (f" ({', '.join(extras)})" if extras else "")


def key_file_problems(raw: str) -> list[str]:
    """Shape problems of a key file's raw content (services strip ONE trailing newline)."""
    out = []
    if raw.endswith("\r\n"):
        out.append("ends with a Windows line ending (\\r\\n): the key read by the services keeps the \\r")
    elif raw.endswith("\n\n"):
        out.append("ends with more than one newline: the key keeps a trailing newline")
    body = raw[:-1] if raw.endswith("\n") else raw
    if body != body.strip():
        out.append("has spaces or tabs around the key")
    if re.match(r"(?i)^\s*bearer\s", body):
        out.append("starts with the word 'Bearer': clients add 'Bearer ' again ('Bearer Bearer KEY')")
    if "\n" in body.strip():
        out.append("holds more than one line")
    return out


def key_from_file_content(raw: str) -> str:
    """The key as the services read it (pdnode.secrets: one trailing newline stripped)."""
    return raw[:-1] if raw.endswith("\n") else raw


def header_variants(sent: str | None, key: str | None) -> list[tuple[str, str]]:
    """(label, header) alternatives to try after a 401/403, most specific first."""
    out: list[tuple[str, str]] = []
    if sent is None:
        return out
    words = sent.split(" ")
    n_bearer = 0
    while n_bearer < len(words) and words[n_bearer].lower() == "bearer":
        n_bearer += 1
    token = " ".join(words[n_bearer:])
    if n_bearer == 0:
        out.append(("without the word 'Bearer'", f"Bearer {token.strip()}"))
    elif n_bearer > 1:
        out.append(("with 'Bearer' doubled", f"Bearer {token.strip()}"))
    if token != token.strip() and n_bearer == 1:
        out.append(("with whitespace or a newline around the key", f"Bearer {token.strip()}"))
    return out


def diagnose_auth(status: int, sent: str | None, key_source: str | None, key_raw: str | None,
                  fixed_by: str | None, body: str = "") -> Finding:
    """Explain a 401/403. ``fixed_by``: the label of a header variant that was accepted."""
    said = f" ({' '.join(body.split())[:160]})" if body.strip() else " (empty body)"
    if sent is None:
        return Finding(f"HTTP {status}{said}: the endpoint requires an API key and none was sent",
                       "pass --api-key-file FILE with the key the node's services use "
                       "(on the node: <config_dir>/api-key; inventory: pdnode_api_key_file)")
    if fixed_by:
        what = {
            "without the word 'Bearer'": "the Authorization header was sent without the word 'Bearer' "
                                         "(the same key with 'Bearer ' in front is accepted)",
            "with 'Bearer' doubled": "the Authorization header had 'Bearer' twice (the key file or the "
                                     "client's key setting already starts with 'Bearer'); with one it is accepted",
            "with whitespace or a newline around the key": "the key was sent with whitespace/newline around "
                                                           "it; stripped it is accepted",
        }.get(fixed_by, fixed_by)
        return Finding(f"HTTP {status}{said}: {describe_header(sent)}: {what}",
                       "give clients the bare key and let them add 'Bearer ' (OpenAI SDKs do); "
                       "write key files without a trailing newline: printf %s KEY > FILE")
    shape = key_file_problems(key_raw) if key_raw is not None else []
    if shape:
        return Finding(f"HTTP {status}{said}: {describe_header(sent)}; the key file {key_source} "
                       + "; ".join(shape),
                       "rewrite the key file with the bare key: printf %s KEY > FILE")
    return Finding(f"HTTP {status}{said}: {describe_header(sent)} was rejected: not the key the endpoint expects",
                   "compare checksums: `tr -d '\\n' < <config_dir>/api-key | sha256sum` on the node against "
                   f"`tr -d '\\n' < {key_source or 'YOUR_KEY_FILE'} | sha256sum`; use the node's key")


def diagnose_header_error(error: str, sent: str | None, key_source: str | None, key_raw: str | None) -> Finding:
    """The HTTP library refused to send the header (a line break in the key)."""
    shape = key_file_problems(key_raw) if key_raw is not None else []
    return Finding(f"the request could not be sent: {error}; {describe_header(sent)}"
                   + (f"; the key file {key_source} " + "; ".join(shape) if shape else ""),
                   "remove the line break from the key: printf %s KEY > FILE (HTTP clients refuse "
                   "header values with newlines; some servers strip them, so it works in one client only)")


# --- base URL ----------------------------------------------------------------------------
def doubled_v1(base_url: str, path: str = CHAT_PATH) -> str | None:
    """The corrected base when base_url already ends in /v1 and path starts with /v1."""
    parts = urlsplit(base_url)
    base_path = parts.path.rstrip("/")
    if path.startswith("/v1/") and (base_path.endswith("/v1")):
        return urlunsplit((parts.scheme, parts.netloc, base_path[: -len("/v1")], "", ""))
    return None


def diagnose_url(base_url: str, status: int | None, corrected_status: int | None) -> Finding | None:
    if status != 404:
        return None
    fixed = doubled_v1(base_url)
    url = join(base_url, CHAT_PATH)
    if fixed is not None:
        works = (f"; {join(fixed, CHAT_PATH)} answers HTTP {corrected_status}" if corrected_status is not None else "")
        return Finding(f"POST {url} -> HTTP 404: the base URL already ends in /v1 and /v1/chat/completions was "
                       f"appended (/v1/v1){works}",
                       f"use --base-url {fixed} here and with clients that append /v1/... (curl scripts); "
                       f"OpenAI SDKs take {fixed}/v1 and append /chat/completions")
    return Finding(f"POST {url} -> HTTP 404: no OpenAI chat endpoint at this base URL",
                   "give the server root (http://HOST:PORT, without /v1) of the router or gateway")


def join(base_url: str, path: str) -> str:
    return base_url.rstrip("/") + path


# --- response bodies -----------------------------------------------------------------------
def diagnose_body(status: int | None, body: Any, sent_max_tokens: Any) -> Finding | None:
    """A 200 from /v1/chat/completions that is not a usable answer."""
    if status != 200:
        return None
    if not isinstance(body, dict):
        return Finding("HTTP 200 but the body is not a JSON object: " + _clip(body),
                       "something between the client and the server (proxy, gateway, captive portal) "
                       "answered instead of the model server: check the base URL")
    if "choices" not in body:
        return Finding("HTTP 200 but the body has no 'choices': " + _clip(body),
                       "the server or gateway reported an error inside a 200: read the body above "
                       "(model name, quota, upstream error)")
    choices = body.get("choices")
    zero = sent_max_tokens == 0
    if not isinstance(choices, list) or not choices:
        return Finding(f"HTTP 200 with empty 'choices' (max_tokens sent: {sent_max_tokens})",
                       "max_tokens was 0: the server generated nothing; send max_tokens >= 1 "
                       "(pdnode_verify_max_tokens)" if zero else "the server returned no completion: see its log")
    msg = choices[0].get("message") if isinstance(choices[0], dict) else None
    content = msg.get("content") if isinstance(msg, dict) else None
    if not content:
        finish = choices[0].get("finish_reason") if isinstance(choices[0], dict) else None
        usage = body.get("usage") if isinstance(body.get("usage"), dict) else {}
        if zero:
            return Finding(f"HTTP 200 with empty content (finish_reason {finish!r}, completion_tokens "
                           f"{usage.get('completion_tokens')}): max_tokens was 0",
                           "max_tokens 0 asks for no tokens; send max_tokens >= 1 (pdnode_verify_max_tokens)")
        return Finding(f"HTTP 200 with empty content (finish_reason {finish!r}, max_tokens {sent_max_tokens})",
                       "the model produced no text: check the chat template and stop settings")
    return None


def _clip(body: Any, limit: int = 300) -> str:
    text = body if isinstance(body, str) else json.dumps(body, ensure_ascii=False)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "..."
