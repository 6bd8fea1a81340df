// Command nvmldra is fakelet's Go reference DRA kubelet plugin on NVML: NVIDIA's go-nvml for
// the GPUs and their health, and Kubernetes' own kubeletplugin helper
// (k8s.io/dynamic-resource-allocation) for registration, the DRAPlugin services and
// ResourceSlice publishing, as NVIDIA's DRA driver is built. It is the proof that fakelet's
// fake libnvidia-ml.so.1 serves a DRA driver too, and that the DRA-HLT checks judge one.
//
// What it does, correctly: GPUs enumerated by UUID and named gpu-<minor> (NVIDIA's DRA driver
// names them so); published as one pool named after the node; claims prepared with a CDI
// spec per claim (named after the claim UID, so unprepare needs no state and survives a
// restart); health from one NVML event set (XID critical errors, double-bit ECC) waited on
// with a timeout, application XIDs ignored, a condemned GPU Healthy again once its handle
// answers, the temperature polled at every timeout; every GPU Unhealthy while the wait itself
// fails. Health goes to the kubelet through DRAResourceHealth (NodeWatchResources: the full
// list at once, on every change and every -health-refresh), and a failed or overheated GPU
// also carries a NoExecute device taint in the ResourceSlice.
//
// -defect makes it a mutant: never-recovers, app-xid-fatal, ignores-xid79,
// ignores-temperature, wait-error-keeps-healthy, single-stream, no-refresh.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"sync"
	"syscall"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"google.golang.org/grpc"
	resourceapi "k8s.io/api/resource/v1"
	apiresource "k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"
	drahealth "k8s.io/kubelet/pkg/apis/dra-health/v1alpha1"
	drav1 "k8s.io/kubelet/pkg/apis/dra/v1"
	drav1beta1 "k8s.io/kubelet/pkg/apis/dra/v1beta1"
)

const (
	waitMs    = 1000 // one event wait; the temperature is polled at each timeout
	xidOffBus = 79   // NVIDIA XID 79: the GPU has fallen off the bus
	// The kubeletplugin helper's registration socket name (draplugin.go Start: driverName + "-reg.sock").
	regSocketSuffix = "-reg.sock"
	// CDI (github.com/cncf-tags/container-device-interface): 0.5.0 added deviceNodes' hostPath.
	cdiVersion = "0.5.0"
	cdiClass   = "gpu"
	// Declared per device: three refreshes, so one late message never turns a device Unknown.
	healthTimeoutRefreshes = 3
)

// NVIDIA's device plugin ignores these by default: faults of the application, not the GPU.
var applicationXids = map[uint64]bool{13: true, 31: true, 43: true, 45: true, 68: true, 109: true}

type gpu struct {
	uuid, name, product string
	minor, index        int
	memory              uint64
	handle              nvml.Device
	lost                string // why an event condemned it; it answers again when it recovers
	hot                 bool
	present             bool
}

type driver struct {
	drahealth.UnimplementedDRAResourceHealthServer

	name, node, cdiDir, devDir, defect string
	threshold, hysteresis              float64
	refresh                            time.Duration

	mu      sync.Mutex
	gpus    map[string]*gpu // by UUID
	blind   bool            // the event wait fails: nothing can be vouched for
	changed chan struct{}   // closed and replaced on every change: a broadcast to the streams
	streams int

	helperMu  sync.Mutex
	helper    *kubeletplugin.Helper
	published string
	cancel    context.CancelCauseFunc
}

func (d *driver) has(defect string) bool { return d.defect == defect }

