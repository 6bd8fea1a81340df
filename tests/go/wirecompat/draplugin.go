package main

// draplugin and healthwatch modes: the DRA kubelet plugin API from both sides,
// with upstream's generated code only.
//
//	wirecompat draplugin --registry-dir DIR --socket PATH [--driver wirecompat.example.com]
//	    [--reg-socket DRIVER-reg.sock] [--endpoint PATH] [--versions LIST]
//	    [--health HEALTHY,UNHEALTHY] [--health-interval 0s] [--health-time 1700000000]
//	wirecompat healthwatch --socket PATH --version v1|v1alpha1 [--count 1] [--timeout 10s]
//
// draplugin serves the plugin registration API (pluginregistration v1) on
// DIR/REG-SOCKET and, on PATH, every service named in --versions that it
// knows: DRAPlugin v1 and v1beta1, DRAResourceHealth v1 and v1alpha1. Names it
// does not know are advertised in GetInfo but not served, so that a caller can
// test what the kubelet does with them. Results are derived from the request
// alone, so the caller can predict them exactly:
//
//   - NodePrepareResources: per claim one device, request_names ["wc-req"],
//     pool "wc-pool", device "wc-dev-<uid>", CDI IDs
//     ["wirecompat.example.com/dev=<uid>"], and in v1 share_id
//     "wc-share-<uid>". A claim whose name starts with "fail-" gets no
//     devices and the error "wirecompat: refused claim <uid>".
//   - NodeUnprepareResources: per claim an empty error, or for a "fail-"
//     claim "wirecompat: refused unprepare <uid>".
//   - NodeWatchResources: devices wc-pool/wc-dev-0 ... wc-dev-<n-1>, one per
//     --health entry, with that health, last_updated_time --health-time + i,
//     health_check_timeout_seconds 30 + i and message "wc-dev-<i> is <HEALTH>";
//     sent once, then again every --health-interval if that is positive; the
//     stream stays open until the caller cancels it or draplugin stops.
//
// Every received call is one JSON line on stdout:
// {"event":"call","service":"v1.DRAPlugin","method":"NodePrepareResources","request":{...}}
// with the request as protojson (proto field names, zero values included).
// The first line is {"event":"serving","registration":...,"endpoint":...} once
// both sockets accept connections. SIGTERM/SIGINT stop it with exit code 0.

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	drahealthv1 "k8s.io/kubelet/pkg/apis/dra-health/v1"
	drahealthv1alpha1 "k8s.io/kubelet/pkg/apis/dra-health/v1alpha1"
	drav1 "k8s.io/kubelet/pkg/apis/dra/v1"
	drav1beta1 "k8s.io/kubelet/pkg/apis/dra/v1beta1"
	registrationv1 "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// Fixed parts of draplugin's answers.
const (
	draDefaultDriver = "wirecompat.example.com"
	draPool          = "wc-pool"
	draRequestName   = "wc-req"
	draFailPrefix    = "fail-"
)

// draDefaultVersions advertises and serves every service draplugin knows.
var draDefaultVersions = strings.Join([]string{
	drav1.DRAPluginService, drav1beta1.DRAPluginService,
	drahealthv1.DRAResourceHealthService, drahealthv1alpha1.DRAResourceHealthService,
}, ",")

// draHealth is one NodeWatchResources device: its index and health.
type draHealth struct {
	index  int
	health drahealthv1.HealthStatus
}

type draPluginConfig struct {
	driver      string
	interval    time.Duration
	healthTime  int64
	devices     []draHealth
	events      *eventLog
	shutdown    <-chan struct{}
	endpoint    string
	versions    []string
	servedNames []string
}

