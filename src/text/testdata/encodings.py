#!/usr/bin/env python3
"""Writes encodings.jsonl: secrets as real encoders print them, and the text as it must be
stored once the redactor has masked them.

Real encoders: Python's urllib.parse.quote / quote_plus, json.dumps, base64.b64encode /
urlsafe_b64encode / encodebytes (76 columns), email.base64mime (76 columns, CRLF); and,
where installed, node (JSON.stringify, encodeURIComponent), java (URLEncoder.encode),
openssl base64 (64 columns) and coreutils base64 (76 columns). Emulated, following their
sources: Go's json.Marshal (HTML-safe: < > & and U+2028/U+2029 as \\u003c ...), Gson's
default (also = and '), PHP's json_encode default flags (\\/ and \\uXXXX for non-ASCII,
lower-case hex), and an encoder that writes upper-case \\u escapes (\\u00E4).

Each line: {"encoder", "secret", "text", "expected"}. The expected masking is worked out
here independently of the Rust code: an escaped value is replaced whole; in base64, the
characters whose six bits all come from the secret (the "core") are replaced, each line's
part of it by its own [redacted].

Run from this folder: python3 encodings.py > encodings.jsonl
"""

import base64
import email.base64mime
import json
import random
import re
import shutil
import subprocess
import sys
import urllib.parse

MARK = "[redacted]"
rng = random.Random(20251129)


def run(cmd, data):
    """Output of an installed tool, or None."""
    if shutil.which(cmd[0]) is None:
        return None
    return subprocess.run(cmd, input=data, capture_output=True, check=True).stdout


# ---- escaped forms: the whole value is replaced ---------------------------------------

def lower_hex(s):
    return re.sub(r"%[0-9A-F]{2}", lambda m: m.group().lower(), s)


def mixed_hex(s):
    """Percent escapes alternating upper- and lower-case, digit by digit."""
    out, flip = [], False
    for piece in re.split(r"(%[0-9A-F]{2})", s):
        if piece.startswith("%") and len(piece) == 3:
            digits = ""
            for d in piece[1:]:
                digits += d.lower() if flip else d
                flip = not flip
            piece = "%" + digits
        out.append(piece)
    return "".join(out)


SHORT = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def utf16_escapes(c, fmt):
    b = c.encode("utf-16-be")
    return "".join(fmt % int.from_bytes(b[i:i + 2], "big") for i in range(0, len(b), 2))


def json_escape(s, escape, slash=False, fmt="\\u%04x", short_quote=True):
    """A JSON string body: two-character escapes where JSON has them, \\uXXXX (in `fmt`)
    for the other controls and for what `escape` picks."""
    out = []
    for c in s:
        if c == "/" and slash:
            out.append("\\/")
        elif c in SHORT and (c != '"' or short_quote):
            out.append(SHORT[c])
        elif ord(c) < 0x20 or escape(c):
            out.append(utf16_escapes(c, fmt))
        else:
            out.append(c)
    return "".join(out)


def json_go(s):
    """encoding/json's Marshal of a string (HTML escaping on, the default)."""
    return json_escape(s, lambda c: c in "<>&\u2028\u2029")


def json_gson(s):
    """Gson's JsonWriter with HTML-safe escaping (Gson's default)."""
    return json_escape(s, lambda c: c in "<>&='\u2028\u2029")


def json_php(s):
    """PHP's json_encode with default flags: \\/ and every non-ASCII character as \\uXXXX."""
    return json_escape(s, lambda c: ord(c) >= 0x80, slash=True)


def json_upper(s):
    """\\u escapes in upper-case hex for non-ASCII and HTML-sensitive characters."""
    return json_escape(s, lambda c: ord(c) >= 0x80 or c in "\"'+<>&`", fmt="\\u%04X",
                       short_quote=False)


def node(expr, s):
    out = run(["node", "-e", "process.stdout.write(%s(require('fs').readFileSync(0, 'utf8')))" % expr],
              s.encode())
    return None if out is None else out.decode()


JAVA = """
public class Enc {
    public static void main(String[] a) throws Exception {
        String s = new String(System.in.readAllBytes(), "UTF-8");
        System.out.print(java.net.URLEncoder.encode(s, "UTF-8"));
    }
}
"""


def java_urlencoder(s):
    if shutil.which("java") is None:
        return None
    import os
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "Enc.java")
        with open(path, "w") as f:
            f.write(JAVA)
        out = subprocess.run(["java", path], input=s.encode(), capture_output=True, check=True)
        return out.stdout.decode()


ESCAPED = [
    ("quote", lambda s: urllib.parse.quote(s)),
    ("quote-safe-none", lambda s: urllib.parse.quote(s, safe="")),
    ("quote_plus", lambda s: urllib.parse.quote_plus(s)),
    ("quote-lower-hex", lambda s: lower_hex(urllib.parse.quote(s, safe=""))),
    ("quote_plus-mixed-hex", lambda s: mixed_hex(urllib.parse.quote_plus(s))),
    ("json.dumps", lambda s: json.dumps(s)[1:-1]),
    ("json.dumps-unicode", lambda s: json.dumps(s, ensure_ascii=False)[1:-1]),
    ("go-json.Marshal", json_go),
    ("gson", json_gson),
    ("php-json_encode", json_php),
    ("json-upper-u", json_upper),
    ("node-JSON.stringify", lambda s: (lambda o: o and o[1:-1])(node("JSON.stringify", s))),
    ("node-encodeURIComponent", lambda s: node("encodeURIComponent", s)),
    ("java-URLEncoder", java_urlencoder),
]


