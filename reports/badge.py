"""A status badge (SVG) for a bundle: fakelet | CONFORMANT, with the check catalog's digest.

Our own few lines instead of a badge library: the shape is fixed, and the text widths come from a
per-character estimate of Verdana 11px (what badges conventionally use), so no font is needed.
"""

from __future__ import annotations

from html import escape

COLORS = {"CONFORMANT": "#2e7d32", "NOT CONFORMANT": "#c62828", "INCOMPLETE": "#757575"}
LABEL = "fakelet"
CHAR_W = 7.0  # average advance of Verdana 11px, upper case and digits
SMALL_W = 5.6  # the same at 9px, for the digest line
PAD = 10


def _width(text: str, per_char: float = CHAR_W) -> int:
    return int(len(text) * per_char + 2 * PAD)


def badge_svg(status: str, catalog_sha256: str) -> str:
    color = COLORS.get(status, COLORS["INCOMPLETE"])
    digest = f"catalog {catalog_sha256[:12]}" if catalog_sha256 else "catalog unknown"
    left = _width(LABEL)
    right = max(_width(status), _width(digest, SMALL_W))
    total, height = left + right, 30
    title = f"{LABEL}: {status} (check catalog sha256 {catalog_sha256 or 'unknown'})"
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{total}" height="{height}" role="img" '
            f'aria-label="{escape(title)}">\n'
            f"<title>{escape(title)}</title>\n"
            f'<rect width="{left}" height="{height}" fill="#555"/>\n'
            f'<rect x="{left}" width="{right}" height="{height}" fill="{color}"/>\n'
            f'<g fill="#fff" font-family="Verdana,DejaVu Sans,sans-serif" text-anchor="middle">\n'
            f'<text x="{left / 2:g}" y="19" font-size="11">{LABEL}</text>\n'
            f'<text x="{left + right / 2:g}" y="14" font-size="11" font-weight="bold">{escape(status)}</text>\n'
            f'<text x="{left + right / 2:g}" y="25" font-size="9">{escape(digest)}</text>\n'
            f"</g>\n</svg>\n")
