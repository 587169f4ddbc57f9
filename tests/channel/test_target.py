"""Dial-target parsing: every accepted form, go-zero's forms, and a table of invalid targets."""

from __future__ import annotations

import pytest

from waypost import InvalidTarget
from waypost.redaction import redact_url as redact
from waypost.resolver.target import Target, parse_target

# (target, scheme, endpoints, key, format, options, authority)
VALID = [
    # direct and gRPC's equivalents
    ("direct:///127.0.0.1:8080", "direct", ("127.0.0.1:8080",), None, "gozero", {}, ""),
    ("direct:///127.0.0.1:8080,127.0.0.2:8081", "direct", ("127.0.0.1:8080", "127.0.0.2:8081"), None, "gozero", {}, ""),
    ("direct:///[::1]:8080,localhost:9", "direct", ("[::1]:8080", "localhost:9"), None, "gozero", {}, ""),
    ("DIRECT:///a.example.com:1", "direct", ("a.example.com:1",), None, "gozero", {}, ""),
    ("direct:///a:1,a:1,b:2", "direct", ("a:1", "b:2"), None, "gozero", {}, ""),  # duplicates collapse
    ("127.0.0.1:50051", "direct", ("127.0.0.1:50051",), None, "gozero", {}, ""),
    ("localhost:50051", "direct", ("localhost:50051",), None, "gozero", {}, ""),
    ("[::1]:50051", "direct", ("[::1]:50051",), None, "gozero", {}, ""),
    ("a:1,b:2", "direct", ("a:1", "b:2"), None, "gozero", {}, ""),
    ("ipv4:127.0.0.1:1,127.0.0.2:2", "direct", ("127.0.0.1:1", "127.0.0.2:2"), None, "gozero", {}, ""),
    ("ipv4:127.0.0.1", "direct", ("127.0.0.1:443",), None, "gozero", {}, ""),  # gRPC's default port
    ("ipv4:///127.0.0.1:7", "direct", ("127.0.0.1:7",), None, "gozero", {}, ""),
    ("ipv6:[::1]:5,[fe80::1]", "direct", ("[::1]:5", "[fe80::1]:443"), None, "gozero", {}, ""),
    # etcd: go-zero's current form (hosts in the path, escaped key in the query)
    ("etcd:///127.0.0.1:2379?key=greet.rpc", "etcd", ("127.0.0.1:2379",), "greet.rpc", "gozero", {}, ""),
    ("etcd:///h1:2379,h2:2379,h3:2379?key=greet.rpc", "etcd", ("h1:2379", "h2:2379", "h3:2379"), "greet.rpc",
     "gozero", {}, ""),
    ("discov:///h1:2379,h2:2379?key=greet.rpc", "etcd", ("h1:2379", "h2:2379"), "greet.rpc", "gozero", {}, ""),
    # url.QueryEscape output: '/' -> %2F, ' ' -> '+', '@' -> %40
    ("etcd:///h:2379?key=%2Fsvc%2Fgreet+v1%40x", "etcd", ("h:2379",), "/svc/greet v1@x", "gozero", {}, ""),
    ("etcd:///h:2379?key=%E6%9C%8D%E5%8A%A1", "etcd", ("h:2379",), "服务", "gozero", {}, ""),
    ("etcd:///h:2379?key=k&format=etcd-naming", "etcd", ("h:2379",), "k", "etcd-naming", {}, ""),
    ("etcd:///h:2379?format=kratos&key=greeter", "etcd", ("h:2379",), "greeter", "kratos", {}, ""),
    ("etcd:///h:2379?key=k&exact=1", "etcd", ("h:2379",), "k", "gozero", {"exact": "1"}, ""),
    ("etcd:///h:2379?key=k&exact=TRUE", "etcd", ("h:2379",), "k", "gozero", {"exact": "1"}, ""),
    ("etcd:///h:2379?key=k&exact=false", "etcd", ("h:2379",), "k", "gozero", {"exact": "0"}, ""),
    ("etcd:///h:2379?&key=k&", "etcd", ("h:2379",), "k", "gozero", {}, ""),  # empty segments, as Go skips them
    # go-zero's legacy form: hosts in the authority, the key is the path with slashes trimmed
    ("etcd://127.0.0.1:2379/greet.rpc", "etcd", ("127.0.0.1:2379",), "greet.rpc", "gozero", {}, ""),
    ("etcd://h:2379//svc/greet/", "etcd", ("h:2379",), "svc/greet", "gozero", {}, ""),  # leading slash lost
    ("etcd://h1:2379,h2:2379/greet.rpc", "etcd", ("h1:2379", "h2:2379"), "greet.rpc", "gozero", {}, ""),
    ("discov://h:2379/greet.rpc?format=etcd-naming", "etcd", ("h:2379",), "greet.rpc", "etcd-naming", {}, ""),
    ("etcd://h:2379/a%20b", "etcd", ("h:2379",), "a b", "gozero", {}, ""),
    ("etcd://h:2379?key=k", "etcd", ("h:2379",), "k", "gozero", {}, ""),
    ("etcd:///h1,h2:2380?key=k", "etcd", ("h1:2379", "h2:2380"), "k", "gozero", {}, ""),  # default etcd port
    ("etcd://h/k", "etcd", ("h:2379",), "k", "gozero", {}, ""),
    ("etcd:///h:1?key=k&dial_timeout=2.5&request_timeout=10", "etcd", ("h:1",), "k", "gozero",
     {"dial_timeout": "2.5", "request_timeout": "10"}, ""),
    # credentials and TLS
    ("etcd://root:pw@h:2379/k", "etcd", ("h:2379",), "k", "gozero", {"user": "root", "password": "pw"}, ""),
    ("etcd://root:p%40ss%2Fw@/h1:2379,h2:2379?key=k", "etcd", ("h1:2379", "h2:2379"), "k", "gozero",
     {"user": "root", "password": "p@ss/w"}, ""),
    ("etcd://root@h:2379/k", "etcd", ("h:2379",), "k", "gozero", {"user": "root"}, ""),
    ("etcd:///h:2379?key=k&user=root&password=pw", "etcd", ("h:2379",), "k", "gozero",
     {"user": "root", "password": "pw"}, ""),
    ("etcd:///h:2379?key=k&tls=1&cacert=/etc/ca.pem&certfile=/etc/c.pem&keyfile=/etc/k.pem", "etcd", ("h:2379",),
     "k", "gozero", {"tls": "1", "cacert": "/etc/ca.pem", "certfile": "/etc/c.pem", "keyfile": "/etc/k.pem"}, ""),
    # memory
    ("memory:///?key=greet.rpc", "memory", (), "greet.rpc", "gozero", {}, ""),
    ("memory://?key=greet.rpc", "memory", (), "greet.rpc", "gozero", {}, ""),
    ("memory://reg1/?key=greet.rpc&exact=1", "memory", (), "greet.rpc", "gozero", {"exact": "1"}, "reg1"),
    ("memory://test_x[memory]-3?key=k&format=kratos", "memory", (), "k", "kratos", {}, "test_x[memory]-3"),
    # dns
    ("dns:///greet.example.com:8080", "dns", ("greet.example.com:8080",), None, "gozero", {}, ""),
    ("dns:///greet.example.com", "dns", ("greet.example.com:443",), None, "gozero", {}, ""),
    ("dns://8.8.8.8:5353/greet.example.com:80", "dns", ("greet.example.com:80",), None, "gozero", {}, "8.8.8.8:5353"),
    ("dns://127.0.0.1/localhost:80", "dns", ("localhost:80",), None, "gozero", {}, "127.0.0.1:53"),
    ("dns://[::1]:53/localhost:80", "dns", ("localhost:80",), None, "gozero", {}, "[::1]:53"),
    ("dns:localhost:80", "dns", ("localhost:80",), None, "gozero", {}, ""),
    ("dns:///[::1]:80", "dns", ("[::1]:80",), None, "gozero", {}, ""),
]


