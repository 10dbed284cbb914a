// Package chartcheck holds the tests of the deployment files: the Helm
// chart in deploy/helm/relay (helm lint, helm template with several values
// sets), the manifests in deploy/kubernetes, the Dockerfile and
// deploy/systemd/relay.service. Rendered and raw manifests are decoded
// strictly into the Kubernetes API types, and the relay's flags in every
// file are checked against `relay <command> -h` of a freshly built relay.
// It is its own Go module so that Helm's dependency tree stays out of the
// relay's; run it with (cd deploy/chartcheck && go test ./...).
package chartcheck
