// Wrapper module for building squat/generic-device-plugin from the Go module
// proxy. The plugin has no semver tag, so the subject profile asks for
// `go get ...@latest` (in a scratch copy); where the proxy does not serve it,
// the subject's checks skip and say so.
module fakelet.test/generic-device-plugin

go 1.26.0
