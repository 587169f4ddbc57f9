"""Secrets out of text that is logged or shown: the one redaction of URL-like strings (dial targets, registry
URLs, metric labels)."""

from __future__ import annotations

import re

_PASSWORD_PARAM = re.compile(r"(?i)((?:^|[?&])(?:password|token)=)[^&#]*")


def redact_url(text: str) -> str:
    """``text`` with URL passwords (``user:pass@`` and ``password=``) replaced by ``***``.

    Works on malformed input too (it is used on what failed to parse): everything up to the last '@' may be
    userinfo, since a password may hold an unescaped '/', '?' or '#'; over-redacting a malformed URL is fine,
    leaking a password is not. Userinfo without a colon (or written before the scheme) is hidden whole.
    """
    scheme, sep, rest = text.partition("://")
    if not sep or "@" in scheme:  # no scheme, or the userinfo was written before/inside it
        text = text if "@" not in text else "***@" + text.rpartition("@")[2]
    elif "@" in rest:
        userinfo, _, host = rest.rpartition("@")
        user, colon, _password = userinfo.partition(":")
        text = f"{scheme}://{user}:***@{host}" if colon else f"{scheme}://***@{host}"
    return _PASSWORD_PARAM.sub(r"\1***", text)


class RedactedTargets(dict[str, str]):
    """target -> ``redact_url(target)``, computed once per target (metric labels and attributes)."""

    def __missing__(self, target: str) -> str:
        label = self[target] = redact_url(target)
        return label
