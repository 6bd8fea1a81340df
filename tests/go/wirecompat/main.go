// Command wirecompat proves that fakelet's hand-written device plugin .proto
// is wire compatible with upstream Kubernetes. It speaks the kubelet device
// plugin API (v1beta1) using only the upstream-generated Go package
// k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1, in one of two roles:
//
//	wirecompat plugin  --plugin-dir DIR --resource NAME [--endpoint wirecompat.sock] [--timeout 30s]
//	wirecompat kubelet --plugin-dir DIR [--timeout 20s]
//	wirecompat descriptors
//	wirecompat dracall --socket PATH --version v1|v1beta1 [--timeout 10s]
//	wirecompat draplugin --registry-dir DIR --socket PATH [flags, see draplugin.go]
//	wirecompat healthwatch --socket PATH --version v1|v1alpha1 [--count 1] [--timeout 10s]
//	wirecompat podresources [--get NAMESPACE/NAME]... [--timeout 10s] SOCKET
//
// plugin: a device plugin serving DIR/ENDPOINT that registers with whatever
// serves DIR/kubelet.sock and prints one JSON line per event on stdout.
//
// kubelet: the kubelet's side; it serves DIR/kubelet.sock, accepts one
// registration, drives the plugin through one allocation and prints what it
// decoded as a single JSON object on stdout.
//
// Because both roles encode and decode with upstream's generated code, a field
// that the Python side puts under a wrong number or type shows up here as a
// missing or wrong value, not as an error, so the caller must compare values.
//
// descriptors: prints, as one JSON object, the schema facts (packages,
// messages with their fields, enums, services) of upstream's generated device
// plugin, plugin registration, DRA, DRA health and PodResources packages,
// for comparison with fakelet's own descriptors.
//
// dracall: the kubelet's side of the DRA plugin API; it calls
// NodePrepareResources and NodeUnprepareResources with one claim on the
// DRAPlugin service at PATH and prints the decoded responses as one JSON
// object.
//
// draplugin: a DRA kubelet plugin built only on upstream's generated
// pluginregistration, DRA and DRA health packages; it serves a registration
// socket in DIR and the DRA services on PATH, answers with fixed, derivable
// results and prints one JSON line per received call (draplugin.go).
//
// healthwatch: the kubelet's side of DRAResourceHealth; it opens
// NodeWatchResources on PATH, reads up to --count messages and prints them as
// one JSON object (draplugin.go).
//
// podresources: a node agent reading the kubelet's PodResources API v1 on
// SOCKET; it calls List, GetAllocatableResources and Get for each --get pod
// and prints the decoded responses and errors as one JSON object
// (podresources.go).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
	v1beta1 "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	drahealthv1 "k8s.io/kubelet/pkg/apis/dra-health/v1"
	drahealthv1alpha1 "k8s.io/kubelet/pkg/apis/dra-health/v1alpha1"
	drav1 "k8s.io/kubelet/pkg/apis/dra/v1"
	drav1beta1 "k8s.io/kubelet/pkg/apis/dra/v1beta1"
	registrationv1 "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// kubeletSocket is the registration socket's name inside the plugin
// directory; upstream only exports it joined to /var/lib/kubelet.
const kubeletSocket = "kubelet.sock"

