// Command nvmlplugin is fakelet's Go reference device plugin on NVML: it uses NVIDIA's
// go-nvml, as NVIDIA's device plugin and DRA driver do, so that fakelet's fake
// libnvidia-ml.so.1 is proven against the library real NVML plugins are built on.
//
// It does what NVML-based plugins do, correctly: GPUs enumerated and named by UUID; one
// event set for XID critical errors and double-bit ECC errors, waited on with a timeout;
// application XIDs (13, 31, 43, 45, 68, 109) ignored; a GPU an event condemned is
// Unhealthy until its handle answers again; the temperature polled at every wait's
// timeout (Unhealthy above -temp-threshold, Healthy again below it minus the hysteresis);
// every GPU Unhealthy while the event wait itself fails. It serves its socket, then
// registers, and registers again whenever kubelet.sock is re-created.
//
// -defect makes it a mutant: never-recovers, app-xid-fatal, ignores-xid79,
// ignores-temperature, wait-error-keeps-healthy.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

const (
	waitMs      = 1000 // one event wait; the temperature is polled at each timeout
	kubeletSock = "kubelet.sock"
	xidOffBus   = 79
)

var applicationXids = map[uint64]bool{13: true, 31: true, 43: true, 45: true, 68: true, 109: true}

type gpu struct {
	uuid    string
	minor   int
	numa    int
	handle  nvml.Device
	lost    bool // an event condemned it; it answers again when it recovers
	hot     bool
	present bool
}

type plugin struct {
	v1beta1.UnimplementedDevicePluginServer
	mu                  sync.Mutex
	gpus                map[string]*gpu
	blind               bool
	changed             chan struct{}
	defect              string
	threshold, hysteres float64
	devDir              string
}

func (p *plugin) has(d string) bool { return p.defect == d }

func (p *plugin) notify() {
	select {
	case p.changed <- struct{}{}:
	default:
	}
}

// enumerate (re)reads the GPUs NVML shows: a GPU that left enumeration is gone from the list.
func (p *plugin) enumerate() {
	n, ret := nvml.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return
	}
	seen := map[string]bool{}
	for i := 0; i < n; i++ {
		d, ret := nvml.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS && ret != nvml.ERROR_GPU_IS_LOST {
			continue
		}
		uuid, ret := d.GetUUID()
		if ret != nvml.SUCCESS {
			continue // lost: it keeps its entry, by handle, below
		}
		seen[uuid] = true
		g, ok := p.gpus[uuid]
		if !ok {
			numa, _ := d.GetNumaNodeId()
			g = &gpu{uuid: uuid, minor: i, numa: numa}
			p.gpus[uuid] = g
		}
		g.handle, g.present = d, true
	}
	for uuid, g := range p.gpus {
		if !seen[uuid] && !g.lost {
			g.present = false
		}
	}
}

func (p *plugin) health(g *gpu) string {
	if p.blind || g.lost || g.hot {
		return v1beta1.Unhealthy
	}
	return v1beta1.Healthy
}

