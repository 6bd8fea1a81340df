"""The named defects that turn the reference device plugin into a mutant.

Each is a bug seen in real plugins. The checks each defect must fail are
recorded with the subject profile (fixtures/subjects/reference-dp.yaml) and
asserted by the kill-matrix test. Mutants compose: `--defect a+b` is a plugin with
both bugs (harness/spec/composition.py; harness/reference/multibug.py).
"""

DP_DEFECTS: dict[str, str] = {
    "register-before-serve": "calls Register before its DevicePlugin server listens",
    "wrong-version": "registers with API version v1alpha instead of v1beta1",
    "bad-resource-name": "registers a resource name without a domain",
    "options-mismatch": "registers options that differ from what GetDevicePluginOptions serves",
    "no-wait-for-kubelet": "exits at start-up when kubelet.sock is not there yet",
    "give-up-on-reject": "stops trying after the kubelet rejects Register once",
    "missing-device": "leaves the last inventory device out of ListAndWatch",
    "duplicate-ids": "lists the first device twice",
    "wrong-numa": "reports every device on NUMA node 0",
    "close-stream": "ends ListAndWatch 0.1 s after the first response",
    "allocate-one-response": "answers Allocate with a single container response",
    "allocate-unknown-ok": "answers Allocate for unknown device IDs with success",
    "bad-allocate-response": "returns a relative mount path and permissions 'rwx'",
    "preferred-wrong-size": "GetPreferredAllocation returns every available device",
    "racy-allocate": "builds Allocate responses in shared state, mixing up concurrent calls",
    "no-reregister": "never registers again after kubelet.sock is recreated",
    "bounded-retry": "stops watching for the kubelet after a short outage",
    "no-socket-recreate": "does not re-serve when its socket is deleted",
    "stale-socket-crash": "exits at start-up when a stale socket file is in its place",
    "stuck-unhealthy": "never reports a device Healthy again once it was Unhealthy",
    "all-unhealthy-on-one": "marks every device Unhealthy when one fails or overheats (Healthy again on recovery)",
    "ignore-temperature": "does not look at device temperature",
    "partial-list": "sends only the devices that changed, not the full list",
    "no-hotplug": "keeps the device set it saw at start (ignores plug and unplug)",
    "slow-health": "reports health changes 40 s late (past the kubelet's 30 s reaction bound)",
    "leave-socket": "exits on SIGTERM but leaves its socket file behind",
    "no-cdi-spec": "names CDI devices in Allocate but writes no CDI spec for them",
}

