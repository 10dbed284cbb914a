// Package chartcheck holds the tests that render the Helm chart in
// deploy/helm/relay and check it, and the manifests in deploy/kubernetes,
// against the Kubernetes API types. It is its own Go module so that Helm's
// dependency tree stays out of the relay's.
package chartcheck
