"""The kubelet's resource-name rules, ported from upstream (harness/spec/names.py).

v1helper.IsExtendedResourceName: not native (no '/', or "kubernetes.io/"
anywhere), not "requests."-prefixed, and "requests."+name must pass
apimachinery's IsQualifiedName. Go regexps anchor at the true end of the text,
so a trailing newline must be rejected.
"""

import pytest

from harness.spec.names import (
    endpoint_errors,
    is_dns1123_subdomain,
    is_extended_resource_name,
    is_native_resource,
    qualified_name_errors,
)

NAME_63 = "n" * 63
NAME_64 = "n" * 64
# "requests." (9) + domain must stay within DNS1123SubdomainMaxLength (253).
DOMAIN_244 = "d" * 240 + ".com"
DOMAIN_245 = "d" * 241 + ".com"

EXTENDED = [
    ("example.com/foo", True),
    ("nvidia.com/gpu", True),
    ("a.b/c_d.e-f", True),
    ("example.com/Foo", True),  # the name part may be upper case
    ("example.com/0", True),
    ("x-y.example.com/foo.bar", True),
    (f"example.com/{NAME_63}", True),
    (f"{DOMAIN_244}/foo", True),
    ("foo", False),  # no '/': native
    ("kubernetes.io/foo", False),  # native prefix
    ("foo.kubernetes.io/bar", False),  # "kubernetes.io/" anywhere is native
    ("example.com/kubernetes.io/x", False),
    ("requests.example.com/foo", False),  # the quota prefix
    ("Example.com/foo", False),  # the prefix is a lower-case DNS subdomain
    ("example.com/", False),  # empty name
    ("/foo", False),  # empty prefix
    ("example.com/foo/bar", False),  # at most one '/'
    ("example.com/foo\n", False),  # Go's $ is end of text, not before a final newline
    ("example.com\n/foo", False),
    ("example.com/foo ", False),
    ("example.com/-foo", False),
    ("example.com/foo-", False),
    ("example.com/foo$", False),
    ("example.com/fóo", False),  # ASCII only
    ("-example.com/foo", False),
    ("example..com/foo", False),
    ("example_com/foo", False),
    (f"example.com/{NAME_64}", False),  # qualifiedNameMaxLength 63
    (f"{DOMAIN_245}/foo", False),  # "requests." + 245 = 254 > 253
    ("", False),
]


@pytest.mark.parametrize(("name", "valid"), EXTENDED, ids=[repr(n)[:40] for n, _ in EXTENDED])
def test_is_extended_resource_name(name, valid):
    assert is_extended_resource_name(name) is valid


@pytest.mark.parametrize(("name", "native"), [
    ("cpu", True),
    ("kubernetes.io/foo", True),
    ("foo.kubernetes.io/bar", True),
    ("example.com/foo", False),
])
def test_is_native_resource(name, native):
    assert is_native_resource(name) is native


QUALIFIED = [
    # (value, error substrings expected; empty means valid)
    ("foo", []),
    ("Foo.Bar_baz-1", []),
    ("example.com/foo", []),
    ("requests.example.com/foo", []),
    ("a", []),
    (NAME_63, []),
    (f"requests.{DOMAIN_244}/foo", []),
    ("", ["name part must be non-empty"]),
    ("example.com/", ["name part must be non-empty"]),
    ("/foo", ["prefix part must be non-empty"]),
    ("a/b/c", ["at most one '/'"]),
    ("Example.com/foo", ["prefix part 'Example.com' must be a DNS-1123 subdomain"]),
    (f"requests.{DOMAIN_245}/foo", ["must be a DNS-1123 subdomain"]),
    ("example.com\n/foo", ["must be a DNS-1123 subdomain"]),
    (NAME_64, ["no more than 63 characters"]),
    ("foo\n", ["must consist of alphanumerics"]),
    ("foo bar", ["must consist of alphanumerics"]),
    ("_foo", ["must consist of alphanumerics"]),
    ("foo.", ["must consist of alphanumerics"]),
    ("n" * 63 + "-", ["no more than 63 characters", "must consist of alphanumerics"]),
]


@pytest.mark.parametrize(("value", "expected"), QUALIFIED, ids=[repr(v)[:40] for v, _ in QUALIFIED])
def test_qualified_name_errors(value, expected):
    errors = qualified_name_errors(value)
    assert len(errors) == len(expected), errors
    for error, fragment in zip(errors, expected, strict=True):
        assert fragment in error


@pytest.mark.parametrize(("value", "valid"), [
    ("example.com", True),
    ("a", True),
    ("a-b.c-d", True),
    ("1.2.3", True),
    ("d" * 253, True),
    ("d" * 254, False),
    ("example.com\n", False),
    ("Example.com", False),
    ("-a.com", False),
    ("a-.com", False),
    ("a..b", False),
    (".a", False),
    ("", False),
])
def test_is_dns1123_subdomain(value, valid):
    assert is_dns1123_subdomain(value) is valid


ENDPOINTS = [
    ("plugin.sock", []),
    ("nvidia-gpu.sock", []),
    ("..sock", []),  # '..' only matters as a whole path element
    ("", ["endpoint is empty"]),
    ("sub/plugin.sock", ["contains '/'"]),
    ("/abs.sock", ["contains '/'"]),
    ("../escape.sock", ["contains '/'", "contains '..'"]),
    ("..", ["contains '..'"]),
]


@pytest.mark.parametrize(("endpoint", "expected"), ENDPOINTS, ids=[repr(e) for e, _ in ENDPOINTS])
def test_endpoint_errors(endpoint, expected):
    errors = endpoint_errors(endpoint)
    assert len(errors) == len(expected), errors
    for error, fragment in zip(errors, expected, strict=True):
        assert fragment in error
