package main

// podresources mode: a node agent reading the kubelet's PodResources API v1
// with upstream's generated client only. It calls List,
// GetAllocatableResources and Get for each --get pod on SOCKET, and prints
// one JSON object with the responses as protojson (proto field names, zero
// values included) and Get's errors as gRPC code and message, so that the
// caller can compare every decoded value with what it served.

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// podRefs collects repeated --get NAMESPACE/NAME flags in order.
type podRefs []podRef

type podRef struct{ namespace, name string }

func (r *podRefs) String() string {
	parts := make([]string, 0, len(*r))
	for _, p := range *r {
		parts = append(parts, p.namespace+"/"+p.name)
	}
	return strings.Join(parts, ",")
}

func (r *podRefs) Set(value string) error {
	ns, name, ok := strings.Cut(value, "/")
	if !ok {
		return fmt.Errorf("want NAMESPACE/NAME, got %q", value)
	}
	*r = append(*r, podRef{namespace: ns, name: name})
	return nil
}

type podResourcesReport struct {
	List        json.RawMessage `json:"list"`
	Allocatable json.RawMessage `json:"allocatable"`
	Get         []getJSON       `json:"get"`
}

type getJSON struct {
	PodNamespace string          `json:"pod_namespace"`
	PodName      string          `json:"pod_name"`
	Response     json.RawMessage `json:"response"` // null when the call failed
	Error        *statusJSON     `json:"error"`    // null when the call succeeded
}

// statusJSON is a gRPC status as grpc-go names it, e.g. {"code": "Unknown"}.
type statusJSON struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

func podResourcesMain(args []string) int {
	fs := flag.NewFlagSet("wirecompat podresources", flag.ContinueOnError)
	timeout := fs.Duration("timeout", 10*time.Second, "deadline for all calls")
	var gets podRefs
	fs.Var(&gets, "get", "NAMESPACE/NAME of a pod to Get (repeatable)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "wirecompat podresources: want exactly one SOCKET after the flags")
		return 2
	}
	report, err := readPodResources(fs.Arg(0), *timeout, gets)
	if err == nil {
		err = json.NewEncoder(os.Stdout).Encode(report)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "wirecompat podresources:", err)
		return 1
	}
	return 0
}

func readPodResources(sock string, timeout time.Duration, gets podRefs) (*podResourcesReport, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	conn, err := dialUnix(sock)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	client := podresourcesv1.NewPodResourcesListerClient(conn)
	// The server may still be starting; the deadline bounds the wait.
	ready := grpc.WaitForReady(true)
	opts := protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true}
	report := &podResourcesReport{Get: []getJSON{}}

	list, err := client.List(ctx, &podresourcesv1.ListPodResourcesRequest{}, ready)
	if err != nil {
		return nil, fmt.Errorf("List: %w", err)
	}
	if report.List, err = opts.Marshal(list); err != nil {
		return nil, err
	}
	alloc, err := client.GetAllocatableResources(ctx, &podresourcesv1.AllocatableResourcesRequest{}, ready)
	if err != nil {
		return nil, fmt.Errorf("GetAllocatableResources: %w", err)
	}
	if report.Allocatable, err = opts.Marshal(alloc); err != nil {
		return nil, err
	}
	for _, ref := range gets {
		got := getJSON{PodNamespace: ref.namespace, PodName: ref.name}
		resp, err := client.Get(ctx, &podresourcesv1.GetPodResourcesRequest{PodName: ref.name, PodNamespace: ref.namespace}, ready)
		if err != nil {
			st, ok := status.FromError(err)
			if !ok {
				return nil, fmt.Errorf("Get %s/%s: %w", ref.namespace, ref.name, err)
			}
			got.Error = &statusJSON{Code: st.Code().String(), Message: st.Message()}
		} else if got.Response, err = opts.Marshal(resp); err != nil {
			return nil, err
		}
		report.Get = append(report.Get, got)
	}
	return report, nil
}