# Hostile behaviours: a plugin that attacks the kubelet (and so fakelet) rather than merely
# getting the API wrong: hangs, floods, oversized or malformed messages, path tricks, processes
# and mounts of its own, self-kill, a corrupted kubelet checkpoint. Each has its verdict, and a
# bound on the run's wall time, in fixtures/subjects/reference-dp.yaml; tests/test_kill_matrix.py
# runs them as the hostile corpus.
DP_HOSTILE: dict[str, str] = {
    # hangs in each RPC the kubelet makes
    "silent-endpoint": "registers an endpoint that accepts connections but speaks no gRPC",
    "garbage-endpoint": "registers an endpoint that answers every connection with random bytes",
    "options-hang": "never answers GetDevicePluginOptions (the kubelet calls it without a deadline)",
    "listandwatch-silent": "opens the ListAndWatch stream and never sends a message",
    "allocate-hang": "never answers Allocate",
    "prestart-hang": "never answers PreStartContainer",
    "preferred-hang": "never answers GetPreferredAllocation",
    # huge and malformed messages
    "huge-list": "lists 100,000 devices the hardware does not have (legal size, under 4 MiB)",
    "oversized-list": "sends a ListAndWatch message above the kubelet's 4 MiB gRPC limit",
    "giant-message": "sends a 70 MB ListAndWatch message (past any sane receive limit)",
    "huge-register": "sends a Register request above the kubelet's 4 MiB gRPC limit",
    "huge-allocate-response": "answers Allocate with a 5 MiB environment value (above 4 MiB)",
    "bad-health-string": "reports health as 'healthy' (the kubelet only knows 'Healthy')",
    "empty-device-id": "lists a device whose ID is the empty string",
    "negative-numa": "reports NUMA node -1 for every device",
    "bad-cdi-name": "answers Allocate with a CDI device name that is not vendor.com/class=name",
    # path tricks
    "endpoint-traversal": "registers an endpoint that climbs out of the directory with '..'",
    "absolute-endpoint": "registers its socket's absolute path as the endpoint (the kubelet joins it to its dir)",
    "endpoint-is-kubelet": "registers kubelet.sock, the kubelet's own socket, as its endpoint",
    # floods
    "register-storm": "calls Register again and again while the kubelet is up",
    "register-flood": "opens 100 concurrent Register calls at start",
    "list-flood": "re-sends its identical device list without pause (about a thousand a second)",
    "log-flood": "writes 200 MB to its stderr at start",
    # processes, mounts, self-harm and the kubelet's own state
    "setsid-children": "starts 100 children in sessions of their own that sleep forever",
    "own-mounts": "mounts 18 tmpfs file systems in its mount namespace and never unmounts them",
    "ignore-sigterm": "ignores SIGTERM",
    "kill-parent": "SIGKILLs its parent process once registered",
    "self-kill": "SIGKILLs itself when the kubelet opens ListAndWatch, before any list",
    "crash-in-allocate": "exits in the middle of an Allocate call",
    "corrupt-checkpoint": "overwrites the kubelet's device-manager checkpoint with garbage while the kubelet is down",
}

# Legal quirks of real plugins. A benign behaviour is run like a defect (`--defect NAME`)
# but must pass every check: a check that fails one judges the plugin by our reference's
# habits, not by what the kubelet accepts.
DP_BENIGN: dict[str, str] = {
    "empty-first-list": "sends an empty device list first, then the full one a moment later",
    "incremental-list": "lists its devices one more per response at start (many small updates)",
    "repeat-lists": "re-sends the identical list every 100 ms",
    "reorder-list": "lists the devices in a different order in every response",
    "opaque-ids": "names devices by a hash of their identity, not by inventory ID",
    "slow-reregister": "re-registers a fixed 10 s after kubelet.sock reappears (as the upstream sample plugin)",
    "daemonize": "forks a detached daemon (setsid) that serves, and its main process exits 0",
    "daemon-exits-on-reject": "as daemonize, and the daemon exits 2 when the kubelet rejects its Register",
    "slow-register-retry": "retries a rejected Register 30 s later (as a vendor's GPU plugin does)",
    "scratch-files": "writes a scratch file into the temp dir on every Allocate and never removes it",
}

# Its NVML health source (--nvml, subject reference-nvml): bugs NVIDIA device plugin users report.
DP_NVML_DEFECTS: dict[str, str] = {
    "app-xid-fatal": "marks a GPU unhealthy for good on an application XID (13, 31, 43, 45, 68, 109)",
    "wait-error-keeps-healthy": "keeps every GPU healthy when nvmlEventSetWait itself fails",
    "init-error-keeps-healthy": "when NVML does not initialize, lists /dev/nvidiaN as healthy GPUs anyway",
}

# Its Level-Zero health source (--levelzero, subject reference-levelzero).
DP_LEVELZERO_DEFECTS: dict[str, str] = {
    "sidecar-down-keeps-healthy": "keeps reporting GPUs healthy while the Level-Zero sidecar is unreachable",
}

# Legal quirks of its Level-Zero health source: run like DP_BENIGN, they must pass every check they touch.
DP_LEVELZERO_BENIGN: dict[str, str] = {
    "late-sidecar-client": "connects to its sidecar in the background and first asks it 5 s after start "
                           "(as Intel's GPU plugin's first poll)",
}