@pytest.mark.parametrize(("text", "scheme", "endpoints", "key", "fmt", "options", "authority"), VALID,
                         ids=[v[0] for v in VALID])
def test_valid_targets(text, scheme, endpoints, key, fmt, options, authority):
    t = parse_target(text)
    assert t.scheme == scheme
    assert t.endpoints == endpoints
    assert t.key == key
    assert t.format == fmt
    assert dict(t.options) == options
    assert t.authority == authority
    assert t.raw == text


def test_go_zero_build_discov_target_round_trip():
    # go-zero: fmt.Sprintf("etcd:///%s?key=%s", strings.Join(endpoints, ","), url.QueryEscape(key))
    from urllib.parse import quote_plus

    for key in ("greet.rpc", "user.rpc/v2", "a b&c=d", "/leading", "服务"):
        text = f"etcd:///127.0.0.1:2379,127.0.0.1:2380?key={quote_plus(key)}"
        t = parse_target(text)
        assert t.key == key
        assert t.endpoints == ("127.0.0.1:2379", "127.0.0.1:2380")


def test_registry_url():
    assert parse_target("etcd:///h1:2379,h2:2379?key=k&exact=1").registry_url() == "etcd://h1:2379,h2:2379"
    assert parse_target("etcd://h:2379/k").registry_url() == "etcd://h:2379"
    assert parse_target("etcd://ro%3Aot:p%40ss@h:2379/k").registry_url() == "etcd://ro%3Aot:p%40ss@h:2379"
    assert parse_target("etcd:///h:2379?key=k&user=u").registry_url() == "etcd://u@h:2379"
    assert (
        parse_target("etcd:///h:2379?key=k&tls=1&cacert=/a/ca.pem&certfile=/a/c%20d.pem&keyfile=/a/k.pem")
        .registry_url() == "etcd://h:2379?tls=1&ca=/a/ca.pem&cert=/a/c%20d.pem&key=/a/k.pem"
    )
    assert parse_target("memory:///?key=k").registry_url() == "memory://"
    assert parse_target("memory://reg1/?key=k").registry_url() == "memory://reg1"
    for text in ("direct:///a:1", "dns:///a:1"):
        t = parse_target(text)
        assert not t.uses_registry
        with pytest.raises(InvalidTarget, match="no registry"):
            t.registry_url()
    assert parse_target("etcd:///h:1?key=k").uses_registry
    assert parse_target("memory:///?key=k").uses_registry


