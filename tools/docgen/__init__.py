"""The reference pages of the docs site, each rendered from the code that defines what it describes.

tools/gen_docs.py writes them under docs/reference/ and, with --check, fails when the committed pages
differ from what the code renders now. Every page is deterministic: sorted, no timestamps, nothing
read from the machine it is rendered on.
"""
