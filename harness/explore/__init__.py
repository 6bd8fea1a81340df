"""`fakelet explore`: a stateful fault explorer over the scenario engine.

hypothesis's RuleBasedStateMachine draws sequences of faults and actions (rules.py), each
one a scenario step the engine already carries out; a plain model (model.py) says what a
correct plugin and kubelet show after every step, as an `expect` step with the kubelet's
own bound. A failing sequence is shrunk by hypothesis and written as a scenario file
(repro.py) that `fakelet scenario run --file` replays; explorer.py drives the search under
a wall-time budget and builds the report.
"""