// enumerate (re)reads the GPUs NVML shows. A GPU whose handle answers GPU-is-lost is still
// enumerated (it is in the count): it keeps its entry, found by its handle.
func (d *driver) enumerate() {
	n, ret := nvml.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return
	}
	seen := map[string]bool{}
	for i := 0; i < n; i++ {
		h, ret := nvml.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS && ret != nvml.ERROR_GPU_IS_LOST {
			continue
		}
		uuid, ret := h.GetUUID()
		if ret != nvml.SUCCESS {
			for u, g := range d.gpus {
				if g.handle == h {
					seen[u] = true
				}
			}
			continue
		}
		seen[uuid] = true
		g, ok := d.gpus[uuid]
		if !ok {
			minor, ret := h.GetMinorNumber()
			if ret != nvml.SUCCESS {
				continue
			}
			product, _ := h.GetName()
			mem, _ := h.GetMemoryInfo()
			g = &gpu{uuid: uuid, name: fmt.Sprintf("gpu-%d", minor), minor: minor, product: product, memory: mem.Total}
			d.gpus[uuid] = g
		}
		g.handle, g.index, g.present = h, i, true
	}
	for uuid, g := range d.gpus {
		if !seen[uuid] {
			g.present = false
		}
	}
}

// watch is the health loop: events, and the temperature at every timeout.
func (d *driver) watch(ctx context.Context) {
	set, ret := nvml.EventSetCreate()
	if ret != nvml.SUCCESS {
		klog.Errorf("no NVML events: %v", nvml.ErrorString(ret))
		return
	}
	defer set.Free()
	registered := map[string]bool{}
	for ctx.Err() == nil {
		d.mu.Lock()
		d.enumerate()
		for uuid, g := range d.gpus {
			if g.present && !registered[uuid] &&
				g.handle.RegisterEvents(nvml.EventTypeXidCriticalError|nvml.EventTypeDoubleBitEccError, set) == nvml.SUCCESS {
				registered[uuid] = true
			}
		}
		d.mu.Unlock()
		data, ret := set.Wait(waitMs)
		d.mu.Lock()
		switch {
		case ret == nvml.SUCCESS:
			d.blind = false
			d.onEvent(data)
		case ret == nvml.ERROR_TIMEOUT:
			d.blind = false
			d.poll()
		case !d.has("wait-error-keeps-healthy"):
			if !d.blind {
				klog.Warningf("nvmlEventSetWait failed (%v): every GPU unhealthy", nvml.ErrorString(ret))
			}
			d.blind = true
		}
		d.mu.Unlock()
		if ret != nvml.SUCCESS && ret != nvml.ERROR_TIMEOUT {
			// A wait that fails at once would spin: wait out the period it would have blocked.
			select {
			case <-ctx.Done():
			case <-time.After(waitMs * time.Millisecond):
			}
		}
		d.update(ctx)
	}
}

func (d *driver) onEvent(data nvml.EventData) {
	xid := data.EventData
	reason := fmt.Sprintf("double-bit ECC error (event %#x)", data.EventType)
	if data.EventType == nvml.EventTypeXidCriticalError {
		if applicationXids[xid] && !d.has("app-xid-fatal") {
			klog.Infof("ignoring application XID %d", xid)
			return
		}
		if xid == xidOffBus && d.has("ignores-xid79") {
			return
		}
		reason = fmt.Sprintf("XID %d", xid)
	}
	for _, g := range d.gpus {
		if g.handle == data.Device {
			klog.Infof("%s on %s (%s): unhealthy", reason, g.name, g.uuid)
			g.lost = reason
		}
	}
}

// poll re-checks condemned GPUs (a GPU that answers again recovered) and every temperature.
func (d *driver) poll() {
	for _, g := range d.gpus {
		if g.lost != "" && !d.has("never-recovers") {
			if _, ret := g.handle.GetUUID(); ret == nvml.SUCCESS {
				klog.Infof("%s answers again: healthy", g.name)
				g.lost = ""
			}
		}
		if d.has("ignores-temperature") || !g.present {
			continue
		}
		temp, ret := g.handle.GetTemperature(nvml.TEMPERATURE_GPU)
		if ret != nvml.SUCCESS {
			continue
		}
		t := float64(temp)
		if !g.hot && t > d.threshold {
			g.hot = true
		} else if g.hot && t < d.threshold-d.hysteresis {
			g.hot = false
		}
	}
}

