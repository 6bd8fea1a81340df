"""Resource-name rules the kubelet applies to RegisterRequest.resource_name.

A faithful port of v1helper.IsExtendedResourceName (pkg/apis/core/v1/helper)
and apimachinery's validation.IsQualifiedName.
"""

from __future__ import annotations

import re

RESOURCE_DEFAULT_NAMESPACE_PREFIX = "kubernetes.io/"  # core/v1 types.go ResourceDefaultNamespacePrefix
DEFAULT_RESOURCE_REQUESTS_PREFIX = "requests."  # core/v1 types.go DefaultResourceRequestsPrefix
DNS1123_SUBDOMAIN_MAX_LENGTH = 253  # apimachinery validation.go DNS1123SubdomainMaxLength
DNS1123_LABEL_MAX_LENGTH = 63  # apimachinery validation.go DNS1123LabelMaxLength
QUALIFIED_NAME_MAX_LENGTH = 63  # apimachinery validation.go qualifiedNameMaxLength

# Go's regexp anchors `$` at the very end of the text, Python's `$` also before
# a final newline: the patterns are used with fullmatch so "name\n" is rejected.
_DNS1123_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN = re.compile(rf"{_DNS1123_LABEL}(\.{_DNS1123_LABEL})*")
_QUALIFIED_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")


def is_dns1123_label(value: str) -> bool:
    return len(value) <= DNS1123_LABEL_MAX_LENGTH and bool(re.fullmatch(_DNS1123_LABEL, value))


def is_dns1123_subdomain(value: str) -> bool:
    return len(value) <= DNS1123_SUBDOMAIN_MAX_LENGTH and bool(_DNS1123_SUBDOMAIN.fullmatch(value))


def qualified_name_errors(value: str) -> list[str]:
    parts = value.split("/")
    if len(parts) == 1:
        name = parts[0]
    elif len(parts) == 2:
        prefix, name = parts
        if not prefix:
            return ["prefix part must be non-empty"]
        if not is_dns1123_subdomain(prefix):
            return [f"prefix part {prefix!r} must be a DNS-1123 subdomain"]
    else:
        return ["a qualified name must have at most one '/'"]
    if not name:
        return ["name part must be non-empty"]
    errors = []
    if len(name) > QUALIFIED_NAME_MAX_LENGTH:
        errors.append(f"name part must be no more than {QUALIFIED_NAME_MAX_LENGTH} characters")
    if not _QUALIFIED_NAME.fullmatch(name):
        errors.append(f"name part {name!r} must consist of alphanumerics, '-', '_' or '.'")
    return errors


def is_native_resource(name: str) -> bool:
    return "/" not in name or RESOURCE_DEFAULT_NAMESPACE_PREFIX in name


def is_extended_resource_name(name: str) -> bool:
    if is_native_resource(name) or name.startswith(DEFAULT_RESOURCE_REQUESTS_PREFIX):
        return False
    return not qualified_name_errors(DEFAULT_RESOURCE_REQUESTS_PREFIX + name)


def endpoint_errors(endpoint: str) -> list[str]:
    """Why an endpoint is not a bare file name in the device-plugins directory."""
    errors = []
    if not endpoint:
        errors.append("endpoint is empty")
    if "/" in endpoint:
        errors.append(f"endpoint {endpoint!r} contains '/'")
    if ".." in endpoint.split("/"):
        errors.append(f"endpoint {endpoint!r} contains '..'")
    return errors