def test_registry_url_is_accepted_by_connect(tmp_path):
    from waypost.discovery.registry_url import parse_registry_url

    for name in ("ca.pem", "c d.pem", "k.pem"):
        (tmp_path / name).write_text("x")
    ca, cert, key = (str(tmp_path / n).replace(" ", "%20") for n in ("ca.pem", "c d.pem", "k.pem"))
    target = parse_target(
        f"etcd://ro%3Aot:p%40ss%2Fw@/h1:2379,[::1]:2380?key=greet.rpc&tls=1&cacert={ca}&certfile={cert}"
        f"&keyfile={key}&dial_timeout=2&request_timeout=7"
    )
    url = parse_registry_url(target.registry_url())
    assert url.scheme == "etcd"
    assert url.endpoints == ("h1:2379", "[::1]:2380")
    assert (url.username, url.password) == ("ro:ot", "p@ss/w")
    assert url.tls
    assert (url.ca_file, url.cert_file, url.key_file) == (
        str(tmp_path / "ca.pem"), str(tmp_path / "c d.pem"), str(tmp_path / "k.pem"))
    assert (url.dial_timeout, url.request_timeout) == (2.0, 7.0)
    plain = parse_registry_url(parse_target("etcd://127.0.0.1:2379/greet.rpc").registry_url())
    assert plain.endpoints == ("127.0.0.1:2379",) and plain.username is None and not plain.tls
    assert parse_registry_url(parse_target("memory://reg1/?key=k").registry_url()).name == "reg1"
    assert parse_registry_url(parse_target("memory:///?key=k").registry_url()).name == "default"


def test_exact_property():
    assert parse_target("etcd:///h:1?key=k&exact=true").exact
    assert not parse_target("etcd:///h:1?key=k&exact=0").exact
    assert not parse_target("etcd:///h:1?key=k").exact


def test_passwords_never_shown():
    secrets = ["etcd://root:hunter2@h:2379/k", "etcd://root:hunter2@/h:2379?key=k",
               "etcd:///h:2379?key=k&user=root&password=hunter2"]
    for text in secrets:
        t = parse_target(text)
        assert "hunter2" not in repr(t)
        assert "hunter2" not in str(t)
        assert "hunter2" not in t.redacted
        assert "hunter2" in t.registry_url()  # the one place that must carry it
    bad = [
        "etcd://root:hunter2@h:99999/k",  # bad port
        "etcd://root:hunter2@h:2379",  # no key
        "etcd://root:hunter2@h:2379/k?bogus=1",  # unknown parameter
        "etcd:///h:2379?key=k&user=root&password=hunter2&format=nope",
        "etcd:///h:2379?key=k&password=hunter2",  # password without user
        "etcd://root:hunter2@h:1/k?password=hunter2",  # given twice
        "etcd://root:hun/ter2@h:2379/k",  # unescaped '/' in the password
        "etcd://root:hun?ter2@h:2379/k",  # unescaped '?'
        "etcd://root:hun#ter2@h:2379/k",  # unescaped '#'
        "etcd://root:hunter2@h:2379/k\n",
        "direct://root:hunter2@/a:1",
        "foo://root:hunter2@h/x",
        "etcd:///h:2379?key=k&user=root&password=hunter2&password=hunter2",
    ]
    for text in bad:
        with pytest.raises(InvalidTarget) as err:
            parse_target(text)
        assert "hunter2" not in str(err.value), str(err.value)
        assert "hun" not in str(err.value).replace("hunter", ""), str(err.value)


