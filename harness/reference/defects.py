"""The named defects that turn the reference device plugin into a mutant.

Each is a bug seen in real plugins. The checks each defect must fail are
recorded with the subject profile (fixtures/subjects/reference-dp.yaml) and
asserted by the kill-matrix test.
"""

DP_DEFECTS: dict[str, str] = {
    "register-before-serve": "calls Register before its DevicePlugin server listens",
    "wrong-version": "registers with API version v1alpha instead of v1beta1",
    "bad-resource-name": "registers a resource name without a domain",
    "endpoint-traversal": "registers an endpoint that climbs out of the directory with '..'",
    "options-mismatch": "registers options that differ from what GetDevicePluginOptions serves",
    "no-wait-for-kubelet": "exits at start-up when kubelet.sock is not there yet",
    "give-up-on-reject": "stops trying after the kubelet rejects Register once",
    "register-storm": "calls Register again and again while the kubelet is up",
    "missing-device": "leaves the last inventory device out of ListAndWatch",
    "duplicate-ids": "lists the first device twice",
    "wrong-numa": "reports every device on NUMA node 0",
    "close-stream": "ends ListAndWatch 0.1 s after the first response",
    "allocate-one-response": "answers Allocate with a single container response",
    "allocate-unknown-ok": "answers Allocate for unknown device IDs with success",
    "bad-allocate-response": "returns a relative mount path and permissions 'rwx'",
    "preferred-wrong-size": "GetPreferredAllocation returns every available device",
    "prestart-hang": "never answers PreStartContainer",
    "racy-allocate": "builds Allocate responses in shared state, mixing up concurrent calls",
    "no-reregister": "never registers again after kubelet.sock is recreated",
    "bounded-retry": "stops watching for the kubelet after a short outage",
    "no-socket-recreate": "does not re-serve when its socket is deleted",
    "stale-socket-crash": "exits at start-up when a stale socket file is in its place",
    "stuck-unhealthy": "never reports a device Healthy again once it was Unhealthy",
    "ignore-temperature": "does not look at device temperature",
    "partial-list": "sends only the devices that changed, not the full list",
    "no-hotplug": "keeps the device set it saw at start (ignores plug and unplug)",
    "slow-health": "reports health changes 40 s late (past the kubelet's 30 s reaction bound)",
    "ignore-sigterm": "ignores SIGTERM",
    "leave-socket": "exits on SIGTERM but leaves its socket file behind",
    "silent-endpoint": "registers an endpoint that accepts connections but speaks no gRPC",
    "allocate-hang": "never answers Allocate",
    "preferred-hang": "never answers GetPreferredAllocation",
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
    "scratch-files": "writes a scratch file into the temp dir on every Allocate and never removes it",
}
