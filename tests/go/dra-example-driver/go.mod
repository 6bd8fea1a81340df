module fakelet.test/dra-example-driver

go 1.26.0

// The Go module proxy serves this module by exact version (.info/.mod/.zip
// answer 200) but refuses its version list (@v/list: 403) and @latest (404),
// so the version is pinned here; `go get ...@latest` cannot resolve it.
require sigs.k8s.io/dra-example-driver v0.4.0