func draPluginMain(args []string) int {
	fs := flag.NewFlagSet("wirecompat draplugin", flag.ContinueOnError)
	registryDir := fs.String("registry-dir", "", "plugin watcher directory for the registration socket (required)")
	sock := fs.String("socket", "", "path of the DRA service socket (required)")
	driver := fs.String("driver", draDefaultDriver, "driver name sent as PluginInfo.name")
	regSocket := fs.String("reg-socket", "", "registration socket file name in --registry-dir (default DRIVER-reg.sock)")
	endpoint := fs.String("endpoint", "", "PluginInfo.endpoint (default: the absolute --socket path)")
	versions := fs.String("versions", draDefaultVersions, "comma-separated PluginInfo.supported_versions; known services among them are served")
	health := fs.String("health", "HEALTHY,UNHEALTHY", "comma-separated health per NodeWatchResources device: HEALTHY, UNHEALTHY or UNKNOWN")
	interval := fs.Duration("health-interval", 0, "resend the device health list this often (0: send it once)")
	healthTime := fs.Int64("health-time", 1700000000, "last_updated_time of device 0 (device i gets this + i)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *registryDir == "" || *sock == "" || fs.NArg() != 0 {
		fmt.Fprintln(os.Stderr, "wirecompat draplugin: --registry-dir and --socket are required, no positional arguments")
		return 2
	}
	devices, err := parseHealth(*health)
	if err != nil {
		fmt.Fprintln(os.Stderr, "wirecompat draplugin:", err)
		return 2
	}
	if *regSocket == "" {
		*regSocket = *driver + "-reg.sock"
	}
	absSock, err := filepath.Abs(*sock)
	if err != nil {
		fmt.Fprintln(os.Stderr, "wirecompat draplugin:", err)
		return 1
	}
	if *endpoint == "" {
		*endpoint = absSock
	}
	var advertised []string
	if *versions != "" {
		advertised = strings.Split(*versions, ",")
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	cfg := &draPluginConfig{
		driver: *driver, interval: *interval, healthTime: *healthTime, devices: devices,
		events: &eventLog{w: os.Stdout}, shutdown: ctx.Done(), endpoint: *endpoint, versions: advertised,
	}

	// The service socket first: a kubelet dials it as soon as GetInfo has
	// answered, so it must already accept connections.
	svcLis, err := listenUnix(absSock)
	if err != nil {
		fmt.Fprintln(os.Stderr, "wirecompat draplugin:", err)
		return 1
	}
	svc := grpc.NewServer()
	cfg.servedNames = registerDRAServices(svc, cfg)
	regPath := filepath.Join(*registryDir, *regSocket)
	regLis, err := listenUnix(regPath)
	if err != nil {
		_ = svcLis.Close()
		fmt.Fprintln(os.Stderr, "wirecompat draplugin:", err)
		return 1
	}
	reg := grpc.NewServer()
	registrationv1.RegisterRegistrationServer(reg, &draRegistration{cfg: cfg})

	serveErr := make(chan error, 2)
	go func() { serveErr <- svc.Serve(svcLis) }()
	go func() { serveErr <- reg.Serve(regLis) }()
	defer func() {
		// Registration first, as a real plugin does: the kubelet deregisters
		// when the registration socket disappears.
		stopServer(reg)
		removeSocket(regPath)
		stopServer(svc)
		removeSocket(absSock)
	}()
	cfg.events.emitJSON(map[string]any{
		"event": "serving", "registration": regPath, "endpoint": absSock, "services": cfg.servedNames,
	})

	select {
	case <-ctx.Done():
		return 0
	case err := <-serveErr:
		fmt.Fprintln(os.Stderr, "wirecompat draplugin: serve:", err)
		return 1
	}
}

func parseHealth(list string) ([]draHealth, error) {
	var out []draHealth
	if list == "" {
		return out, nil
	}
	for i, name := range strings.Split(list, ",") {
		value, ok := drahealthv1.HealthStatus_value[name]
		if !ok {
			return nil, fmt.Errorf("--health: unknown health %q (want HEALTHY, UNHEALTHY or UNKNOWN)", name)
		}
		out = append(out, draHealth{index: i, health: drahealthv1.HealthStatus(value)})
	}
	return out, nil
}

// registerDRAServices registers the known services among the advertised ones
// and returns their names in the order registered.
func registerDRAServices(srv *grpc.Server, cfg *draPluginConfig) []string {
	served := []string{}
	add := func(name string, register func()) {
		if slices.Contains(cfg.versions, name) {
			register()
			served = append(served, name)
		}
	}
	add(drav1.DRAPluginService, func() { drav1.RegisterDRAPluginServer(srv, &draV1{cfg: cfg}) })
	add(drav1beta1.DRAPluginService, func() { drav1beta1.RegisterDRAPluginServer(srv, &draV1beta1{cfg: cfg}) })
	add(drahealthv1.DRAResourceHealthService, func() { drahealthv1.RegisterDRAResourceHealthServer(srv, &healthV1{cfg: cfg}) })
	add(drahealthv1alpha1.DRAResourceHealthService, func() {
		drahealthv1alpha1.RegisterDRAResourceHealthServer(srv, &healthV1alpha1{cfg: cfg})
	})
	return served
}

// emitJSON writes any JSON-encodable value as one line, like eventLog.emit.
func (l *eventLog) emitJSON(v any) {
	line, err := json.Marshal(v)
	if err != nil {
		l.emit(event{Event: "log_error", Error: err.Error()})
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	_, _ = l.w.Write(append(line, '\n'))
}

// call logs one received request of an advertised service.
func (c *draPluginConfig) call(service, method string, req proto.Message) {
	raw, err := protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true}.Marshal(req)
	if err != nil {
		c.events.emit(event{Event: "call", Service: service, Method: method, Error: err.Error()})
		return
	}
	c.events.emit(event{Event: "call", Service: service, Method: method, Request: raw})
}

// ---------------------------------------------------------------------------
// registration

type draRegistration struct {
	registrationv1.UnimplementedRegistrationServer
	cfg *draPluginConfig
}

const registrationService = "pluginregistration.Registration"

func (r *draRegistration) GetInfo(_ context.Context, req *registrationv1.InfoRequest) (*registrationv1.PluginInfo, error) {
	r.cfg.call(registrationService, "GetInfo", req)
	return &registrationv1.PluginInfo{
		Type:              registrationv1.DRAPlugin,
		Name:              r.cfg.driver,
		Endpoint:          r.cfg.endpoint,
		SupportedVersions: append([]string{}, r.cfg.versions...),
	}, nil
}

func (r *draRegistration) NotifyRegistrationStatus(_ context.Context, req *registrationv1.RegistrationStatus) (*registrationv1.RegistrationStatusResponse, error) {
	r.cfg.call(registrationService, "NotifyRegistrationStatus", req)
	return &registrationv1.RegistrationStatusResponse{}, nil
}

// ---------------------------------------------------------------------------
// DRAPlugin v1 and v1beta1

func refused(name string) bool { return strings.HasPrefix(name, draFailPrefix) }

func draDeviceName(uid string) string { return "wc-dev-" + uid }
func draCDIID(uid string) string      { return "wirecompat.example.com/dev=" + uid }

type draV1 struct {
	drav1.UnimplementedDRAPluginServer
	cfg *draPluginConfig
}

func (p *draV1) NodePrepareResources(_ context.Context, req *drav1.NodePrepareResourcesRequest) (*drav1.NodePrepareResourcesResponse, error) {
	p.cfg.call(drav1.DRAPluginService, "NodePrepareResources", req)
	resp := &drav1.NodePrepareResourcesResponse{Claims: map[string]*drav1.NodePrepareResourceResponse{}}
	for _, c := range req.GetClaims() {
		uid := c.GetUid()
		if refused(c.GetName()) {
			resp.Claims[uid] = &drav1.NodePrepareResourceResponse{Error: "wirecompat: refused claim " + uid}
			continue
		}
		resp.Claims[uid] = &drav1.NodePrepareResourceResponse{Devices: []*drav1.Device{{
			RequestNames: []string{draRequestName},
			PoolName:     draPool,
			DeviceName:   draDeviceName(uid),
			CdiDeviceIds: []string{draCDIID(uid)},
			ShareId:      proto.String("wc-share-" + uid),
		}}}
	}
	return resp, nil
}

func (p *draV1) NodeUnprepareResources(_ context.Context, req *drav1.NodeUnprepareResourcesRequest) (*drav1.NodeUnprepareResourcesResponse, error) {
	p.cfg.call(drav1.DRAPluginService, "NodeUnprepareResources", req)
	resp := &drav1.NodeUnprepareResourcesResponse{Claims: map[string]*drav1.NodeUnprepareResourceResponse{}}
	for _, c := range req.GetClaims() {
		r := &drav1.NodeUnprepareResourceResponse{}
		if refused(c.GetName()) {
			r.Error = "wirecompat: refused unprepare " + c.GetUid()
		}
		resp.Claims[c.GetUid()] = r
	}
	return resp, nil
}

type draV1beta1 struct {
	drav1beta1.UnimplementedDRAPluginServer
	cfg *draPluginConfig
}

func (p *draV1beta1) NodePrepareResources(_ context.Context, req *drav1beta1.NodePrepareResourcesRequest) (*drav1beta1.NodePrepareResourcesResponse, error) {
	p.cfg.call(drav1beta1.DRAPluginService, "NodePrepareResources", req)
	resp := &drav1beta1.NodePrepareResourcesResponse{Claims: map[string]*drav1beta1.NodePrepareResourceResponse{}}
	for _, c := range req.GetClaims() {
		uid := c.GetUid()
		if refused(c.GetName()) {
			resp.Claims[uid] = &drav1beta1.NodePrepareResourceResponse{Error: "wirecompat: refused claim " + uid}
			continue
		}
		resp.Claims[uid] = &drav1beta1.NodePrepareResourceResponse{Devices: []*drav1beta1.Device{{
			RequestNames: []string{draRequestName},
			PoolName:     draPool,
			DeviceName:   draDeviceName(uid),
			CdiDeviceIds: []string{draCDIID(uid)},
		}}}
	}
	return resp, nil
}

func (p *draV1beta1) NodeUnprepareResources(_ context.Context, req *drav1beta1.NodeUnprepareResourcesRequest) (*drav1beta1.NodeUnprepareResourcesResponse, error) {
	p.cfg.call(drav1beta1.DRAPluginService, "NodeUnprepareResources", req)
	resp := &drav1beta1.NodeUnprepareResourcesResponse{Claims: map[string]*drav1beta1.NodeUnprepareResourceResponse{}}
	for _, c := range req.GetClaims() {
		r := &drav1beta1.NodeUnprepareResourceResponse{}
		if refused(c.GetName()) {
			r.Error = "wirecompat: refused unprepare " + c.GetUid()
		}
		resp.Claims[c.GetUid()] = r
	}
	return resp, nil
}

// ---------------------------------------------------------------------------
// DRAResourceHealth v1 and v1alpha1

func (c *draPluginConfig) healthV1() *drahealthv1.NodeWatchResourcesResponse {
	resp := &drahealthv1.NodeWatchResourcesResponse{}
	for _, d := range c.devices {
		resp.Devices = append(resp.Devices, &drahealthv1.DeviceHealth{
			Device:                    &drahealthv1.DeviceIdentifier{PoolName: draPool, DeviceName: fmt.Sprintf("wc-dev-%d", d.index)},
			Health:                    d.health,
			LastUpdatedTime:           c.healthTime + int64(d.index),
			HealthCheckTimeoutSeconds: 30 + int64(d.index),
			Message:                   fmt.Sprintf("wc-dev-%d is %s", d.index, d.health),
		})
	}
	return resp
}

// healthV1alpha1 builds the same list with v1alpha1's own generated types.
func (c *draPluginConfig) healthV1alpha1() *drahealthv1alpha1.NodeWatchResourcesResponse {
	resp := &drahealthv1alpha1.NodeWatchResourcesResponse{}
	for _, d := range c.devices {
		health := drahealthv1alpha1.HealthStatus(drahealthv1alpha1.HealthStatus_value[d.health.String()])
		resp.Devices = append(resp.Devices, &drahealthv1alpha1.DeviceHealth{
			Device:                    &drahealthv1alpha1.DeviceIdentifier{PoolName: draPool, DeviceName: fmt.Sprintf("wc-dev-%d", d.index)},
			Health:                    health,
			LastUpdatedTime:           c.healthTime + int64(d.index),
			HealthCheckTimeoutSeconds: 30 + int64(d.index),
			Message:                   fmt.Sprintf("wc-dev-%d is %s", d.index, health),
		})
	}
	return resp
}

// streamHealth sends msg, then again every interval, until the stream's
// context ends or draplugin stops.
func streamHealth[T any](ctx context.Context, cfg *draPluginConfig, send func(*T) error, build func() *T) error {
	if err := send(build()); err != nil {
		return err
	}
	var tick <-chan time.Time
	if cfg.interval > 0 {
		ticker := time.NewTicker(cfg.interval)
		defer ticker.Stop()
		tick = ticker.C
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-cfg.shutdown:
			return nil
		case <-tick:
			if err := send(build()); err != nil {
				return err
			}
		}
	}
}

