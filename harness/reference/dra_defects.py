"""The named defects that turn the reference DRA driver into a mutant.

Each is a bug seen (or easy to make) in real DRA kubelet plugins. The checks
each defect must fail are recorded with the subject profile
(fixtures/subjects/reference-dra.yaml) and asserted by the kill matrix.
"""

DRA_DEFECTS: dict[str, str] = {
    # registration
    "wrong-endpoint": "GetInfo names an endpoint that does not exist (plugin.sock instead of dra.sock)",
    "getinfo-slow": "answers GetInfo after 1.5 s, past the kubelet's 1 s timeout",
    "unserved-version": "advertises v1.DRAPlugin but serves only v1beta1.DRAPlugin",
    "dies-on-reject": "exits when NotifyRegistrationStatus says registered=false",
    "split-health-socket": "serves DRAResourceHealth on a second socket the kubelet never dials",
    "bad-driver-name": "registers and publishes as 'gpu_fakelet.example.com' (not a DNS subdomain)",
    # prepare / unprepare
    "non-idempotent-prepare": "answers a second prepare of the same claim with an error",
    "unprepare-unknown-errors": "answers unprepare of a claim it does not know with an error",
    "drops-claims-in-batch": "answers only the first claim of a multi-claim request",
    "wrong-cdi-id": "returns CDI device IDs without the vendor/class qualification",
    "cdi-kind-mismatch": "writes its CDI spec under the kind <driver>/device while the IDs it returns name "
                         "<driver>/gpu, so no runtime resolves them",
    "prepare-hang": "never answers a NodePrepareResources call that names claims",
    "stuck-after-unprepare": "refuses every new claim after its first unprepare (a device lock it never lets go)",
    # restarts
    "forgets-after-restart": "ignores its checkpoint and names CDI devices per process",
    "no-reregister": "does not recreate its registration socket when it is deleted",
    "one-kubelet-only": "stops answering GetInfo once a kubelet accepted it, so no later kubelet can register it",
    "stale-socket-crash": "exits at start-up when a stale socket file is in its place",
    # health
    "no-health": "does not implement DRAResourceHealth",
    "stale-health": "keeps streaming the health it saw at start, never what changed",
    "slow-health-refresh": "resends the device list every 40 s, slower than the kubelet's 30 s health timeout",
    "single-stream": "only the first NodeWatchResources call ever gets messages",
    "ignore-temperature": "does not look at device temperature",
    # hostile: calls the kubelet bounds, and a crash
    "getinfo-hang": "never answers GetInfo",
    "unprepare-hang": "never answers a NodeUnprepareResources call that names claims",
    "health-silent": "opens every NodeWatchResources stream and never sends a message",
    "dies-mid-prepare": "exits in the middle of a NodePrepareResources call that names claims",
    # device taints and eviction
    "taint-never-cleared": "keeps every device taint it ever published, also after the device recovered",
    "taints-wrong-device": "publishes each device's taints on the next device (an index mix-up)",
    "noexecute-at-warning": "taints a warm device NoExecute at the warning temperature instead of NoSchedule",
    "unprepare-fails-after-eviction": "refuses to unprepare a claim whose device carries a NoExecute taint",
    "leaves-cdi-after-eviction": "forgets a claim evicted by a NoExecute taint without removing its CDI spec",
    # ResourceSlices
    "bad-slice": "publishes its pool as two slices that both carry the first device",
    "empty-slice": "publishes its pool without devices (a device discovery that found none and said nothing)",
    "no-hotplug": "keeps the device set it saw at start (ignores plug and unplug)",
    # rolling updates (two instances, --pod-uid): what each does to the other's claims and health
    "refuses-old-claims": "refuses to unprepare a claim it did not prepare itself (the old instance's, after an "
                          "update)",
    "private-checkpoint": "keeps a checkpoint of its own per instance: the new one never learns the old one's claims "
                          "and leaves what they made behind",
    "loads-checkpoint-once": "reads the shared checkpoint only at start: a claim the other instance unprepared "
                             "since still holds its device",
    "waits-for-old-instance": "refuses to prepare while an older instance runs (it waits for a device lock the old "
                              "one holds until it exits)",
    "old-health-wins": "the old instance stops watching its devices once a newer one appears and keeps resending "
                       "the health it last sent",
    # partitionable devices (harness/reference/dra_partitions.py): only with a partitioned GPU
    "counters-in-device-slice": "publishes its CounterSets in the slice of the devices that consume them, "
                                "which 1.36's API server refuses",
    "overcommit-counters": "its CounterSets offer twice the GPU's memory slices, so overlapping partitions fit at once",
    "consumes-missing-counter": "the whole GPU consumes a memory-slice counter one past the last its CounterSet has",
    "prepares-whole-gpu": "prepares a claim for a partition with the whole GPU's CDI device",
    # consumable capacity (harness/reference/dra_capacity.py): only with a shareable device
    "policy-without-multi": "publishes a shareable device's requestPolicy without allowMultipleAllocations, which "
                            "1.36's API server refuses",
    "shared-prepared-once": "prepares a shared device once: a second claim on it gets the first claim's CDI device",
    "unprepare-drops-share": "unpreparing one claim on a shared device tears down every claim's share of it",
    "overstates-capacity": "publishes twice the shared capacity its hardware has",
    "share-full-capacity": "hands each claim on a shared device the whole device's capacity, not its share",
    # admin access (harness/reference/dra_admin.py): an admin-access claim on a device another claim holds
    "refuses-busy-device": "refuses to prepare a device already prepared for another claim, an admin-access claim's "
                           "too (the exclusive-lock habit)",
    "admin-unprepare-resets": "resets a device when any claim on it is unprepared, removing the CDI specs of the "
                              "other claims prepared on it",
    # extended resources backed by DRA (harness/reference/dra_extended.py): the scheduler's claim for a pod
    "refuses-generated-claims": "refuses a pod-owned claim that none of the pod's claim entries names (the "
                                "scheduler's claim for extended resources), looking for per-pod settings",
    "one-request-name": "names every prepared device with the claim's first request, so the kubelet hands every "
                        "device to the first container",
    # beside a device plugin for the same hardware (harness/reference/dra_beside.py)
    "ignores-device-plugin": "ignores --exclude-devices: publishes and prepares the devices a device plugin beside it "
                             "serves",
    # device binding conditions and device status (harness/reference/dra_binding.py): fabric-attached devices
    "never-binds": "publishes fabric-attached devices with bindingConditions but never sets them on the claim's "
                   "device status, so the scheduler never binds the pod",
    "hides-attach-failure": "reports a failed attach of a fabric-attached device as one still under way, never "
                            "setting its bindingFailureCondition, so the scheduler waits out its 600 s timeout",
    "wrong-network-data": "reports another device's hardware address in a claim's device status networkData",
}