const usage = `usage:
  wirecompat plugin  --plugin-dir DIR --resource NAME [--endpoint wirecompat.sock] [--timeout 30s]
  wirecompat kubelet --plugin-dir DIR [--timeout 20s]
  wirecompat descriptors
  wirecompat dracall --socket PATH --version v1|v1beta1 [--timeout 10s]
  wirecompat draplugin --registry-dir DIR --socket PATH [--driver NAME] [--reg-socket NAME] [--endpoint PATH]
                       [--versions LIST] [--health LIST] [--health-interval 0s] [--health-time UNIX]
  wirecompat healthwatch --socket PATH --version v1|v1alpha1 [--count 1] [--timeout 10s]
  wirecompat podresources [--get NAMESPACE/NAME]... [--timeout 10s] SOCKET
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	var code int
	switch os.Args[1] {
	case "plugin":
		code = pluginMain(os.Args[2:])
	case "kubelet":
		code = kubeletMain(os.Args[2:])
	case "descriptors":
		code = descriptorsMain(os.Args[2:])
	case "dracall":
		code = dracallMain(os.Args[2:])
	case "draplugin":
		code = draPluginMain(os.Args[2:])
	case "healthwatch":
		code = healthwatchMain(os.Args[2:])
	case "podresources":
		code = podResourcesMain(os.Args[2:])
	case "-h", "-help", "--help", "help":
		fmt.Print(usage)
	default:
		fmt.Fprintf(os.Stderr, "wirecompat: unknown mode %q\n%s", os.Args[1], usage)
		code = 2
	}
	os.Exit(code)
}

// ---------------------------------------------------------------------------
// plugin mode

func pluginMain(args []string) int {
	fs := flag.NewFlagSet("wirecompat plugin", flag.ContinueOnError)
	dir := fs.String("plugin-dir", "", "directory holding kubelet.sock and the plugin's socket (required)")
	resource := fs.String("resource", "", "extended resource name to register, e.g. example.com/wire (required)")
	endpoint := fs.String("endpoint", "wirecompat.sock", "socket file name, relative to --plugin-dir, sent as Register.endpoint")
	timeout := fs.Duration("timeout", 30*time.Second, "how long to wait for kubelet.sock and a successful Register")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *dir == "" || *resource == "" || fs.NArg() != 0 {
		fmt.Fprintln(os.Stderr, "wirecompat plugin: --plugin-dir and --resource are required, no positional arguments")
		return 2
	}

	// SIGTERM/SIGINT is the normal way the harness stops the plugin, so it
	// is a clean exit, not a failure.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	events := &eventLog{w: os.Stdout}
	sock := filepath.Join(*dir, *endpoint)
	lis, err := listenUnix(sock)
	if err != nil {
		fmt.Fprintln(os.Stderr, "wirecompat plugin:", err)
		return 1
	}
	srv := grpc.NewServer()
	v1beta1.RegisterDevicePluginServer(srv, &devicePlugin{events: events, shutdown: ctx.Done()})
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(lis) }()
	defer func() {
		stopServer(srv)
		removeSocket(sock)
	}()

	// Register only once the plugin is being served: the kubelet may dial
	// back as soon as Register returns (or even before, for a Python fake).
	regCtx, cancel := context.WithTimeout(ctx, *timeout)
	err = register(regCtx, *dir, &v1beta1.RegisterRequest{
		Version:      v1beta1.Version,
		Endpoint:     *endpoint,
		ResourceName: *resource,
		Options:      pluginOptions(),
	})
	cancel()
	switch {
	case err != nil && ctx.Err() != nil:
		return 0 // asked to stop while registering
	case err != nil:
		events.emit(event{Event: "register_error", Error: err.Error()})
		return 1
	}
	events.emit(event{Event: "registered"})

	select {
	case <-ctx.Done():
		return 0
	case err := <-serveErr:
		fmt.Fprintln(os.Stderr, "wirecompat plugin: serve:", err)
		return 1
	}
}

// register waits for kubelet.sock to appear, then calls Registration.Register.
func register(ctx context.Context, dir string, req *v1beta1.RegisterRequest) error {
	sock := filepath.Join(dir, kubeletSocket)
	if err := waitForFile(ctx, sock); err != nil {
		return err
	}
	conn, err := dialUnix(sock)
	if err != nil {
		return err
	}
	defer conn.Close()
	// WaitForReady covers the window in which the socket file exists but the
	// server has not called listen() yet (connect gets ECONNREFUSED).
	_, err = v1beta1.NewRegistrationClient(conn).Register(ctx, req, grpc.WaitForReady(true))
	return err
}

// pluginOptions is what plugin mode advertises, both in Register and in
// GetDevicePluginOptions. Both flags are set so that the kubelet side has to
// exercise every optional RPC.
func pluginOptions() *v1beta1.DevicePluginOptions {
	return &v1beta1.DevicePluginOptions{PreStartRequired: true, GetPreferredAllocationAvailable: true}
}

// pluginDevices returns a fresh copy of the fixed device list. The two devices
// sit on different NUMA nodes so that a mis-decoded topology is visible.
func pluginDevices() []*v1beta1.Device {
	return []*v1beta1.Device{
		{ID: "wc-0", Health: v1beta1.Healthy, Topology: &v1beta1.TopologyInfo{Nodes: []*v1beta1.NUMANode{{ID: 0}}}},
		{ID: "wc-1", Health: v1beta1.Healthy, Topology: &v1beta1.TopologyInfo{Nodes: []*v1beta1.NUMANode{{ID: 1}}}},
	}
}

// devicePlugin is the upstream DevicePlugin service with fixed behaviour that
// the Python side can assert on exactly.
type devicePlugin struct {
	v1beta1.UnimplementedDevicePluginServer
	events   *eventLog
	shutdown <-chan struct{}
}

func (p *devicePlugin) GetDevicePluginOptions(_ context.Context, req *v1beta1.Empty) (*v1beta1.DevicePluginOptions, error) {
	p.events.call("GetDevicePluginOptions", req)
	return pluginOptions(), nil
}

func (p *devicePlugin) ListAndWatch(req *v1beta1.Empty, stream v1beta1.DevicePlugin_ListAndWatchServer) error {
	p.events.call("ListAndWatch", req)
	if err := stream.Send(&v1beta1.ListAndWatchResponse{Devices: pluginDevices()}); err != nil {
		return err
	}
	// A real plugin keeps the stream open to report health changes; ending it
	// early would look like a plugin failure to the kubelet.
	select {
	case <-stream.Context().Done():
	case <-p.shutdown:
	}
	return nil
}

func (p *devicePlugin) GetPreferredAllocation(_ context.Context, req *v1beta1.PreferredAllocationRequest) (*v1beta1.PreferredAllocationResponse, error) {
	p.events.call("GetPreferredAllocation", req)
	resp := &v1beta1.PreferredAllocationResponse{}
	for _, creq := range req.GetContainerRequests() {
		resp.ContainerResponses = append(resp.ContainerResponses,
			&v1beta1.ContainerPreferredAllocationResponse{DeviceIDs: preferredIDs(creq)})
	}
	return resp, nil
}

// preferredIDs returns must_include IDs first, then the available IDs in the
// order given, without duplicates (the kubelet's available list normally
// contains the must_include IDs too), truncated to allocation_size.
func preferredIDs(req *v1beta1.ContainerPreferredAllocationRequest) []string {
	size := int(req.GetAllocationSize())
	ids := []string{}
	seen := map[string]bool{}
	for _, id := range append(append([]string{}, req.GetMustIncludeDeviceIDs()...), req.GetAvailableDeviceIDs()...) {
		if len(ids) >= size {
			break
		}
		if !seen[id] {
			seen[id] = true
			ids = append(ids, id)
		}
	}
	return ids
}

func (p *devicePlugin) Allocate(_ context.Context, req *v1beta1.AllocateRequest) (*v1beta1.AllocateResponse, error) {
	p.events.call("Allocate", req)
	known := map[string]bool{}
	for _, d := range pluginDevices() {
		known[d.ID] = true
	}
	resp := &v1beta1.AllocateResponse{}
	for _, creq := range req.GetContainerRequests() {
		ids := creq.GetDevicesIds()
		for _, id := range ids {
			if !known[id] {
				// InvalidArgument, not a generic error, so the caller can
				// check that error statuses cross the wire intact too.
				return nil, status.Errorf(codes.InvalidArgument, "unknown device id %q", id)
			}
		}
		joined := strings.Join(ids, ",")
		cresp := &v1beta1.ContainerAllocateResponse{
			Envs:        map[string]string{"WIRECOMPAT_DEVICES": joined},
			Mounts:      []*v1beta1.Mount{{ContainerPath: "/wc", HostPath: "/tmp/wc", ReadOnly: true}},
			Devices:     []*v1beta1.DeviceSpec{{ContainerPath: "/dev/wc0", HostPath: "/dev/null", Permissions: "rw"}},
			Annotations: map[string]string{"wirecompat/ids": joined},
		}
		for _, id := range ids {
			cresp.CdiDevices = append(cresp.CdiDevices, &v1beta1.CDIDevice{Name: "example.com/wire=" + id})
		}
		resp.ContainerResponses = append(resp.ContainerResponses, cresp)
	}
	return resp, nil
}

func (p *devicePlugin) PreStartContainer(_ context.Context, req *v1beta1.PreStartContainerRequest) (*v1beta1.PreStartContainerResponse, error) {
	p.events.call("PreStartContainer", req)
	return &v1beta1.PreStartContainerResponse{}, nil
}

// event is one JSON line of plugin mode's stdout.
type event struct {
	Event   string          `json:"event"`
	Service string          `json:"service,omitempty"` // draplugin: the advertised service name, e.g. "v1.DRAPlugin"
	Method  string          `json:"method,omitempty"`
	Request json.RawMessage `json:"request,omitempty"`
	Error   string          `json:"error,omitempty"`
}

// eventLog writes events as JSON lines. Each line is a single Write on an
// unbuffered *os.File, so a reader sees it at once, and the mutex keeps lines
// from concurrent RPCs whole.
type eventLog struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *eventLog) emit(ev event) {
	line, err := json.Marshal(ev)
	if err != nil {
		line, _ = json.Marshal(event{Event: "log_error", Error: err.Error()})
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	_, _ = l.w.Write(append(line, '\n'))
}

// call logs a received request as protojson with proto field names, and with
// zero values included so the reader can tell "sent empty" from "dropped".
// protojson output is re-compacted by encoding/json via json.RawMessage.
func (l *eventLog) call(method string, req proto.Message) {
	raw, err := protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true}.Marshal(req)
	if err != nil {
		l.emit(event{Event: "call", Method: method, Error: err.Error()})
		return
	}
	l.emit(event{Event: "call", Method: method, Request: raw})
}

// ---------------------------------------------------------------------------
// kubelet mode

func kubeletMain(args []string) int {
	fs := flag.NewFlagSet("wirecompat kubelet", flag.ContinueOnError)
	dir := fs.String("plugin-dir", "", "directory in which to serve kubelet.sock (required)")
	timeout := fs.Duration("timeout", 20*time.Second, "deadline for the whole exchange, from start to the last RPC")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *dir == "" || fs.NArg() != 0 {
		fmt.Fprintln(os.Stderr, "wirecompat kubelet: --plugin-dir is required, no positional arguments")
		return 2
	}

	sigCtx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(sigCtx, *timeout)
	defer cancel()

	report, err := runKubelet(ctx, *dir)
	if err != nil {
		switch {
		case errors.Is(ctx.Err(), context.DeadlineExceeded):
			err = fmt.Errorf("--timeout %s elapsed: %w", *timeout, err)
		case sigCtx.Err() != nil:
			err = fmt.Errorf("interrupted: %w", err)
		}
		fmt.Fprintln(os.Stderr, "wirecompat kubelet:", err)
		return 1
	}
	if err := json.NewEncoder(os.Stdout).Encode(report); err != nil {
		fmt.Fprintln(os.Stderr, "wirecompat kubelet:", err)
		return 1
	}
	return 0
}

// runKubelet serves kubelet.sock until the first Register, then drives the
// registered plugin. The socket is removed before it returns.
func runKubelet(ctx context.Context, dir string) (*kubeletReport, error) {
	sock := filepath.Join(dir, kubeletSocket)
	lis, err := listenUnix(sock)
	if err != nil {
		return nil, err
	}
	reg := &registration{first: make(chan *v1beta1.RegisterRequest, 1)}
	srv := grpc.NewServer()
	v1beta1.RegisterRegistrationServer(srv, reg)
	go func() { _ = srv.Serve(lis) }()
	defer func() {
		stopServer(srv)
		removeSocket(sock)
	}()

	var req *v1beta1.RegisterRequest
	select {
	case req = <-reg.first:
	case <-ctx.Done():
		return nil, fmt.Errorf("waiting for Register on %s: %w", sock, ctx.Err())
	}
	// Dialling back happens here, outside the handler, as in the real
	// kubelet: a plugin that only starts serving after Register returns must
	// still work.
	return drivePlugin(ctx, dir, req)
}

// registration records the first RegisterRequest. Later ones are accepted
// but ignored, as only one plugin is expected.
type registration struct {
	v1beta1.UnimplementedRegistrationServer
	first chan *v1beta1.RegisterRequest
}

func (r *registration) Register(_ context.Context, req *v1beta1.RegisterRequest) (*v1beta1.Empty, error) {
	select {
	case r.first <- req:
	default:
	}
	return &v1beta1.Empty{}, nil
}

// drivePlugin makes the calls the kubelet makes for one pod with one
// container asking for one device, and records what it decoded.
func drivePlugin(ctx context.Context, dir string, reg *v1beta1.RegisterRequest) (*kubeletReport, error) {
	report := &kubeletReport{Register: registerJSON{
		Version:      reg.GetVersion(),
		Endpoint:     reg.GetEndpoint(),
		ResourceName: reg.GetResourceName(),
		Options:      optionsOf(reg.GetOptions()),
	}}

	// The endpoint is a file name relative to the plugin directory, as the
	// kubelet interprets it.
	conn, err := dialUnix(filepath.Join(dir, reg.GetEndpoint()))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	client := v1beta1.NewDevicePluginClient(conn)
	ready := grpc.WaitForReady(true)

	opts, err := client.GetDevicePluginOptions(ctx, &v1beta1.Empty{}, ready)
	if err != nil {
		return nil, fmt.Errorf("GetDevicePluginOptions: %w", err)
	}
	report.Options = optionsOf(opts)

	devices, err := firstDeviceList(ctx, client)
	if err != nil {
		return nil, err
	}
	if len(devices) == 0 {
		return nil, errors.New("ListAndWatch: first response lists no devices")
	}
	var ids []string
	for _, d := range devices {
		ids = append(ids, d.GetID())
		numa := []int64{}
		for _, n := range d.GetTopology().GetNodes() {
			numa = append(numa, n.GetID())
		}
		report.Devices = append(report.Devices, deviceJSON{ID: d.GetID(), Health: d.GetHealth(), NUMA: numa})
	}

	if opts.GetGetPreferredAllocationAvailable() {
		resp, err := client.GetPreferredAllocation(ctx, &v1beta1.PreferredAllocationRequest{
			ContainerRequests: []*v1beta1.ContainerPreferredAllocationRequest{{
				AvailableDeviceIDs:   ids,
				MustIncludeDeviceIDs: ids[:1],
				AllocationSize:       int32(min(2, len(ids))),
			}},
		}, ready)
		if err != nil {
			return nil, fmt.Errorf("GetPreferredAllocation: %w", err)
		}
		// The kubelet rejects a response whose length differs from the
		// request's; so do we, since it means a field was lost.
		if n := len(resp.GetContainerResponses()); n != 1 {
			return nil, fmt.Errorf("GetPreferredAllocation: %d container responses for 1 request", n)
		}
		report.Preferred = append([]string{}, resp.GetContainerResponses()[0].GetDeviceIDs()...)
	}

	alloc, err := client.Allocate(ctx, &v1beta1.AllocateRequest{
		ContainerRequests: []*v1beta1.ContainerAllocateRequest{{DevicesIds: ids[:1]}},
	}, ready)
	if err != nil {
		return nil, fmt.Errorf("Allocate: %w", err)
	}
	if n := len(alloc.GetContainerResponses()); n != 1 {
		return nil, fmt.Errorf("Allocate: %d container responses for 1 request", n)
	}
	report.Allocate = allocateOf(alloc.GetContainerResponses()[0])

	if opts.GetPreStartRequired() {
		if _, err := client.PreStartContainer(ctx, &v1beta1.PreStartContainerRequest{DevicesIds: ids[:1]}, ready); err != nil {
			return nil, fmt.Errorf("PreStartContainer: %w", err)
		}
		called := true
		report.Prestart = &called
	}
	return report, nil
}

// firstDeviceList opens ListAndWatch, takes the first response and closes the
// stream again; the plugin must cope with a kubelet that goes away.
func firstDeviceList(ctx context.Context, client v1beta1.DevicePluginClient) ([]*v1beta1.Device, error) {
	streamCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := client.ListAndWatch(streamCtx, &v1beta1.Empty{}, grpc.WaitForReady(true))
	if err != nil {
		return nil, fmt.Errorf("ListAndWatch: %w", err)
	}
	resp, err := stream.Recv()
	if err != nil {
		return nil, fmt.Errorf("ListAndWatch: first response: %w", err)
	}
	return resp.GetDevices(), nil
}

// kubeletReport is kubelet mode's single JSON object. Field order and
// snake_case names are part of the interface with the Python tests.
type kubeletReport struct {
	Register  registerJSON `json:"register"`
	Options   *optionsJSON `json:"options"`
	Devices   []deviceJSON `json:"devices"`
	Preferred []string     `json:"preferred"` // null: not called
	Allocate  allocateJSON `json:"allocate"`
	Prestart  *bool        `json:"prestart"` // null: not called; true: called and succeeded
}

type registerJSON struct {
	Version      string       `json:"version"`
	Endpoint     string       `json:"endpoint"`
	ResourceName string       `json:"resource_name"`
	Options      *optionsJSON `json:"options"` // null: options field absent on the wire
}

type optionsJSON struct {
	PreStartRequired                bool `json:"pre_start_required"`
	GetPreferredAllocationAvailable bool `json:"get_preferred_allocation_available"`
}

func optionsOf(o *v1beta1.DevicePluginOptions) *optionsJSON {
	if o == nil {
		return nil
	}
	return &optionsJSON{PreStartRequired: o.GetPreStartRequired(), GetPreferredAllocationAvailable: o.GetGetPreferredAllocationAvailable()}
}

type deviceJSON struct {
	ID     string  `json:"id"`
	Health string  `json:"health"`
	NUMA   []int64 `json:"numa"`
}

type allocateJSON struct {
	Envs        map[string]string `json:"envs"`
	Mounts      []mountJSON       `json:"mounts"`
	Devices     []deviceSpecJSON  `json:"devices"`
	Annotations map[string]string `json:"annotations"`
	CDIDevices  []string          `json:"cdi_devices"`
}

type mountJSON struct {
	ContainerPath string `json:"container_path"`
	HostPath      string `json:"host_path"`
	ReadOnly      bool   `json:"read_only"`
}

type deviceSpecJSON struct {
	ContainerPath string `json:"container_path"`
	HostPath      string `json:"host_path"`
	Permissions   string `json:"permissions"`
}

// allocateOf converts a response, using empty maps and lists rather than
// null so that the Python side compares values, not presence.
func allocateOf(r *v1beta1.ContainerAllocateResponse) allocateJSON {
	a := allocateJSON{
		Envs:        map[string]string{},
		Mounts:      []mountJSON{},
		Devices:     []deviceSpecJSON{},
		Annotations: map[string]string{},
		CDIDevices:  []string{},
	}
	for k, v := range r.GetEnvs() {
		a.Envs[k] = v
	}
	for k, v := range r.GetAnnotations() {
		a.Annotations[k] = v
	}
	for _, m := range r.GetMounts() {
		a.Mounts = append(a.Mounts, mountJSON{ContainerPath: m.GetContainerPath(), HostPath: m.GetHostPath(), ReadOnly: m.GetReadOnly()})
	}
	for _, d := range r.GetDevices() {
		a.Devices = append(a.Devices, deviceSpecJSON{ContainerPath: d.GetContainerPath(), HostPath: d.GetHostPath(), Permissions: d.GetPermissions()})
	}
	for _, c := range r.GetCdiDevices() {
		a.CDIDevices = append(a.CDIDevices, c.GetName())
	}
	return a
}

// ---------------------------------------------------------------------------
// unix socket helpers

// listenUnix removes a stale socket file left by an earlier run (bind fails
// with EADDRINUSE otherwise) and listens on path.
func listenUnix(path string) (net.Listener, error) {
	removeSocket(path)
	lis, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	return lis, nil
}

func removeSocket(path string) {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		fmt.Fprintf(os.Stderr, "wirecompat: remove %s: %v\n", path, err)
	}
}

// dialUnix creates a lazy client connection to a unix socket. The reconnect
// backoff is shortened from gRPC's default (1s base, 120s cap) because both
// sides start within milliseconds of each other and the timeouts are short.
func dialUnix(path string) (*grpc.ClientConn, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, err
	}
	conn, err := grpc.NewClient("unix://"+abs,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
			MinConnectTimeout: time.Second,
		}),
	)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", abs, err)
	}
	return conn, nil
}

// waitForFile polls for path, because the other side may not have started
// listening yet; inotify would be overkill for a test bench.
func waitForFile(ctx context.Context, path string) error {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		if _, err := os.Stat(path); err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w", path, ctx.Err())
		case <-tick.C:
		}
	}
}

// stopServer lets in-flight RPCs finish, but not forever: a client holding a
// ListAndWatch stream open would otherwise block GracefulStop.
func stopServer(srv *grpc.Server) {
	done := make(chan struct{})
	go func() {
		srv.GracefulStop()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(2 * time.Second):
		srv.Stop()
	}
}

// ---------------------------------------------------------------------------
// descriptors mode

// upstreamFiles are the upstream file descriptors that descriptors mode
// reports, keyed by API and version as the Python side names them.
var upstreamFiles = []struct {
	key  string
	file protoreflect.FileDescriptor
}{
	{"deviceplugin/v1beta1", v1beta1.File_staging_src_k8s_io_kubelet_pkg_apis_deviceplugin_v1beta1_api_proto},
	{"pluginregistration/v1", registrationv1.File_staging_src_k8s_io_kubelet_pkg_apis_pluginregistration_v1_api_proto},
	{"dra/v1beta1", drav1beta1.File_staging_src_k8s_io_kubelet_pkg_apis_dra_v1beta1_api_proto},
	{"dra/v1", drav1.File_staging_src_k8s_io_kubelet_pkg_apis_dra_v1_api_proto},
	{"dra-health/v1alpha1", drahealthv1alpha1.File_staging_src_k8s_io_kubelet_pkg_apis_dra_health_v1alpha1_api_proto},
	{"dra-health/v1", drahealthv1.File_staging_src_k8s_io_kubelet_pkg_apis_dra_health_v1_api_proto},
	{"podresources/v1", podresourcesv1.File_staging_src_k8s_io_kubelet_pkg_apis_podresources_v1_api_proto},
}

// The JSON shapes below mirror descriptor.proto's names; enum-typed values
// (label, type) are their descriptor.proto names, e.g. "TYPE_STRING".
type fileJSON struct {
	Package  string        `json:"package"`
	Messages []messageJSON `json:"messages"`
	Enums    []enumJSON    `json:"enums"`
	Services []serviceJSON `json:"services"`
}

type messageJSON struct {
	Name     string      `json:"name"` // fully qualified, nested map entries included
	MapEntry bool        `json:"map_entry"`
	Fields   []fieldJSON `json:"fields"`
}

type fieldJSON struct {
	Name           string `json:"name"`
	Number         int32  `json:"number"`
	Label          string `json:"label"`
	Type           string `json:"type"`
	TypeName       string `json:"type_name"` // ".pkg.Message" for messages and enums, else ""
	Proto3Optional bool   `json:"proto3_optional"`
}

type enumJSON struct {
	Name   string          `json:"name"`
	Values []enumValueJSON `json:"values"`
}

type enumValueJSON struct {
	Name   string `json:"name"`
	Number int32  `json:"number"`
}

type serviceJSON struct {
	Name    string       `json:"name"`
	Methods []methodJSON `json:"methods"`
}

type methodJSON struct {
	Name            string `json:"name"`
	InputType       string `json:"input_type"`
	OutputType      string `json:"output_type"`
	ClientStreaming bool   `json:"client_streaming"`
	ServerStreaming bool   `json:"server_streaming"`
}

func descriptorsMain(args []string) int {
	if len(args) != 0 {
		fmt.Fprintln(os.Stderr, "wirecompat descriptors: takes no arguments")
		return 2
	}
	out := map[string]fileJSON{}
	for _, f := range upstreamFiles {
		out[f.key] = describeFile(protodesc.ToFileDescriptorProto(f.file))
	}
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		fmt.Fprintln(os.Stderr, "wirecompat descriptors:", err)
		return 1
	}
	return 0
}

func describeFile(fd *descriptorpb.FileDescriptorProto) fileJSON {
	pkg := fd.GetPackage()
	f := fileJSON{Package: pkg, Messages: []messageJSON{}, Enums: []enumJSON{}, Services: []serviceJSON{}}
	prefix := pkg
	if prefix != "" {
		prefix += "."
	}
	for _, m := range fd.GetMessageType() {
		f.describeMessage(prefix, m)
	}
	for _, e := range fd.GetEnumType() {
		f.Enums = append(f.Enums, describeEnum(prefix, e))
	}
	for _, s := range fd.GetService() {
		svc := serviceJSON{Name: prefix + s.GetName(), Methods: []methodJSON{}}
		for _, m := range s.GetMethod() {
			svc.Methods = append(svc.Methods, methodJSON{
				Name:            m.GetName(),
				InputType:       m.GetInputType(),
				OutputType:      m.GetOutputType(),
				ClientStreaming: m.GetClientStreaming(),
				ServerStreaming: m.GetServerStreaming(),
			})
		}
		f.Services = append(f.Services, svc)
	}
	return f
}

// describeMessage appends m and, depth first, its nested messages and enums.
func (f *fileJSON) describeMessage(prefix string, m *descriptorpb.DescriptorProto) {
	name := prefix + m.GetName()
	msg := messageJSON{Name: name, MapEntry: m.GetOptions().GetMapEntry(), Fields: []fieldJSON{}}
	for _, fld := range m.GetField() {
		msg.Fields = append(msg.Fields, fieldJSON{
			Name:           fld.GetName(),
			Number:         fld.GetNumber(),
			Label:          fld.GetLabel().String(),
			Type:           fld.GetType().String(),
			TypeName:       fld.GetTypeName(),
			Proto3Optional: fld.GetProto3Optional(),
		})
	}
	f.Messages = append(f.Messages, msg)
	for _, nested := range m.GetNestedType() {
		f.describeMessage(name+".", nested)
	}
	for _, e := range m.GetEnumType() {
		f.Enums = append(f.Enums, describeEnum(name+".", e))
	}
}

func describeEnum(prefix string, e *descriptorpb.EnumDescriptorProto) enumJSON {
	en := enumJSON{Name: prefix + e.GetName(), Values: []enumValueJSON{}}
	for _, v := range e.GetValue() {
		en.Values = append(en.Values, enumValueJSON{Name: v.GetName(), Number: v.GetNumber()})
	}
	return en
}

// ---------------------------------------------------------------------------
// dracall mode

// The one claim dracall prepares and unprepares.
const (
	draClaimNamespace = "wc-ns"
	draClaimUID       = "wc-uid-1"
	draClaimName      = "wc-claim"
)

// draReport is dracall's JSON object: the responses as protojson with proto
// field names and zero values included.
type draReport struct {
	Version   string          `json:"version"`
	Prepare   json.RawMessage `json:"prepare"`
	Unprepare json.RawMessage `json:"unprepare"`
}

func dracallMain(args []string) int {
	fs := flag.NewFlagSet("wirecompat dracall", flag.ContinueOnError)
	sock := fs.String("socket", "", "the DRA plugin's service socket (required)")
	version := fs.String("version", "", "DRA plugin API version: v1 or v1beta1 (required)")
	timeout := fs.Duration("timeout", 10*time.Second, "deadline for both calls")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *sock == "" || (*version != "v1" && *version != "v1beta1") || fs.NArg() != 0 {
		fmt.Fprintln(os.Stderr, "wirecompat dracall: --socket and --version v1|v1beta1 are required, no positional arguments")
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	conn, err := dialUnix(*sock)
	if err != nil {
		fmt.Fprintln(os.Stderr, "wirecompat dracall:", err)
		return 1
	}
	defer conn.Close()

	var prepare, unprepare proto.Message
	if *version == "v1" {
		prepare, unprepare, err = draCallV1(ctx, drav1.NewDRAPluginClient(conn))
	} else {
		prepare, unprepare, err = draCallV1beta1(ctx, drav1beta1.NewDRAPluginClient(conn))
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "wirecompat dracall:", err)
		return 1
	}
	report := draReport{Version: *version}
	opts := protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true}
	if report.Prepare, err = opts.Marshal(prepare); err == nil {
		report.Unprepare, err = opts.Marshal(unprepare)
	}
	if err == nil {
		err = json.NewEncoder(os.Stdout).Encode(report)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "wirecompat dracall:", err)
		return 1
	}
	return 0
}

func draCallV1(ctx context.Context, client drav1.DRAPluginClient) (proto.Message, proto.Message, error) {
	claims := []*drav1.Claim{{Namespace: draClaimNamespace, Uid: draClaimUID, Name: draClaimName}}
	ready := grpc.WaitForReady(true)
	prep, err := client.NodePrepareResources(ctx, &drav1.NodePrepareResourcesRequest{Claims: claims}, ready)
	if err != nil {
		return nil, nil, fmt.Errorf("NodePrepareResources: %w", err)
	}
	unprep, err := client.NodeUnprepareResources(ctx, &drav1.NodeUnprepareResourcesRequest{Claims: claims}, ready)
	if err != nil {
		return nil, nil, fmt.Errorf("NodeUnprepareResources: %w", err)
	}
	return prep, unprep, nil
}

func draCallV1beta1(ctx context.Context, client drav1beta1.DRAPluginClient) (proto.Message, proto.Message, error) {
	claims := []*drav1beta1.Claim{{Namespace: draClaimNamespace, Uid: draClaimUID, Name: draClaimName}}
	ready := grpc.WaitForReady(true)
	prep, err := client.NodePrepareResources(ctx, &drav1beta1.NodePrepareResourcesRequest{Claims: claims}, ready)
	if err != nil {
		return nil, nil, fmt.Errorf("NodePrepareResources: %w", err)
	}
	unprep, err := client.NodeUnprepareResources(ctx, &drav1beta1.NodeUnprepareResourcesRequest{Claims: claims}, ready)
	if err != nil {
		return nil, nil, fmt.Errorf("NodeUnprepareResources: %w", err)
	}
	return prep, unprep, nil
}
