"""The pointer every refusal that comes from the machine ends with: `fakelet doctor` says what is missing.

A skip or an error says what one step lacked (no Go, no etcd, not root, no Docker engine);
`fakelet doctor` (harness/run/doctor.py) says, for the whole machine, what can run and what to
install for the rest. The pointer is added where the message is made, never at a catch site, so
it appears once however many layers pass the message on.
"""

from __future__ import annotations

DOCTOR_HINT = "(fakelet doctor says what this machine lacks)"


def machine_lacks(reason: str) -> str:
    """`reason`, a one-line refusal caused by this machine, with the pointer at `fakelet doctor` (once)."""
    return reason if DOCTOR_HINT in reason else f"{reason} {DOCTOR_HINT}"
