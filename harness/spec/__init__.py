"""Descriptions read from data: subject profiles, timing profiles, the check catalog, and the Kubernetes
name rules they are validated by. Parsing only: nothing here starts anything.
"""
