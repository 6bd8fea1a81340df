"""Plugins as they ship: container images run through a Docker engine (testcontainers)."""