func (p *plugin) list() []*v1beta1.Device {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := []*v1beta1.Device{}
	for _, g := range p.gpus {
		if !g.present {
			continue
		}
		out = append(out, &v1beta1.Device{ID: g.uuid, Health: p.health(g),
			Topology: &v1beta1.TopologyInfo{Nodes: []*v1beta1.NUMANode{{ID: int64(g.numa)}}}})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// watch is the health loop: events, and the temperature at every timeout.
func (p *plugin) watch(stop <-chan struct{}) {
	set, ret := nvml.EventSetCreate()
	if ret != nvml.SUCCESS {
		log.Printf("no NVML events: %v", nvml.ErrorString(ret))
		return
	}
	defer set.Free()
	registered := map[string]bool{}
	for {
		select {
		case <-stop:
			return
		default:
		}
		p.mu.Lock()
		p.enumerate()
		for uuid, g := range p.gpus {
			if g.present && !registered[uuid] {
				if g.handle.RegisterEvents(nvml.EventTypeXidCriticalError|nvml.EventTypeDoubleBitEccError, set) == nvml.SUCCESS {
					registered[uuid] = true
				}
			}
		}
		p.mu.Unlock()
		data, ret := set.Wait(waitMs)
		p.mu.Lock()
		switch {
		case ret == nvml.SUCCESS:
			p.blind = false
			p.onEvent(data)
		case ret == nvml.ERROR_TIMEOUT:
			p.blind = false
			p.poll()
		case !p.has("wait-error-keeps-healthy"):
			log.Printf("nvmlEventSetWait failed (%v): every GPU unhealthy", nvml.ErrorString(ret))
			p.blind = true
		}
		p.mu.Unlock()
		p.notify()
	}
}

func (p *plugin) onEvent(data nvml.EventData) {
	xid := data.EventData
	if data.EventType == nvml.EventTypeXidCriticalError {
		if applicationXids[xid] && !p.has("app-xid-fatal") {
			log.Printf("ignoring application XID %d", xid)
			return
		}
		if xid == xidOffBus && p.has("ignores-xid79") {
			return
		}
	}
	for _, g := range p.gpus {
		if g.handle == data.Device {
			log.Printf("event %#x (%d) on %s: unhealthy", data.EventType, xid, g.uuid)
			g.lost = true
		}
	}
}

// poll re-checks condemned GPUs (a GPU that answers again recovered) and every temperature.
func (p *plugin) poll() {
	for _, g := range p.gpus {
		if g.lost && !p.has("never-recovers") {
			if _, ret := g.handle.GetUUID(); ret == nvml.SUCCESS {
				g.lost = false
			}
		}
		if p.has("ignores-temperature") || !g.present {
			continue
		}
		temp, ret := g.handle.GetTemperature(nvml.TEMPERATURE_GPU)
		if ret != nvml.SUCCESS {
			continue
		}
		t := float64(temp)
		if !g.hot && t > p.threshold {
			g.hot = true
		} else if g.hot && t < p.threshold-p.hysteres {
			g.hot = false
		}
	}
}

// options: every optional RPC offered, as NVIDIA's plugin offers GetPreferredAllocation.
func options() *v1beta1.DevicePluginOptions {
	return &v1beta1.DevicePluginOptions{PreStartRequired: true, GetPreferredAllocationAvailable: true}
}

func (p *plugin) GetDevicePluginOptions(context.Context, *v1beta1.Empty) (*v1beta1.DevicePluginOptions, error) {
	return options(), nil
}

// GetPreferredAllocation: the must-include devices, then the others in ID order, up to the size asked.
func (p *plugin) GetPreferredAllocation(_ context.Context, req *v1beta1.PreferredAllocationRequest) (*v1beta1.PreferredAllocationResponse, error) {
	resp := &v1beta1.PreferredAllocationResponse{}
	for _, c := range req.ContainerRequests {
		chosen := append([]string{}, c.MustIncludeDeviceIDs...)
		taken := map[string]bool{}
		for _, id := range chosen {
			taken[id] = true
		}
		available := append([]string{}, c.AvailableDeviceIDs...)
		sort.Strings(available)
		for _, id := range available {
			if len(chosen) >= int(c.AllocationSize) {
				break
			}
			if !taken[id] {
				chosen = append(chosen, id)
				taken[id] = true
			}
		}
		resp.ContainerResponses = append(resp.ContainerResponses, &v1beta1.ContainerPreferredAllocationResponse{DeviceIDs: chosen})
	}
	return resp, nil
}

func (p *plugin) PreStartContainer(context.Context, *v1beta1.PreStartContainerRequest) (*v1beta1.PreStartContainerResponse, error) {
	return &v1beta1.PreStartContainerResponse{}, nil
}

func (p *plugin) ListAndWatch(_ *v1beta1.Empty, stream v1beta1.DevicePlugin_ListAndWatchServer) error {
	last := ""
	for {
		devices := p.list()
		key := fmt.Sprint(devices)
		if key != last {
			if err := stream.Send(&v1beta1.ListAndWatchResponse{Devices: devices}); err != nil {
				return err
			}
			last = key
		}
		select {
		case <-stream.Context().Done():
			return nil
		case <-p.changed:
		case <-time.After(time.Second):
		}
	}
}

func (p *plugin) Allocate(_ context.Context, req *v1beta1.AllocateRequest) (*v1beta1.AllocateResponse, error) {
	resp := &v1beta1.AllocateResponse{}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range req.ContainerRequests {
		specs := []*v1beta1.DeviceSpec{}
		for _, id := range c.DevicesIds {
			g, ok := p.gpus[id]
			if !ok || !g.present {
				return nil, fmt.Errorf("unknown device %q", id)
			}
			node := filepath.Join(p.devDir, fmt.Sprintf("nvidia%d", g.minor))
			specs = append(specs, &v1beta1.DeviceSpec{ContainerPath: fmt.Sprintf("/dev/nvidia%d", g.minor), HostPath: node, Permissions: "rw"})
		}
		resp.ContainerResponses = append(resp.ContainerResponses, &v1beta1.ContainerAllocateResponse{
			Envs: map[string]string{"NVIDIA_VISIBLE_DEVICES": strings.Join(c.DevicesIds, ",")}, Devices: specs})
	}
	return resp, nil
}

func register(dir, endpoint, resource string) error {
	conn, err := grpc.NewClient("unix://"+filepath.Join(dir, kubeletSock), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = v1beta1.NewRegistrationClient(conn).Register(ctx, &v1beta1.RegisterRequest{
		Version: v1beta1.Version, Endpoint: endpoint, ResourceName: resource, Options: options()}, grpc.WaitForReady(true))
	return err
}

func inode(path string) uint64 {
	var st syscall.Stat_t
	if syscall.Stat(path, &st) != nil {
		return 0
	}
	return st.Ino
}

func serve(p *plugin, sock string) (*grpc.Server, error) {
	_ = os.Remove(sock)
	lis, err := net.Listen("unix", sock)
	if err != nil {
		return nil, err
	}
	srv := grpc.NewServer()
	v1beta1.RegisterDevicePluginServer(srv, p)
	go func() { _ = srv.Serve(lis) }()
	return srv, nil
}

func main() {
	dir := flag.String("plugin-dir", v1beta1.DevicePluginPath, "the kubelet's device-plugins directory")
	resource := flag.String("resource", "nvidia.com/gpu", "the resource name to register")
	endpoint := flag.String("socket-name", "fakelet-nvml-go.sock", "the plugin's socket in -plugin-dir")
	devDir := flag.String("dev-dir", "/dev", "where /dev/nvidiaN live")
	threshold := flag.Float64("temp-threshold", 85, "degrees C: Unhealthy above")
	hysteresis := flag.Float64("temp-hysteresis", 5, "degrees C below the threshold to be Healthy again")
	defect := flag.String("defect", "", "never-recovers, app-xid-fatal, ignores-xid79, ignores-temperature, wait-error-keeps-healthy")
	flag.Parse()

	if ret := nvml.Init(); ret != nvml.SUCCESS {
		log.Fatalf("nvml init: %v", nvml.ErrorString(ret)) // no NVML: no GPU to vouch for
	}
	defer nvml.Shutdown()
	p := &plugin{gpus: map[string]*gpu{}, changed: make(chan struct{}, 1), defect: *defect,
		threshold: *threshold, hysteres: *hysteresis, devDir: *devDir}
	p.mu.Lock()
	p.enumerate()
	p.poll()
	p.mu.Unlock()
	stop := make(chan struct{})
	go p.watch(stop)

	sock := filepath.Join(*dir, *endpoint)
	srv, err := serve(p, sock)
	if err != nil {
		log.Fatalf("serve: %v", err)
	}
	kubelet := filepath.Join(*dir, kubeletSock)
	registeredTo := uint64(0)
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-signals:
			close(stop)
			srv.Stop()
			_ = os.Remove(sock)
			return
		case <-tick.C:
		}
		if inode(sock) == 0 { // the kubelet deleted our socket: serve again
			srv.Stop()
			if srv, err = serve(p, sock); err != nil {
				log.Fatalf("serve: %v", err)
			}
			registeredTo = 0
		}
		if now := inode(kubelet); now != 0 && now != registeredTo {
			if err := register(*dir, *endpoint, *resource); err != nil {
				log.Printf("register: %v", err)
				continue
			}
			registeredTo = now
			log.Printf("registered %s with the kubelet", *resource)
		}
	}
}
