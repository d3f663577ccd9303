"""Passwords out of what people and logs see: a storage URL shown without its password, and
a driver's error message with the password it quotes taken out (B1, N2).

The one place fermix scrubs a password; it imports no driver, so the doctor, the server's
status and both adapters use the same rules.
"""

from __future__ import annotations

import re
import urllib.parse


def without_password(url: str) -> str:
    """``url`` with any password taken out: from its user part and from its parameters."""
    parts = urllib.parse.urlsplit(url)
    userinfo, at, hosts = parts.netloc.rpartition("@")
    user = userinfo.partition(":")[0]
    netloc = f"{user}@{hosts}" if at and user else hosts
    query = "&".join(
        pair
        for pair in parts.query.split("&")
        if pair and pair.partition("=")[0].lower() != "password"
    )
    return f"{parts.scheme}://{netloc}{parts.path}" + (f"?{query}" if query else "")


_PASSWORDS = (
    (re.compile(r"(://[^:/?#@\s]*:)[^@\s]*@"), r"\1***@"),  # postgresql://user:secret@host
    (re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s&]+)", re.I), r"\1***"),  # password=x
)


def scrubbed(url: str, error: BaseException) -> str:
    """``error``'s message without the password of ``url`` (a driver may quote the URL)."""
    text = str(error)
    password = _password(url)
    if password:
        text = text.replace(str(password), "***")
    for pattern, replacement in _PASSWORDS:
        text = pattern.sub(replacement, text)
    return text


def _password(url: str) -> str | None:
    """The password ``url`` carries: a URL's user part or ``password`` parameter, or a
    ``password=`` of a key/value connection string; None without one."""
    if "://" in url:
        parts = urllib.parse.urlsplit(url)
        if parts.password:
            return urllib.parse.unquote(parts.password)
        query = urllib.parse.parse_qs(parts.query)
        return query.get("password", [None])[0]
    found = re.search(r"password\s*=\s*('(?:[^'\\]|\\.)*'|[^\s]+)", url, re.I)
    if found is None:
        return None
    value = found.group(1)
    return value[1:-1].replace("\\'", "'") if value.startswith("'") else value