// present lists the GPUs in the enumeration, by name. Callers hold d.mu.
func (d *driver) present() []*gpu {
	out := []*gpu{}
	for _, g := range d.gpus {
		if g.present {
			out = append(out, g)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].minor < out[j].minor })
	return out
}

// taints: a GPU an event condemned, or one past the temperature threshold, evicts its pods.
func (d *driver) taints(g *gpu) []resourceapi.DeviceTaint {
	var out []resourceapi.DeviceTaint
	if g.lost != "" {
		out = append(out, resourceapi.DeviceTaint{Key: d.name + "/unhealthy", Value: "nvml-event",
			Effect: resourceapi.DeviceTaintEffectNoExecute})
	}
	if g.hot {
		out = append(out, resourceapi.DeviceTaint{Key: d.name + "/temperature", Value: "critical",
			Effect: resourceapi.DeviceTaintEffectNoExecute})
	}
	return out
}

// resources is what the slices say: the present GPUs, with their identity and taints.
func (d *driver) resources() resourceslice.DriverResources {
	d.mu.Lock()
	defer d.mu.Unlock()
	devices := []resourceapi.Device{}
	for _, g := range d.present() {
		uuid, product, index, minor := g.uuid, g.product, int64(g.index), int64(g.minor)
		devices = append(devices, resourceapi.Device{
			Name: g.name,
			Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
				"uuid": {StringValue: &uuid}, "productName": {StringValue: &product},
				"index": {IntValue: &index}, "minor": {IntValue: &minor},
			},
			Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
				"memory": {Value: *apiresource.NewQuantity(int64(g.memory), apiresource.BinarySI)},
			},
			Taints: d.taints(g),
		})
	}
	return resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{
		d.node: {Slices: []resourceslice.Slice{{Devices: devices}}},
	}}
}

// update tells the health streams and, when the slices change, the API server.
func (d *driver) update(ctx context.Context) {
	d.mu.Lock()
	close(d.changed)
	d.changed = make(chan struct{})
	d.mu.Unlock()
	res := d.resources()
	key := fmt.Sprintf("%v", res.Pools[d.node].Slices[0].Devices)
	d.helperMu.Lock()
	defer d.helperMu.Unlock()
	if d.helper == nil || key == d.published {
		return
	}
	if err := d.helper.PublishResources(ctx, res); err != nil {
		klog.Errorf("publish: %v", err)
		return
	}
	d.published = key
}

// health is one NodeWatchResources message: every present GPU.
func (d *driver) health() (*drahealth.NodeWatchResourcesResponse, <-chan struct{}) {
	d.mu.Lock()
	defer d.mu.Unlock()
	now := time.Now().Unix()
	timeout := int64(healthTimeoutRefreshes * d.refresh.Seconds())
	resp := &drahealth.NodeWatchResourcesResponse{}
	for _, g := range d.present() {
		status, why := drahealth.HealthStatus_HEALTHY, ""
		switch {
		case d.blind:
			status, why = drahealth.HealthStatus_UNHEALTHY, "NVML event wait failing"
		case g.lost != "":
			status, why = drahealth.HealthStatus_UNHEALTHY, g.lost
		case g.hot:
			status, why = drahealth.HealthStatus_UNHEALTHY, fmt.Sprintf("above %g C", d.threshold)
		}
		resp.Devices = append(resp.Devices, &drahealth.DeviceHealth{
			Device: &drahealth.DeviceIdentifier{PoolName: d.node, DeviceName: g.name}, Health: status,
			LastUpdatedTime: now, HealthCheckTimeoutSeconds: max(timeout, 1), Message: why})
	}
	return resp, d.changed
}

