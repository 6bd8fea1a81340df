// Wrapper module for building kind (sigs.k8s.io/kind) from the Go module proxy, for
// fakelet's kind tier (harness/kind) where no `kind` is on PATH.
module fakelet.test/kind

go 1.26.0

require sigs.k8s.io/kind v0.33.0
