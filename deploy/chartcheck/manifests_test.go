package chartcheck

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestKubernetesManifests decodes every file of deploy/kubernetes strictly
// into the Kubernetes API types and checks what the relay depends on:
// probes on --http-addr's /healthz and /readyz, non-root with a read-only
// root filesystem, the data directory on a persistent volume, the database
// URL from a Secret, the advertised address on the listener's Service.
func TestKubernetesManifests(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(repoRoot, "deploy", "kubernetes", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"leader-standby.yaml", "migrate-job.yaml", "sidecar.yaml"}
	var got []string
	for _, f := range files {
		got = append(got, filepath.Base(f))
	}
	if !slices.Equal(got, want) {
		t.Fatalf("deploy/kubernetes holds %v, want %v (update this test and deploy/README.md together)", got, want)
	}
	all := map[string]facts{}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		name := filepath.Base(f)
		all[name] = decodeAll(t, name, data).check(t, name)
	}
	if f := all["sidecar.yaml"]; f.embedded != 1 || !slices.Equal(f.readiness, []string{"/readyz"}) {
		t.Errorf("sidecar.yaml: want one relay with the embedded broker, ready on /readyz; got %+v", f)
	}
	if f := all["leader-standby.yaml"]; f.kafkaSink != 1 || f.embedded != 0 || len(f.readiness) != 0 {
		t.Errorf("leader-standby.yaml: want one relay per pod publishing to Kafka, without a /readyz readiness probe; got %+v", f)
	}
}