// NodeWatchResources streams the full list at once, on every change and every refresh.
func (d *driver) NodeWatchResources(_ *drahealth.NodeWatchResourcesRequest,
	stream grpc.ServerStreamingServer[drahealth.NodeWatchResourcesResponse]) error {
	d.mu.Lock()
	d.streams++
	first := d.streams == 1
	d.mu.Unlock()
	if d.has("single-stream") && !first {
		// The bug: the broadcaster's one subscription went to the first stream.
		<-stream.Context().Done()
		return nil
	}
	tick := time.NewTicker(d.refresh)
	defer tick.Stop()
	last := ""
	for {
		resp, changed := d.health()
		key := ""
		for _, h := range resp.Devices {
			key += fmt.Sprintf("%s=%s(%s) ", h.Device.DeviceName, h.Health, h.Message)
		}
		// no-refresh, the bug: only changes are sent, so a quiet device ages into Unknown at the kubelet.
		if !d.has("no-refresh") || key != last {
			if err := stream.Send(resp); err != nil {
				return err
			}
		}
		last = key
		select {
		case <-stream.Context().Done():
			return nil
		case <-changed:
		case <-tick.C:
		}
	}
}

// PrepareResourceClaims writes one CDI spec per claim, its devices named after the claim UID.
func (d *driver) PrepareResourceClaims(_ context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	out := map[types.UID]kubeletplugin.PrepareResult{}
	for _, claim := range claims {
		devices, err := d.prepare(claim)
		out[claim.UID] = kubeletplugin.PrepareResult{Devices: devices, Err: err}
	}
	return out, nil
}

type cdiDeviceNode struct {
	Path        string `json:"path"`
	HostPath    string `json:"hostPath,omitempty"`
	Permissions string `json:"permissions,omitempty"`
}

type cdiEdits struct {
	Env         []string        `json:"env,omitempty"`
	DeviceNodes []cdiDeviceNode `json:"deviceNodes,omitempty"`
}

type cdiDevice struct {
	Name           string   `json:"name"`
	ContainerEdits cdiEdits `json:"containerEdits"`
}

type cdiSpec struct {
	Version        string      `json:"cdiVersion"`
	Kind           string      `json:"kind"`
	Devices        []cdiDevice `json:"devices"`
	ContainerEdits cdiEdits    `json:"containerEdits"`
}

func (d *driver) cdiVendor() string { return "k8s." + d.name }

// specPath: CDI's transient spec name, <vendor>-<class>_<id>, with the claim UID as the id.
func (d *driver) specPath(uid types.UID) string {
	return filepath.Join(d.cdiDir, fmt.Sprintf("%s-%s_%s.json", d.cdiVendor(), cdiClass, uid))
}

func (d *driver) devNode(path string) cdiDeviceNode {
	return cdiDeviceNode{Path: path, HostPath: filepath.Join(d.devDir, filepath.Base(path)), Permissions: "rw"}
}

func (d *driver) prepare(claim *resourceapi.ResourceClaim) ([]kubeletplugin.Device, error) {
	if claim.Status.Allocation == nil {
		return nil, fmt.Errorf("claim %s/%s is not allocated", claim.Namespace, claim.Name)
	}
	byName := map[string]*gpu{}
	d.mu.Lock()
	for _, g := range d.gpus {
		byName[g.name] = g
	}
	d.mu.Unlock()
	spec := cdiSpec{Version: cdiVersion, Kind: d.cdiVendor() + "/" + cdiClass,
		ContainerEdits: cdiEdits{DeviceNodes: []cdiDeviceNode{d.devNode("/dev/nvidiactl"), d.devNode("/dev/nvidia-uvm")}}}
	var devices []kubeletplugin.Device
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver != d.name {
			continue
		}
		g, ok := byName[r.Device]
		if !ok || r.Pool != d.node {
			return nil, fmt.Errorf("claim %s/%s: device %s/%s is not one of this node's GPUs", claim.Namespace,
				claim.Name, r.Pool, r.Device)
		}
		cdiName := fmt.Sprintf("%s-%s", claim.UID, g.name)
		spec.Devices = append(spec.Devices, cdiDevice{Name: cdiName, ContainerEdits: cdiEdits{
			Env:         []string{"NVIDIA_VISIBLE_DEVICES=" + g.uuid},
			DeviceNodes: []cdiDeviceNode{d.devNode(fmt.Sprintf("/dev/nvidia%d", g.minor))}}})
		devices = append(devices, kubeletplugin.Device{Requests: []string{r.Request}, PoolName: r.Pool,
			DeviceName: r.Device, CDIDeviceIDs: []string{spec.Kind + "=" + cdiName}})
	}
	if err := writeAtomic(d.specPath(claim.UID), spec); err != nil {
		return nil, fmt.Errorf("CDI spec: %w", err)
	}
	return devices, nil
}

