package chartcheck

import (
	"bytes"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	helmcmd "helm.sh/helm/v4/pkg/cmd"
)

var chartDir = filepath.Join(repoRoot, "deploy", "helm", "relay")

// helm runs the helm command line in this process, as the helm binary
// would, with its home directories in a temporary one.
func helm(t *testing.T, args ...string) (string, error) {
	t.Helper()
	home := t.TempDir()
	for _, v := range []string{"HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME"} {
		t.Setenv(v, filepath.Join(home, v))
	}
	t.Setenv("KUBECONFIG", filepath.Join(home, "kubeconfig"))
	var out bytes.Buffer
	cmd, err := helmcmd.NewRootCmd(&out, args, func(bool) {})
	if err != nil {
		return "", err
	}
	cmd.SetArgs(args)
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	err = cmd.Execute()
	return out.String(), err
}

// valueSets are the chart's ci/ values files: defaults, cdc with the
// Kafka sink, leader and standby, the listener behind TLS and SASL.
func valueSets(t *testing.T) []string {
	files, err := filepath.Glob(filepath.Join(chartDir, "ci", "*-values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range files {
		names = append(names, filepath.Base(f))
	}
	want := []string{"cdc-kafka-values.yaml", "default-values.yaml", "leader-standby-values.yaml", "tls-values.yaml"}
	if !slices.Equal(names, want) {
		t.Fatalf("chart ci/ holds %v, want %v", names, want)
	}
	return files
}

// TestChartLint: helm lint --strict passes with each values set.
func TestChartLint(t *testing.T) {
	for _, values := range valueSets(t) {
		out, err := helm(t, "lint", "--strict", chartDir, "-f", values)
		if err != nil || !strings.Contains(out, "0 chart(s) failed") {
			t.Errorf("helm lint -f %s: %v\n%s", filepath.Base(values), err, out)
		}
	}
}

// TestChartTemplate renders the chart with each values set, decodes every
// manifest strictly into its Kubernetes type and checks its semantics.
func TestChartTemplate(t *testing.T) {
	for _, values := range valueSets(t) {
		name := filepath.Base(values)
		out, err := helm(t, "template", "orders", chartDir, "--namespace", "shop", "-f", values)
		if err != nil {
			t.Fatalf("helm template -f %s: %v\n%s", name, err, out)
		}
		m := decodeAll(t, name, []byte(out))
		f := m.check(t, name)
		if f.runContainers != 1 {
			t.Fatalf("%s: %d relay run containers, want 1", name, f.runContainers)
		}
		args := strings.Join(f.args[0], " ")
		switch name {
		case "default-values.yaml":
			if f.embedded != 1 || !slices.Equal(f.readiness, []string{"/readyz"}) || !strings.Contains(args, "--kafka-advertised-addr=orders-relay.shop.svc.cluster.local:9092") {
				t.Errorf("%s: %+v", name, f)
			}
		case "cdc-kafka-values.yaml":
			for _, want := range []string{"--source=cdc", "--slot=relay_orders", "--sink=kafka", "--kafka-brokers=kafka-0.kafka:9093,kafka-1.kafka:9093", "--kafka-tls-ca-file=/etc/relay/kafka-tls/ca.crt", "--kafka-sasl-mechanism=SCRAM-SHA-512"} {
				if !strings.Contains(args, want) {
					t.Errorf("%s: args %s lack %s", name, args, want)
				}
			}
			if !strings.Contains(out, "name: RELAY_KAFKA_SASL_PASSWORD") {
				t.Errorf("%s: no RELAY_KAFKA_SASL_PASSWORD from a Secret", name)
			}
		case "leader-standby-values.yaml":
			if !strings.Contains(out, "kind: Deployment") || !strings.Contains(out, "replicas: 2") || !strings.Contains(out, "kind: PodDisruptionBudget") || !slices.Equal(f.readiness, []string{"/healthz"}) {
				t.Errorf("%s: want a Deployment of 2 with a PodDisruptionBudget, ready on /healthz: %+v", name, f)
			}
		case "tls-values.yaml":
			for _, want := range []string{"--kafka-addr=0.0.0.0:9093", "--kafka-advertised-addr=relay.example.com:9093", "--listener-tls-client-ca-file=/etc/relay/listener-tls/ca.crt", "--listener-users-file=/etc/relay/listener-users/users", "--listener-acl-file=/data/acls.json", "--retain=168h"} {
				if !strings.Contains(args, want) {
					t.Errorf("%s: args %s lack %s", name, args, want)
				}
			}
			if !strings.Contains(out, "storageClassName: fast-ssd") || !strings.Contains(out, "type: LoadBalancer") {
				t.Errorf("%s: persistence or Service type not rendered", name)
			}
		}
	}
}

// TestChartRefuses: values the relay cannot run with fail at render time
// with a message naming the value, and values.schema.json refuses wrong
// types and unknown keys.
func TestChartRefuses(t *testing.T) {
	for _, tc := range []struct {
		set  []string
		want string
	}{
		{nil, "database.existingSecret"},
		{[]string{"database.existingSecret=db", "replicaCount=2"}, "replicaCount > 1 needs sink.type=kafka"},
		{[]string{"database.existingSecret=db", "sink.type=kafka"}, "sink.kafka.brokers"},
		{[]string{"database.existingSecret=db", "listener.tls.enabled=true"}, "listener.tls.existingSecret"},
		{[]string{"database.existingSecret=db", "listener.sasl.enabled=true"}, "listener.sasl.usersSecret"},
		{[]string{"database.existingSecret=db", "sink.type=kafka", "sink.kafka.brokers={k:9092}", "sink.kafka.sasl.mechanism=PLAIN"}, "sink.kafka.sasl.existingSecret"},
		{[]string{"database.existingSecret=db", "source.type=wal"}, "source.type"},
		{[]string{"database.existingSecret=db", "listener.port=http"}, "listener.port"},
		{[]string{"database.existingSecret=db", "persistance.size=1Gi"}, "persistance"},
		{[]string{"database.existingSecret=db", "extraArgs={run}"}, "extraArgs"},
	} {
		args := []string{"template", "orders", chartDir}
		for _, s := range tc.set {
			args = append(args, "--set", s)
		}
		out, err := helm(t, args...)
		if err == nil {
			t.Errorf("helm template --set %v rendered:\n%s", tc.set, out)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("helm template --set %v: %v, want it to name %s", tc.set, err, tc.want)
		}
	}
}
