"""The one description of a run: `RunConfig`, validated once by a front door and handed, as an object or
serialized, to whatever runs the checks (pytest, a scenario, a benchmark).
"""