type healthV1 struct {
	drahealthv1.UnimplementedDRAResourceHealthServer
	cfg *draPluginConfig
}

func (h *healthV1) NodeWatchResources(req *drahealthv1.NodeWatchResourcesRequest, stream drahealthv1.DRAResourceHealth_NodeWatchResourcesServer) error {
	h.cfg.call(drahealthv1.DRAResourceHealthService, "NodeWatchResources", req)
	return streamHealth(stream.Context(), h.cfg, stream.Send, h.cfg.healthV1)
}

type healthV1alpha1 struct {
	drahealthv1alpha1.UnimplementedDRAResourceHealthServer
	cfg *draPluginConfig
}

func (h *healthV1alpha1) NodeWatchResources(req *drahealthv1alpha1.NodeWatchResourcesRequest, stream drahealthv1alpha1.DRAResourceHealth_NodeWatchResourcesServer) error {
	h.cfg.call(drahealthv1alpha1.DRAResourceHealthService, "NodeWatchResources", req)
	return streamHealth(stream.Context(), h.cfg, stream.Send, h.cfg.healthV1alpha1)
}

// ---------------------------------------------------------------------------
// healthwatch mode

// healthReport is healthwatch's JSON object. Messages are protojson with
// proto field names and zero values included (int64 values are strings, as
// protojson writes them). Stopped says why reading ended: "count" (the only
// successful outcome), "deadline", "eof" (the plugin ended the stream) or
// "error" (with Error holding the gRPC status).
type healthReport struct {
	Version  string            `json:"version"`
	Messages []json.RawMessage `json:"messages"`
	Stopped  string            `json:"stopped"`
	Error    string            `json:"error,omitempty"`
}

