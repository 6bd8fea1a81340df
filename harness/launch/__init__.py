"""Starting, containing and cleaning up subjects: processes (process.py), mount and PID namespaces
(nsexec.py, nsinit.py), cgroups, sandboxes, owner tags and the reaper, Go builds, containers.
"""
