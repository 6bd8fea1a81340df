//go:build tools

// Package tools pins kind's main package, so that `go build sigs.k8s.io/kind` in this module
// uses the version in go.mod.
package tools

import _ "sigs.k8s.io/kind"