func healthwatchMain(args []string) int {
	fs := flag.NewFlagSet("wirecompat healthwatch", flag.ContinueOnError)
	sock := fs.String("socket", "", "the DRA plugin's service socket (required)")
	version := fs.String("version", "", "DRAResourceHealth version: v1 or v1alpha1 (required)")
	count := fs.Int("count", 1, "number of messages to read")
	timeout := fs.Duration("timeout", 10*time.Second, "deadline for opening the stream and reading --count messages")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *sock == "" || (*version != "v1" && *version != "v1alpha1") || *count < 1 || fs.NArg() != 0 {
		fmt.Fprintln(os.Stderr, "wirecompat healthwatch: --socket and --version v1|v1alpha1 are required, --count >= 1, no positional arguments")
		return 2
	}
	sigCtx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(sigCtx, *timeout)
	defer cancel()
	conn, err := dialUnix(*sock)
	if err != nil {
		fmt.Fprintln(os.Stderr, "wirecompat healthwatch:", err)
		return 1
	}
	defer conn.Close()

	var recv func() (proto.Message, error)
	ready := grpc.WaitForReady(true)
	if *version == "v1" {
		var stream drahealthv1.DRAResourceHealth_NodeWatchResourcesClient
		stream, err = drahealthv1.NewDRAResourceHealthClient(conn).NodeWatchResources(ctx, &drahealthv1.NodeWatchResourcesRequest{}, ready)
		recv = func() (proto.Message, error) { return stream.Recv() }
	} else {
		var stream drahealthv1alpha1.DRAResourceHealth_NodeWatchResourcesClient
		stream, err = drahealthv1alpha1.NewDRAResourceHealthClient(conn).NodeWatchResources(ctx, &drahealthv1alpha1.NodeWatchResourcesRequest{}, ready)
		recv = func() (proto.Message, error) { return stream.Recv() }
	}
	report := healthReport{Version: *version, Messages: []json.RawMessage{}}
	opts := protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true}
	for err == nil && len(report.Messages) < *count {
		var msg proto.Message
		if msg, err = recv(); err == nil {
			var raw []byte
			if raw, err = opts.Marshal(msg); err == nil {
				report.Messages = append(report.Messages, raw)
			}
		}
	}
	switch {
	case err == nil:
		report.Stopped = "count"
	case errors.Is(err, io.EOF):
		report.Stopped = "eof"
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		report.Stopped = "deadline"
	default:
		report.Stopped = "error"
		st := status.Convert(err)
		report.Error = st.Code().String() + ": " + st.Message()
	}
	if err := json.NewEncoder(os.Stdout).Encode(report); err != nil {
		fmt.Fprintln(os.Stderr, "wirecompat healthwatch:", err)
		return 1
	}
	if report.Stopped != "count" {
		fmt.Fprintf(os.Stderr, "wirecompat healthwatch: read %d of %d messages: stopped by %s %s\n",
			len(report.Messages), *count, report.Stopped, report.Error)
		return 3
	}
	return 0
}
