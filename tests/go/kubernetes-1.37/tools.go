//go:build tools

// The kubelet of release 1.37 for the real node at --kubelet-version 1.37 (harness/node/real):
// this module only pins versions; nothing here is compiled into fakelet.
package tools

import _ "k8s.io/kubernetes/cmd/kubelet"