# ---- base64 forms: the core is replaced, line by line ----------------------------------

def core_range(offset, length):
    """Characters of base64(blob) whose bits all lie in blob[offset:offset + length]."""
    return -(-8 * offset // 6), 8 * (offset + length) // 6


def masked_b64(encoded, lines_of, core):
    """`encoded` (unwrapped) cut into lines as `lines_of` gives, with the core masked."""
    c0, c1 = core
    out, at = [], 0
    for line in lines_of:
        a, b = at, at + len(line)
        lo, hi = max(a, c0), min(b, c1)
        if lo < hi:
            line = encoded[a:lo] + MARK + encoded[hi:b]
        out.append(line)
        at = b
    return out


def wrap(s, width):
    return [s[i:i + width] for i in range(0, len(s), width)]


def b64_vectors(secret, vectors):
    raw = secret.encode()
    for pre_len in (0, 1, 2, 7):
        pre = bytes(rng.randrange(256) for _ in range(pre_len))
        post = bytes(rng.randrange(256) for _ in range(rng.randrange(4)))
        blob = pre + raw + post
        core = core_range(len(pre), len(raw))
        if core[1] - core[0] < 8:
            continue
        for name, enc in (("b64encode", base64.b64encode), ("urlsafe_b64encode", base64.urlsafe_b64encode)):
            e = enc(blob).decode()
            vectors.append((name, secret, "b64: " + e + "\n", "b64: " + masked_b64(e, [e], core)[0] + "\n"))
        e = base64.b64encode(blob).decode()
        # The same base64 inside a URL, in PHP's JSON and Gson's (padding as \u003d).
        if "+" in e[core[0]:core[1]] or "/" in e[core[0]:core[1]] or e.endswith("="):
            masked = masked_b64(e, [e], core)[0]
            quoted = urllib.parse.quote_plus(masked).replace(urllib.parse.quote_plus(MARK), MARK)
            for name, enc, expected in (
                ("quote_plus(b64encode)", urllib.parse.quote_plus(e), quoted),
                ("php-json_encode(b64encode)", json_php(e), json_php(masked)),
                ("gson(b64encode)", json_gson(e), json_gson(masked)),
            ):
                vectors.append((name, secret, "v=" + enc + "\n", "v=" + expected + "\n"))
        if core[1] - core[0] < 64:
            continue
        # Wrapped: every line its own piece.
        e = base64.b64encode(blob).decode()
        for name, text, width, eol in (
            ("encodebytes", base64.encodebytes(blob).decode(), 76, "\n"),
            ("base64mime-crlf", email.base64mime.body_encode(blob, 76, "\r\n"), 76, "\r\n"),
            ("openssl-base64", (run(["openssl", "base64"], blob) or b"").decode(), 64, "\n"),
            ("coreutils-base64", (run(["base64"], blob) or b"").decode(), 76, "\n"),
            ("pem-64", "".join(l + "\n" for l in wrap(e, 64)), 64, "\n"),
        ):
            if not text:
                continue
            lines = wrap(e, width)
            assert text == "".join(l + eol for l in lines), (name, text)
            expected = "".join(l + eol for l in masked_b64(e, lines, core))
            vectors.append((name, secret, text, expected))


def random_secret(lo, hi, alphabet):
    return "".join(rng.choice(alphabet) for _ in range(rng.randrange(lo, hi + 1)))


def main():
    wide = ("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
            "-_.~+/=&<>'\" %@!:;,?#$\\äéÜ€😀")
    secrets = [
        "p@ss/w0rd+Ünïcode\"\\x",
        "c2VjcmV0X3Rva2VuMQ==",
        "a&b<c>d=e'f g/h",
        "tøkën/ä€😀 x",
        "line\u2028sep\u2029par",
        "~tilde~ and %percent%",
        "tab\there/and\\back",
        "/leading/and/trailing/",
        "hunter22",
        "pw 1",
    ]
    secrets += [random_secret(16, 40, wide) for _ in range(6)]
    secrets += [random_secret(57, 120, wide) for _ in range(3)]
    secrets += ["a 57-byte secret value, as long as one base64 line: ok!!?", random_secret(49, 49, wide)]
    vectors = []
    for s in secrets:
        for name, enc in ESCAPED:
            e = enc(s)
            if e is None:
                continue
            vectors.append((name, s, "token: " + e + " ok\n", "token: " + MARK + " ok\n"))
        b64_vectors(s, vectors)
    seen = set()
    for name, secret, text, expected in vectors:
        key = (name, secret, text)
        if key in seen:
            continue
        seen.add(key)
        print(json.dumps({"encoder": name, "secret": secret, "text": text, "expected": expected},
                         ensure_ascii=False))


if __name__ == "__main__":
    sys.exit(main())