// writeAtomic: a runtime that re-reads the directory never sees half a spec.
func writeAtomic(path string, v any) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(append(data, '\n')); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(0o644); err != nil { // the runtime may read it as another user
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// UnprepareResourceClaims removes each claim's spec: found by its UID alone, so an unknown
// claim, a second call and a claim prepared before a restart all succeed.
func (d *driver) UnprepareResourceClaims(_ context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	out := map[types.UID]error{}
	for _, c := range claims {
		err := os.Remove(d.specPath(c.UID))
		if errors.Is(err, os.ErrNotExist) {
			err = nil
		}
		out[c.UID] = err
	}
	return out, nil
}

func (d *driver) HandleError(_ context.Context, err error, msg string) {
	klog.Errorf("%s: %v", msg, err)
	if !errors.Is(err, kubeletplugin.ErrRecoverable) && d.cancel != nil {
		d.cancel(fmt.Errorf("%s: %w", msg, err))
	}
}

// perClaim answers a prepare batch claim by claim. The helper reads every claim of a batch
// from the API server first and fails the whole call when one cannot be read
// (kubeletplugin draplugin.go getResourceClaims); the kubelet's API answers per claim, so
// one missing claim must fail alone.
func perClaim(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	switch r := req.(type) {
	case *drav1.NodePrepareResourcesRequest:
		out := &drav1.NodePrepareResourcesResponse{Claims: map[string]*drav1.NodePrepareResourceResponse{}}
		for _, c := range r.Claims {
			resp, err := handler(ctx, &drav1.NodePrepareResourcesRequest{Claims: []*drav1.Claim{c}})
			if err != nil {
				out.Claims[c.Uid] = &drav1.NodePrepareResourceResponse{Error: err.Error()}
				continue
			}
			for uid, v := range resp.(*drav1.NodePrepareResourcesResponse).Claims {
				out.Claims[uid] = v
			}
		}
		return out, nil
	case *drav1beta1.NodePrepareResourcesRequest:
		out := &drav1beta1.NodePrepareResourcesResponse{Claims: map[string]*drav1beta1.NodePrepareResourceResponse{}}
		for _, c := range r.Claims {
			resp, err := handler(ctx, &drav1beta1.NodePrepareResourcesRequest{Claims: []*drav1beta1.Claim{c}})
			if err != nil {
				out.Claims[c.Uid] = &drav1beta1.NodePrepareResourceResponse{Error: err.Error()}
				continue
			}
			for uid, v := range resp.(*drav1beta1.NodePrepareResourcesResponse).Claims {
				out.Claims[uid] = v
			}
		}
		return out, nil
	}
	return handler(ctx, req)
}

// start (re)starts the helper: registration socket, DRA socket, slices.
func (d *driver) start(ctx context.Context, client kubernetes.Interface, registryDir, pluginDir string) error {
	helper, err := kubeletplugin.Start(ctx, d,
		kubeletplugin.DriverName(d.name), kubeletplugin.NodeName(d.node), kubeletplugin.KubeClient(client),
		kubeletplugin.RegistrarDirectoryPath(registryDir), kubeletplugin.PluginDataDirectoryPath(pluginDir),
		kubeletplugin.GRPCInterceptor(perClaim))
	if err != nil {
		return err
	}
	d.helperMu.Lock()
	d.helper, d.published = helper, ""
	d.helperMu.Unlock()
	d.update(ctx)
	return nil
}

func (d *driver) stop() {
	d.helperMu.Lock()
	defer d.helperMu.Unlock()
	d.helper.Stop()
	d.helper = nil
}

func main() {
	klog.InitFlags(nil)
	name := flag.String("driver-name", "nvml.fakelet.example.com", "the DRA driver name")
	node := flag.String("node-name", os.Getenv("NODE_NAME"), "this node (the pool and the slices' owner)")
	kubeconfig := flag.String("kubeconfig", os.Getenv("KUBECONFIG"), "the API server's kubeconfig")
	registryDir := flag.String("registry-dir", kubeletplugin.KubeletRegistryDir, "the kubelet's plugins_registry")
	pluginDir := flag.String("plugin-dir", "", "where dra.sock goes (default <kubelet plugins>/<driver name>)")
	cdiDir := flag.String("cdi-dir", "/var/run/cdi", "where CDI specs go")
	devDir := flag.String("dev-dir", "/dev", "where /dev/nvidia* live")
	threshold := flag.Float64("temp-threshold", 85, "degrees C: Unhealthy above")
	hysteresis := flag.Float64("temp-hysteresis", 5, "degrees C below the threshold to be Healthy again")
	refresh := flag.Duration("health-refresh", time.Second, "how often the health stream repeats itself")
	defect := flag.String("defect", "", "never-recovers, app-xid-fatal, ignores-xid79, ignores-temperature, "+
		"wait-error-keeps-healthy, single-stream, no-refresh")
	flag.Parse()
	if *pluginDir == "" {
		*pluginDir = filepath.Join(kubeletplugin.KubeletPluginsDir, *name)
	}

	if ret := nvml.Init(); ret != nvml.SUCCESS {
		klog.Fatalf("nvml init: %v", nvml.ErrorString(ret)) // no NVML: no GPU to vouch for
	}
	defer nvml.Shutdown()
	config, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		klog.Fatalf("kubeconfig: %v", err)
	}
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		klog.Fatalf("client: %v", err)
	}
	if err := os.MkdirAll(*cdiDir, 0o755); err != nil {
		klog.Fatalf("cdi dir: %v", err)
	}

	ctx, cancel := context.WithCancelCause(context.Background())
	d := &driver{name: *name, node: *node, cdiDir: *cdiDir, devDir: *devDir, defect: *defect,
		threshold: *threshold, hysteresis: *hysteresis, refresh: *refresh, gpus: map[string]*gpu{},
		changed: make(chan struct{}), cancel: cancel}
	d.mu.Lock()
	d.enumerate()
	d.poll()
	d.mu.Unlock()
	go d.watch(ctx)
	if err := d.start(ctx, client, *registryDir, *pluginDir); err != nil {
		klog.Fatalf("start: %v", err)
	}

	regSocket := filepath.Join(*registryDir, *name+regSocketSuffix)
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	code := 0
	for done := false; !done; {
		select {
		case <-signals:
			done = true
		case <-ctx.Done():
			klog.Errorf("stopping: %v", context.Cause(ctx))
			done, code = true, 1
		case <-tick.C:
			// The helper never re-creates a deleted registration socket; a wiped plugins_registry
			// (a re-provisioned kubelet) would leave the driver unregistered for good.
			if _, err := os.Stat(regSocket); errors.Is(err, os.ErrNotExist) {
				klog.Infof("%s is gone: serving again", regSocket)
				d.stop()
				if err := d.start(ctx, client, *registryDir, *pluginDir); err != nil {
					klog.Errorf("restart: %v", err)
					done, code = true, 1
				}
			}
		}
	}
	d.stop()
	cancel(errors.New("exiting"))
	// A clean exit leaves no socket behind for the kubelet to dial.
	for _, s := range []string{regSocket, filepath.Join(*pluginDir, "dra.sock")} {
		_ = os.Remove(s)
	}
	if code != 0 {
		os.Exit(code)
	}
}