def test_redact():
    assert redact("etcd://u:p@h:1/k") == "etcd://u:***@h:1/k"
    assert redact("etcd://u@h:1/k") == "etcd://***@h:1/k"  # userinfo without a colon may be a token
    assert redact("etcd:///h:1?key=k&password=x&user=u") == "etcd:///h:1?key=k&password=***&user=u"
    assert redact("direct:///a:1") == "direct:///a:1"


def test_target_is_hashable_and_comparable():
    a, b = parse_target("etcd:///h:1?key=k"), parse_target("etcd:///h:1?key=k")
    assert a == b and hash(a) == hash(b)
    assert len({a, b}) == 1
    with pytest.raises(AttributeError):
        a.key = "x"  # type: ignore[misc]
    assert isinstance(a, Target)


# (target, fragments the message must contain)
INVALID = [
    ("", ["empty target", "etcd:///127.0.0.1:2379?key=greet.rpc"]),
    ("etcd:///127.0.0.1:2379", ["etcd target needs ?key=: etcd:///127.0.0.1:2379?key=greet.rpc"]),
    ("discov:///127.0.0.1:2379", ["discov target needs ?key=: discov:///127.0.0.1:2379?key=greet.rpc"]),
    ("etcd:///h:2379?key=", ["empty ?key="]),
    ("etcd://h:2379", ["needs ?key="]),
    ("etcd://h:2379/", ["needs ?key="]),
    ("etcd://h:2379/k?key=k", ["key is given twice"]),
    ("etcd:///?key=k", ["no etcd hosts given", "etcd:///127.0.0.1:2379?key=greet.rpc"]),
    ("etcd:///h:2379,?key=k", ["empty etcd host at position 2"]),
    ("etcd:///:2379?key=k", ["empty host"]),
    ("etcd:///h:1?key=k&dial_timeout=0", ["dial_timeout= expects a number of seconds > 0"]),
    ("etcd:///h:1?key=k&request_timeout=soon", ["request_timeout= expects"]),
    ("etcd:///h:0?key=k", ["bad port '0'", "1..65535"]),
    ("etcd:///h:65536?key=k", ["bad port '65536'"]),
    ("etcd:///h:80a?key=k", ["bad port '80a'"]),
    ("etcd:///h:?key=k", ["bad port ''"]),
    ("etcd:///h_-!:1?key=k", ["not a valid host name"]),
    ("etcd:///999.1.1.1:1?key=k", ["not a valid IPv4 address"]),
    ("etcd:///::1:2379?key=k", ["IPv6 addresses in brackets"]),
    ("etcd:///[::1:2379?key=k", ["'[' without ']'"]),
    ("etcd:///[nothex]:1?key=k", ["not an IPv6 address"]),
    ("etcd:///[::1]x:1?key=k", ["'x:1' after ']' is not ':PORT'"]),
    ("etcd:///h:1?key=k&format=gozer", ["unknown format 'gozer'", "did you mean 'gozero'", "etcd-naming"]),
    ("etcd:///h:1?key=k&format=", ["unknown format ''"]),
    ("etcd:///h:1?key=k&exact=yes", ["exact= expects 1, 0, true or false"]),
    ("etcd:///h:1?key=k&tls=on", ["tls= expects"]),
    ("etcd:///h:1?key=k&bogus=1", ["unknown query parameter 'bogus'", "expected one of: key, format"]),
    ("etcd:///h:1?key=k&ca=/x", ["unknown query parameter 'ca'", "did you mean 'cacert'"]),
    ("etcd:///h:1?key=k&cert=/x", ["did you mean 'certfile'"]),
    ("etcd:///h:1?key=k&fromat=kratos", ["did you mean 'format'"]),
    ("etcd:///h:1?key=k&key=j", ["'key' is given twice"]),
    ("etcd:///h:1?key=k&=1", ["query parameter without a name"]),
    ("etcd:///h:1?key=%zz", ["malformed %-escape"]),
    ("etcd:///h:1?key=%ff", ["not UTF-8"]),
    ("etcd:///h:1?key=k%00", ["control characters"]),
    ("etcd:///h:1?key=k#frag", ["'#fragment'"]),
    ("etcd:///h:1?key=a@b", ["unexpected '@'", "%40"]),
    ("etcd:///h:1?key=k&password=x", ["a password needs a user"]),
    ("etcd://:pw@h:1/k", ["empty user name"]),
    ("etcd:///h:1?key=k&user=", ["empty user="]),
    ("etcd:///h:1?key=k&certfile=/c.pem", ["certfile= and keyfile= go together"]),
    ("etcd:///h:1?key=/tls/client.key&certfile=/c.pem", ["key= is the service key", "keyfile="]),
    ("etcd:2379", ["etcd targets are written etcd:///", "direct:///etcd:2379"]),
    ("direct:127.0.0.1:1", ["direct targets are written direct:///"]),
    ("direct:///", ["no addresses given", "direct:///127.0.0.1:8080"]),
    ("direct:///a", ["address 'a': no port", "expected HOST:PORT", "direct:///127.0.0.1:8080"]),
    ("direct:///a:1,,b:2", ["empty address at position 2"]),
    ("direct:///a:1,", ["empty address at position 2"]),
    ("direct://host/a:1", ["no authority", "three slashes"]),
    ("direct:///a:1?x=1", ["unknown query parameter 'x'", "direct targets take no parameters"]),
    ("direct:///a:1?key=k", ["unknown query parameter 'key'"]),
    ("direct:///a:1/b", ["bad port '1/b'"]),
    ("memory:///", ["memory target needs ?key=", "memory:///?key=greet.rpc"]),
    ("memory://reg/k", ["the key goes in ?key="]),
    ("memory:///?key=k&user=u", ["unknown query parameter 'user'"]),
    ("memory://u:p@reg/?key=k", ["memory targets take no credentials"]),
    ("dns:///", ["missing the name to resolve", "dns:///greet.example.com:8080"]),
    ("dns:///a:1,b:2", ["exactly one host:port"]),
    ("dns://dns.google/a:1", ["the DNS server 'dns.google:53' must be an IP address"]),
    ("dns:///a:99999", ["bad port"]),
    ("dns:///a:1?x=1", ["unknown query parameter 'x'"]),
    ("ipv4:::1", ["IPv6 addresses in brackets"]),
    ("ipv4:[::1]:80", ["'[::1]:80' is not an IPV4 address"]),
    ("ipv6:127.0.0.1:80", ["is not an IPV6 address"]),
    ("ipv4:localhost:80", ["is not an IPV4 address"]),
    ("ipv4:1.2.3.4?x", ["take no parameters"]),
    ("ipv4:", ["no addresses given"]),
    ("foo:///a:1", ["unknown target scheme 'foo'", "known schemes: direct, etcd, discov, memory, dns, k8s, consul, zk,"]),
    ("xds:///svc", ["unknown target scheme 'xds'", "not supported", "known schemes"]),
    ("unix:/tmp/sock", ["unknown target scheme 'unix'"]),
    ("1:2://x", ["'1:2' is not a scheme"]),
    ("a b://x", ["whitespace"]),
    (" direct:///a:1", ["whitespace"]),
    ("direct:///a:1\t", ["whitespace"]),
    ("127.0.0.1", ["address '127.0.0.1': no port"]),
    ("localhost", ["no port"]),
    ("::1", ["IPv6 addresses in brackets"]),
    ("host:port", ["bad port 'port'"]),
]


@pytest.mark.parametrize(("text", "fragments"), INVALID, ids=[repr(t) for t, _ in INVALID])
def test_invalid_targets(text, fragments):
    with pytest.raises(InvalidTarget) as err:
        parse_target(text)
    msg = str(err.value)
    for fragment in fragments:
        assert fragment in msg, msg


@pytest.mark.parametrize("text", ["etcd:///h:1", "direct:///", "memory:///", "dns:///", "etcd://h:1/k?bad=1"])
def test_every_scheme_error_shows_an_example(text):
    with pytest.raises(InvalidTarget) as err:
        parse_target(text)
    scheme = text.partition(":")[0]
    assert f"{scheme}:///" in str(err.value)


def test_non_string_target():
    with pytest.raises(InvalidTarget, match="must be a string"):
        parse_target(b"direct:///a:1")  # type: ignore[arg-type]
    with pytest.raises(InvalidTarget, match="must be a string"):
        parse_target(None)  # type: ignore[arg-type]


def test_invalid_target_is_a_value_error():
    with pytest.raises(ValueError):
        parse_target("nope://x")
