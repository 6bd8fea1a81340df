// Wrapper module for fakelet's Go reference device plugin on NVIDIA's go-nvml (cgo), built
// from the Go module proxy: the proof that fakelet's fake NVML library serves the library
// real NVML plugins are built on.
module fakelet.test/nvmlplugin

go 1.26.0

require (
	github.com/NVIDIA/go-nvml v0.13.4-1
	google.golang.org/grpc v1.82.1
	k8s.io/kubelet v0.37.2
)

require (
	golang.org/x/net v0.57.0 // indirect
	golang.org/x/sys v0.47.0 // indirect
	golang.org/x/text v0.40.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20260526163538-3dc84a4a5aaa // indirect
	google.golang.org/protobuf v1.36.12-0.20260120151049-f2248ac996af // indirect
)
